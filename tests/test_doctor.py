"""The doctor and compare: each sample's documented verdicts, exit status and --json
fields; the PEFT math against PEFT itself; repairs that guess only with --repair."""
import builtins
import json
import math
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inkling_lab.adapters import NAMINGS, Adapter, load_adapter, save_adapter, synthetic_adapter
from inkling_lab.cli import main
from inkling_lab.compare import compare, compare_figure_data
from inkling_lab.peft_reference import kit_reading
from inkling_lab.doctor import SglangLoad, doctor
from inkling_lab.sglang_path import server_target_modules

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "adapters"
MANIFEST = json.loads((SAMPLES / "MANIFEST.json").read_text())
TOY = ["-n", "2", "--hidden", "8", "--intermediate", "6"]


@pytest.mark.parametrize("sample", MANIFEST, ids=lambda m: m["name"])
def test_raise_for_sglang_raises_verdict_one_as_the_type_it_names(sample):
    """The doctor never raises; ``raise_for_sglang`` raises what sglang raises loading
    the folder: the builtin type its text names (else RuntimeError), the text after it."""
    report = doctor(SAMPLES / sample["name"], 2, 8, 6, measure=False)
    if sample["name"] == "gate_up":  # a missing config key: KeyError's text is the key's repr
        report.load = SglangLoad("raises", "KeyError: 'r'", "read")
    if report.load.outcome != "raises":
        assert report.raise_for_sglang() is None
        return
    name, _, text = report.load.text.partition(": ")
    with pytest.raises(Exception) as caught:
        report.raise_for_sglang()
    builtin = getattr(builtins, name, None)
    if isinstance(builtin, type) and issubclass(builtin, Exception):
        assert type(caught.value) is builtin and str(caught.value) == text
    else:
        assert type(caught.value) is RuntimeError and str(caught.value) == report.load.text


