"""``selfcheck`` against the sglang wheels in the local cache, and its machinery on small
wheels of our own (no sglang code in the repository)."""
from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest

from inkling_lab import selfcheck as sc
from inkling_lab.catalog import RELEASES
from inkling_lab.cli import main
from inkling_lab.releases import TABLE

SINK = "sglang/srt/models/inkling_common/lora.py"


def _wheel(path: Path, version: str, files: dict[str, str], tamper: str | None = None) -> Path:
    """A wheel of ``files`` with a METADATA and a RECORD (``tamper``: that file's bytes
    change after RECORD was written)."""
    files = {**files, f"sglang-{version}.dist-info/METADATA": f"Name: sglang\nVersion: {version}\n"}
    lines = []
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            data = text.encode()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            z.writestr(name, data + (b"# changed\n" if name == tamper else b""))
            lines.append(f"{name},sha256={digest},{len(data)}")
        z.writestr(f"sglang-{version}.dist-info/RECORD", "\n".join(lines) + "\n")
    return path


# A first wrapper of our own that refuses every backend with words no release writes.
_REFUSING = '''
from sglang.srt.models.inkling_common.dense_mlp import InklingBatchDenseMLP


class InklingBatchDenseMLPWithLoRA(InklingBatchDenseMLP):
    def initialize_lora(self, lora_backend):
        raise ValueError("no backend will do")
'''


