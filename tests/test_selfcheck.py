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