@pytest.mark.parametrize("sample", MANIFEST, ids=lambda m: m["name"])
def test_each_sample_gets_its_documented_verdicts_exit_status_and_json(sample, capsys):
    want = sample["verdict"]
    code = main(["doctor", str(SAMPLES / sample["name"]), *TOY, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == want["exit_status"] == report["exit_status"]
    got = (report["sglang"]["load"]["outcome"], report["sglang"]["computes"]["outcome"], report["kit"]["outcome"])
    assert got == (want["load"], want["computes"], want["kit"])
    assert sample["code"] is None or sample["code"] in [f["code"] for f in report["findings"]]
    load = report["sglang"]["load"]
    if load["outcome"] == "raises":  # the exact text, the stage and the upstream function
        assert load["text"] and load["stage"] in ("read", "normalize", "targets", "pool") and ".py: " in load["upstream"]
        assert report["stages"][-1]["stage"] == load["stage"] and report["stages"][-1]["error"] == load["text"]
    if load["outcome"] == "skips":
        assert "weight(s) skipped because they did not match any target module in" in load["text"]
    if report["kit"]["outcome"] == "refuses":
        assert report["kit"]["text"] and report["error_code"]
    assert report["server"]["from"].startswith("the adapter's own target_modules")


@pytest.mark.parametrize("sample", MANIFEST, ids=lambda m: m["name"])
def test_compare_works_on_every_sample_and_the_kit_writes_peft_math(sample):
    report = compare([SAMPLES / sample["name"]], 2, 8, 6)
    assert str(report) and json.dumps(report.to_dict())
    kit = [r for r in report.rows if r.got == "kit"]
    assert all(r.close for r in kit), [str(r) for r in kit if not r.close]
    if sample["verdict"]["kit"] == "writes" and report.status["peft"] == ["computed"]:
        assert kit, "the kit's pool was not compared"
    sglang = [r for r in report.rows if r.got == "sglang"]
    if sample["verdict"]["computes"] == "adapter" and sglang:
        assert all(r.close for r in sglang)
    if sample["verdict"]["computes"] in ("different", "base") and sglang and sample["name"] != "modules_to_save":
        # (modules_to_save: what differs is outside the sink; the sink's own delta is served right)
        assert not all(r.close for r in sglang) and all(r.cause for r in sglang if not r.close)


def test_rslora_says_how_much_too_weak_and_the_fix_is_the_same_math():
    report = doctor(SAMPLES / "rslora", 2, 8, 6)
    (w101,) = [f for f in report.findings if f.code == "ISL-W101"]
    assert "sqrt(r) = 2 times too weak" in w101.message and '"lora_alpha": 16' in w101.fix
    assert report.computes.relative_error is not None and report.computes.relative_error > 0.1
    fixed = json.loads((SAMPLES / "rslora" / "adapter_config.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "fixed"
        shutil.copytree(SAMPLES / "rslora", folder)
        (folder / "adapter_config.json").write_text(json.dumps({**fixed, "lora_alpha": 16, "use_rslora": False}))
        assert doctor(folder, 2, 8, 6).exit_status == 0
        for module in load_adapter(folder).modules:  # the fix is PEFT's math exactly
            before, after = (kit_reading(load_adapter(f), module, 2) for f in (SAMPLES / "rslora", folder))
            assert all(torch.allclose(a, b) for a, b in zip(before, after))


def test_alpha_and_rank_patterns_honoured_by_the_kit_and_named_for_sglang():
    report = doctor(SAMPLES / "alpha_pattern", 2, 8, 6)
    (w102,) = [f for f in report.findings if f.code == "ISL-W102"]
    assert "down_proj: alpha 32, served 4 times too weak" in w102.message
    report = doctor(SAMPLES / "rank_pattern", 2, 8, 6)
    # q_proj/v_proj: Inkling's model has no qkv_proj buffer, the server does not start (ISL-E038)
    assert report.load.text == "NotImplementedError: get_hidden_dim not implemented for qkv_proj"
    (w112,) = [f for f in report.findings if f.code == "ISL-W112"]
    assert "fix r" not in w112.fix and "never" not in w112.fix and "zero-pad" in w112.fix
    assert report.kit.outcome == "writes" and report.pool.lora_ranks == [8]


def test_shapes_are_reported_as_saved_and_every_wrong_rank_factor_is_named():
    report = doctor(SAMPLES / "up_rank16", 2, 8, 6)
    text = report.kit.text  # both, as saved: the first as the error, the other as its "also:" note
    assert "up_proj.lora_A.weight' has shape [16, 8]" in text and "up_proj.lora_B.weight' has shape [12, 16]" in text
    assert "\n    also: tensor" in text
    assert "[8, 16]" not in str(report)
    rows = next(iter(report.journey.values()))
    assert ("up_proj.lora_A", [16, 8]) in rows[0]["peft"]
    transposed = doctor(SAMPLES / "transposed", 2, 8, 6)
    assert ("down_proj.lora_A", [12, 4]) in next(iter(transposed.journey.values()))[2]["peft"]  # as saved


def test_one_verdict_for_a_transposed_down_b():
    report = doctor(SAMPLES / "transposed_down_b", 2, 8, 6)
    assert report.load.text == ("AssertionError: LoRA buffer shape torch.Size([8, 4]) does not match weight shape "
                                "torch.Size([4, 8]).")
    assert report.computes.outcome == "nothing" and report.kit.outcome == "writes" and report.exit_status == 1
    assert not any("or a wrong delta" in f.consequence for f in report.findings)


def test_guesses_need_repair_and_say_what_was_assumed(capsys):
    for name, code, assumed in [("folded_down_a", "ISL-K309", "assumed: expert e holds rows"),
                                ("wrong_r", "ISL-K310", "assumed r=4")]:
        plain = doctor(SAMPLES / name, 2, 8, 6)
        assert plain.kit.outcome == "refuses" and plain.kit.code == code
        repaired = doctor(SAMPLES / name, 2, 8, 6, repair=True)
        assert repaired.kit.outcome == "writes" and any(code in r and assumed in r for r in repaired.kit.repairs)
        assert repaired.load == plain.load  # sglang's verdict does not depend on the kit's repairs
        assert main(["doctor", str(SAMPLES / name), *TOY, "--repair"]) == 1
        assert f"[{code}]" in capsys.readouterr().out
    folded = doctor(SAMPLES / "folded_down_a", 2, 8, 6)
    assert "folded into its rows" in folded.kit.text and ".reshape(2, 4, 6).permute(1, 0, 2).reshape(4, 12)" in folded.kit.text


def test_server_target_modules_decide_whether_the_sink_is_wrapped(capsys):
    assert server_target_modules(["gate_proj", "up_proj", "down_proj"]) == {"gate_up_proj", "down_proj"}
    assert server_target_modules(["w1", "w3", "w2"]) == {"w1", "w3", "w2"}  # not renamed upstream
    assert server_target_modules("all-linear") == {"all"}
    flagged = doctor(SAMPLES / "w_names", 2, 8, 6, target_modules=["gate_up_proj", "down_proj", "w1", "w2", "w3"])
    assert flagged.targets_from == "--lora-target-modules" and flagged.exit_status == 1  # no w1 buffer in Inkling
    assert flagged.load.text == "NotImplementedError: get_hidden_dim not implemented for w1"
    assert "--lora-target-modules" not in flagged.findings[0].fix.split("(more")[0].replace(
        "and no other in --lora-target-modules", "")  # no flag cures it: the adapter names w1 (ISL-E034)
    narrow = doctor(SAMPLES / "gate_up", 2, 8, 6, target_modules=["gate_proj"])
    assert narrow.load.outcome == "raises" and "not included in the specified --lora-target-modules" in narrow.load.text
    assert main(["doctor", str(SAMPLES / "one_sided"), *TOY]) == 1
    out = capsys.readouterr().out
    assert "the base model only" in out and "never wraps the shared sink" in out
    assert main(["doctor", str(SAMPLES / "one_sided"), *TOY, "--lora-target-modules", "gate_up_proj", "down_proj"]) == 0


def test_sglang_facts_are_stated_exactly():
    dora = doctor(SAMPLES / "dora", 2, 8, 6)
    assert dora.load.text == ("ValueError: Failed to load dora because LoRA serving currently doesn't support DoRA "
                              "adapters") and "validate_new_adapter" in dora.load.upstream
    assert doctor(SAMPLES / "adalora", 2, 8, 6).load.text == "AssertionError"  # the bare peft_type assert
    binary = doctor(SAMPLES / "bin_only", 2, 8, 6)
    assert binary.load.outcome == "loads" and "torch.load(weights_only=True)" in binary.load.why
    assert "save_file(torch.load('adapter_model.bin', weights_only=True)" in binary.findings[0].fix
    assert "cannot read this adapter" not in str(binary)
    named = doctor(SAMPLES / "named_adapters", 2, 8, 6)
    assert named.load.text.startswith("FileNotFoundError: [Errno 2] No such file or directory")
    assert "code, math" in named.findings[0].message and "named_adapters/code" in named.findings[0].fix
    for name in ("nan_factor", "nan_alpha", "inf_alpha"):
        report = doctor(SAMPLES / name, 2, 8, 6)
        assert report.computes.outcome == "nan" and report.exit_status == 1 and report.kit.outcome == "refuses"
    w1 = doctor(SAMPLES / "duplicate_w1", 2, 8, 6)
    assert any("serves base_model.model.model.layers.0.mlp.shared_experts.w1.lora_A.weight" in c
               for c in w1.computes.causes)
    assert "two keys for one factor" in w1.kit.text


@pytest.mark.parametrize("init", ["pissa", "pissa_niter_4", "olora", "corda", "loftq"])
def test_base_changing_inits_are_named_for_sglang_and_refused_by_the_kit(init, tmp_path):
    ad = synthetic_adapter(2, 8, 6, 4, seed=0)
    folder = save_adapter(Adapter("a", 4, 8.0, ad.target_modules, ad.weights, {**ad.config, "init_lora_weights": init}),
                          tmp_path / "a")
    report = doctor(folder, 2, 8, 6, measure=False)
    assert (report.load.outcome, report.computes.outcome, report.kit.code) == ("loads", "different", "ISL-K305")
    assert "ISL-W107" in [f.code for f in report.findings] and report.exit_status == 1
    assert ("LoftQ-quantized base" in report.kit.text) == (init == "loftq")
    converted = save_adapter(Adapter("b", 4, 8.0, ad.target_modules, ad.weights,  # as PEFT's conversion saves it
                                     {**ad.config, "init_lora_weights": True}), tmp_path / "b")
    assert doctor(converted, 2, 8, 6).exit_status == 0


def test_explain_and_warn_for_the_new_codes():
    import warnings

    from inkling_lab.catalog import UpstreamDefectWarning
    from inkling_lab.errors import explain

    entry = explain("ISL-W101")
    assert "sglang/srt/lora/lora.py: LoRAAdapter.__init__" in entry.upstream and entry.adapter_caused
    assert explain(doctor(SAMPLES / "rslora", 2, 8, 6).findings[0].message) is entry
    with pytest.warns(UpstreamDefectWarning, match="use_rslora is set"):
        doctor(SAMPLES / "rslora", 2, 8, 6).warn()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        doctor(SAMPLES / "gate_up", 2, 8, 6).warn()


def test_compare_report_reads_like_assert_close():
    report = compare([SAMPLES / "per_expert", SAMPLES / "gate_up"], 2, 8, 6, tokens=5, seed=3)
    text = str(report)
    assert "Mismatched elements: " in text and "Greatest absolute difference: " in text and "at index (" in text
    assert "Cause: the per-expert outer layout" in text and not report.agree
    bad = [r for r in report.rows if r.got == "sglang" and not r.close]
    assert {r.slot for r in bad} == {0}  # slot 1 (gate_up, shared outer) is served right
    import matplotlib.pyplot as plt

    from inkling_lab.compare import compare_figure

    fig = compare_figure(report, slot=0)
    assert len(fig.axes) == 2 and "per_expert" in fig.axes[0].get_title()
    plt.close(fig)
    data = compare_figure_data(report, slot=0)
    assert set(data["norms"]) == {"peft", "sglang", "kit"} and len(data["norms"]["peft"]) == 2
    assert data["differences"]["kit"] == [0.0, 0.0] and min(data["differences"]["sglang"]) > 0


def test_a_match_to_rounding_prints_no_number_a_real_difference_does():
    from inkling_lab.compare import mismatch
    from inkling_lab.records import FLOAT64_ROUNDING

    peft = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    labels = dict(module="m", slot=0, adapter="a", expert=None, got="kit")
    exact, ulp = mismatch(peft.clone(), peft, **labels), mismatch(peft.nextafter(peft + 1), peft, **labels)
    assert exact.close and exact.rounding and ulp.close and ulp.rounding and ulp.max_abs > 0
    assert str(exact) == str(ulp) == "m slot 0 (a) sink output (all experts): kit == peft (equal to float64 rounding)"
    off = peft + 100 * FLOAT64_ROUNDING * peft.abs().max()  # within the tolerance, far above rounding
    close = mismatch(off, peft, **labels)
    assert close.close and not close.rounding and f"(greatest absolute difference {close.max_abs:.3g})" in str(close)
    assert not mismatch(peft.float().double(), peft, **labels).rounding  # float32's rounding is a real difference


def _peft_module(n, H, F):
    """A toy model whose shared experts are the three linear layers of SPEC §6 (gate and up
    of n*F rows, down of n*F columns), named as Inkling names them."""
    from torch import nn

    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = nn.Linear(H, n * F, bias=False), nn.Linear(H, n * F, bias=False)
            self.down_proj = nn.Linear(n * F, H, bias=False)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = nn.Module()
            self.model.layers = nn.ModuleList([nn.Module()])
            self.model.layers[0].mlp = nn.Module()
            self.model.layers[0].mlp.shared_experts = Experts()

        def forward(self, x):
            return self.model.layers[0].mlp.shared_experts.gate_proj(x)

    return Model()


@pytest.mark.parametrize("extra", [{"use_rslora": True}, {"alpha_pattern": {"down_proj": 32.0}},
                                   {"rank_pattern": {"gate_proj": 8, "up_proj": 8}, "alpha_pattern": {"down_proj": 2.0}}],
                         ids=["rslora", "alpha_pattern", "rank_and_alpha_pattern"])
def test_the_peft_math_is_what_peft_computes_for_adapters_peft_saved(extra, tmp_path):
    peft = pytest.importorskip("peft", reason="peft is not installed in this environment")
    n, H, F = 2, 8, 6
    torch.manual_seed(0)
    model = peft.get_peft_model(_peft_module(n, H, F), peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["gate_proj", "up_proj", "down_proj"], init_lora_weights=False, **extra))
    model.save_pretrained(tmp_path / "saved")
    adapter = load_adapter(tmp_path / "saved")
    module = adapter.modules[0]
    experts = model.base_model.model.model.layers[0].mlp.shared_experts
    gate, up, down = kit_reading(adapter, module, n)
    with torch.no_grad():
        for layer, mine, width in ((experts.gate_proj, gate, H), (experts.up_proj, up, H)):
            want = layer.get_delta_weight("default").double()  # PEFT's own scaling * B @ A
            assert torch.allclose(mine.reshape(n * F, width), want, atol=1e-6)
        want = experts.down_proj.get_delta_weight("default").double()  # [H, n*F]
        assert torch.allclose(down.permute(1, 0, 2).reshape(H, n * F), want, atol=1e-6)
    report = doctor(tmp_path / "saved", n, H, F)
    code = "ISL-W101" if "use_rslora" in extra else "ISL-W112" if "rank_pattern" in extra else "ISL-W102"
    assert code in [f.code for f in report.findings] and report.exit_status == 1
    result = compare([tmp_path / "saved"], n, H, F)
    assert all(r.close for r in result.rows if r.got == "kit")  # the converter writes PEFT's math


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=st.integers(1, 3), r=st.integers(1, 4), config_r=st.integers(1, 5))
def test_the_doctor_never_raises_on_a_damaged_adapter(data, n, r, config_r):
    a = synthetic_adapter(2, 4, 3, r, naming=data.draw(st.sampled_from(sorted(NAMINGS))),
                          per_expert=data.draw(st.booleans()))
    weights = dict(a.weights)
    for key in data.draw(st.lists(st.sampled_from(sorted(weights)), max_size=3, unique=True)):
        damage = data.draw(st.sampled_from(["drop", "transpose", "flatten", "cut", "rename", "nan"]))
        t = weights.pop(key)
        if damage == "transpose":
            weights[key] = t.T.contiguous()
        elif damage == "flatten":
            weights[key] = t.flatten()
        elif damage == "cut":
            weights[key] = t[: max(t.shape[0] - 1, 0)].contiguous()
        elif damage == "rename":
            weights[key.replace("lora_", "lora_x")] = t
        elif damage == "nan":
            weights[key] = torch.full_like(t, math.nan)
    config = {**a.config, "r": config_r, **data.draw(st.sampled_from([{}, {"use_rslora": True},
                                                                      {"alpha_pattern": {"down_proj": 3}}]))}
    broken = Adapter(a.name, config_r, a.lora_alpha, a.target_modules, weights, config)
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_adapter(broken, Path(tmp) / "damaged")
        report = doctor(folder, n, 4, 3, tp=data.draw(st.sampled_from([1, 3])), measure=False)
        result = compare([folder], n, 4, 3, tokens=2)
    assert str(report) and json.dumps(report.to_dict()) and str(result)
    assert report.exit_status == (0 if (report.load.outcome, report.computes.outcome) == ("loads", "adapter") else 1)
    if report.kit.outcome == "refuses":  # always a catalogued error, never a raw one from deep inside
        assert report.error_code is not None, report.kit.text
    if report.kit.outcome == "writes" and result.status["peft"] == ["computed"]:
        assert all(r.close for r in result.rows if r.got == "kit")


@pytest.mark.parametrize("naming", sorted(NAMINGS))
def test_a_per_expert_adapter_with_a_nan_factor_gets_a_verdict_not_a_raise(naming, tmp_path):
    # Found by the damaged-adapter property test: the per-expert defect measurement loaded the
    # NaN factors into a pool, whose refusal (ISL-K160) escaped the doctor.
    a = synthetic_adapter(2, 4, 3, 2, naming=naming, per_expert=True)
    weights = dict(a.weights)
    key = next(k for k in sorted(weights) if "lora_B" in k)
    weights[key] = torch.full_like(weights[key], math.nan)
    folder = save_adapter(Adapter(a.name, 2, a.lora_alpha, a.target_modules, weights, a.config), tmp_path / "d")
    report = doctor(folder, 2, 4, 3, measure=False)
    codes = [f.code for f in report.findings]
    assert report.exit_status == 1 and str(report) and json.dumps(report.to_dict())
    assert "ISL-W001" not in codes  # nothing left to measure in an all-NaN module
    if report.computes.outcome not in ("base", "nothing"):  # a wrapped sink serves the NaN: the doctor says so
        assert "ISL-W105" in codes


def test_the_journey_figure_and_the_explorer_follow_the_doctor():
    import matplotlib.pyplot as plt

    from inkling_lab.viz import adapter_journey_figure
    from inkling_lab.widgets import adapter_explorer

    rows = doctor(SAMPLES / "per_expert", 2, 8, 6).journey["base_model.model.model.layers.0.mlp.shared_experts"]
    fig = adapter_journey_figure(rows, "per_expert")
    titles = [ax.get_title() for ax in fig.axes]
    assert len(fig.axes) == 12 and "[1, 2, 12, 4]" in titles and "0.gate_proj.lora_A [4, 8]" in titles[0]
    plt.close(fig)
    failed = adapter_journey_figure(next(iter(doctor(SAMPLES / "three_experts", 2, 8, 6).journey.values())))
    assert "fails before here" in [t.get_text() for t in failed.axes[1].texts]
    plt.close(failed)

    box = adapter_explorer(str(SAMPLES))
    controls = {c.description: c for row in box.children for c in getattr(row, "children", ())
                if getattr(c, "description", "")}
    adapter, tp, n, max_rank = (controls[k] for k in ("adapter", "tp", "n experts", "max rank R"))
    adapter.value, n.value = "rank8", 3  # each change redraws through the doctor without raising
    max_rank.value, tp.value = 2, 2
    plt.close("all")


def test_the_last_line_says_the_server_does_not_start_where_it_does_not():
    # ISL-E038 is raised sizing the pool at server start (mem_pool.py: LoRAMemoryPool.init_buffers),
    # so "fails to load it" would be untrue (the buffer-load failure of ISL-E036 keeps that wording:
    # tests/test_buffer_load_names.py).
    e038 = str(doctor(SAMPLES / "w_names", 2, 8, 6)).splitlines()[-1]
    assert e038 == ("Exit status 1: the sglang 0.5.23 server does not start with these target modules (ISL-E038), "
                    "so it never loads the adapter")
    rank = doctor(SAMPLES / "rank_pattern", 2, 8, 6)
    assert rank.error_code == "ISL-E038" and str(rank).endswith("so it never loads the adapter")