def test_a_wrapper_that_ends_otherwise_disagrees_with_its_first_case_named(tmp_path, capsys):
    wheel = _wheel(tmp_path / "sglang-0.5.99-py3-none-any.whl", "0.5.99", {SINK: _REFUSING})
    report = sc.selfcheck(wheel, cases=5)
    v1 = {a.area: a for a in report.areas}["v1"]
    assert v1.status == "disagree" and v1.cases == 1
    assert "initialize_lora" in v1.first and "no backend will do" in v1.first
    slicing = {a.area: a for a in report.areas}["slicing"]  # the class has no slicing methods
    assert slicing.status == "disagree" and "AttributeError" in slicing.first
    assert report.exit_status == 1
    assert not report.known and set(report.differs) >= {"srt/models/inkling_common/lora.py", "srt/lora/lora.py"}
    assert main(["selfcheck", "--wheel", str(wheel), "--cases", "3"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("sglang 0.5.99 (")
    assert "NOT in the release table" in out and "v1             disagree" in out


def test_a_file_that_does_not_match_record_is_refused(tmp_path):
    wheel = _wheel(tmp_path / "w.whl", "0.5.23", {SINK: _REFUSING}, tamper=SINK)
    with pytest.raises(RuntimeError, match="lora.py does not match the wheel's RECORD"):
        sc.selfcheck(wheel, cases=1)
    assert main(["selfcheck", "--wheel", str(wheel)]) == 1


def test_a_wheel_without_the_shared_sink_says_so(tmp_path):
    wheel = _wheel(tmp_path / "w.whl", "0.5.15", {"sglang/__init__.py": ""})
    report = sc.selfcheck(wheel, cases=1)
    assert {a.status for a in report.areas} == {"missing"} and report.exit_status == 1
    assert "has no sglang/srt/models/inkling_common/lora.py" in report.areas[0].note


def test_extract_binds_sglang_imports_and_tells_its_own_raises(tmp_path):
    source = (b"from sglang.srt.lora.backend.base_backend import BaseLoRABackend\n"
              b"from sglang.srt.nothing import helper\nimport re\nLIMIT = 3\n\n"
              b"def check(x):\n    if x > LIMIT:\n        raise ValueError('too big')\n    return [1][x]\n")
    code = sc.extract(source, "<w>/f.py", ("check", "missing"))
    assert set(code.names) == {"check"}
    own = sc._outcome(lambda: code.names["check"](4), code)[1]
    indexing = sc._outcome(lambda: code.names["check"](2), code)[1]
    assert own[:2] == (ValueError, "too big") and indexing[:2] == (IndexError, None)


def test_the_cache_is_the_documented_one(monkeypatch, tmp_path):
    monkeypatch.setenv("INKLING_LAB_WHEELS", str(tmp_path))
    assert sc.wheel_cache() == tmp_path
    monkeypatch.delenv("INKLING_LAB_WHEELS")
    assert sc.wheel_cache() == Path.home() / ".cache" / "inkling-lab" / "wheels"


@pytest.mark.parametrize("version", RELEASES)
def test_every_cached_release_agrees_and_is_the_table_s(version):
    wheel = sc.cached_wheel(version)
    if wheel is None:
        pytest.skip(f"no sglang {version} wheel in {sc.wheel_cache()} ($INKLING_LAB_WHEELS; "
                    f"inkling-lab selfcheck --download {version} fetches it once)")
    report = sc.selfcheck(wheel, cases=60)
    assert report.known and report.version == version, report
    assert report.agrees, report
    areas = {a.area: a for a in report.areas}
    assert areas["v2"].status == ("agree" if TABLE[version].has("v2") else "absent")


def test_a_wrong_kit_is_caught_by_a_cached_wheel(monkeypatch):
    wheel = next((w for v in reversed(RELEASES) if (w := sc.cached_wheel(v))), None)
    if wheel is None:
        pytest.skip(f"no sglang wheel in {sc.wheel_cache()} ($INKLING_LAB_WHEELS)")
    monkeypatch.setattr(sc, "slice_lora_b", lambda w, *a, **k: w)  # "forgets" to slice
    monkeypatch.setattr(sc, "server_target_modules", lambda t: {"all"} if isinstance(t, str) else set(t))
    report = {a.area: a for a in sc.selfcheck(wheel, cases=100).areas}
    assert report["slicing"].status == "disagree" and "slice_moe_lora_b_weights" in report["slicing"].first
    assert report["targets"].status == "disagree" and report["v1"].status == "agree"


def test_a_kit_that_serves_skipped_weights_is_caught_by_a_cached_wheel(monkeypatch):
    """The kit's old reading (skipped weights served without, no error) and a kit blind to
    0.5.23's indexed shared-expert refusal both disagree with the wheel's buffer load."""
    wheel = next((w for v in reversed(RELEASES) if (w := sc.cached_wheel(v))), None)
    if wheel is None:
        pytest.skip(f"no sglang wheel in {sc.wheel_cache()} ($INKLING_LAB_WHEELS)")
    from inkling_lab.sglang_path import NameCheck, check_buffer_names

    monkeypatch.setattr(sc, "check_buffer_names", lambda *args, **kwargs: NameCheck())
    loading = {a.area: a for a in sc.selfcheck(wheel, cases=100).areas}["loading"]
    assert loading.status == "disagree" and "the wheel ValueError: Cannot find target module name" in loading.first
    if sc._version_of(wheel) == "0.5.23":
        monkeypatch.setattr(sc, "check_buffer_names", lambda *a, **k: check_buffer_names(*a[:4], sglang="0.5.22"))
        loading = {a.area: a for a in sc.selfcheck(wheel, cases=200).areas}["loading"]
        assert loading.status == "disagree" and "has no matching target for indexed shared-expert" in loading.first


@pytest.mark.parametrize("version", RELEASES)
def test_an_export_s_names_all_match_its_targets_in_the_wheel(version, tmp_path):
    """What ``inkling-lab export`` writes, normalized by the wheel's own ``LoRAAdapter`` and
    looked up by its own ``get_target_module_name`` against its own normalization of the
    export's ``target_modules``: no name is missing (no skip warning, no buffer-load error)."""
    import json
    from types import SimpleNamespace

    import torch
    from safetensors.torch import load_file

    from inkling_lab.export import export_for_sglang
    from inkling_lab.sglang_path import layer_id
    from inkling_lab.upstream_wheel import read_checked

    wheel = sc.cached_wheel(version)
    if wheel is None:
        pytest.skip(f"no sglang {version} wheel in {sc.wheel_cache()} ($INKLING_LAB_WHEELS)")
    files = read_checked(wheel, [sc.UTILS_FILE, sc.ADAPTER_FILE])
    utils = sc.extract(files[sc.UTILS_FILE], "<u>", ("get_normalized_target_modules", "get_target_module_name")).names
    adapter_cls = sc.extract(files[sc.ADAPTER_FILE], "<a>", ("LoRAAdapter",)).names["LoRAAdapter"]
    samples = Path(__file__).resolve().parents[1] / "data" / "adapters"
    for name in ("gate_up", "per_expert", "up_only", "w_names", "mixed_outer"):
        out = tmp_path / name
        assert export_for_sglang(samples / name, out, 2).written
        by_layer: dict = {}
        for k, t in load_file(out / "adapter_model.safetensors").items():
            by_layer.setdefault(layer_id(k), {})[k] = t
        up = adapter_cls.__new__(adapter_cls)
        torch.nn.Module.__init__(up)
        layers = [SimpleNamespace(weights=by_layer.get(i, {})) for i in range(max(by_layer) + 1)]
        for attr, value in (("base_hf_config", SimpleNamespace(architectures=["InklingForCausalLM"],
                                                                 model_type="inkling", n_shared_experts=2)),
                            ("layers", layers), ("_moe_is_gated_by_layer", {})):
            object.__setattr__(up, attr, value)
        up._normalize_weights()
        targets = utils["get_normalized_target_modules"](json.loads((out / "adapter_config.json").read_text())
                                                         ["target_modules"])
        assert {"gate_up_proj", "down_proj"} <= targets  # the sink is wrapped
        for layer in layers:
            for key in layer.weights:
                utils["get_target_module_name"](key, targets)  # raises for a name that matches none
