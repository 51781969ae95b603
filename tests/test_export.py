"""The cure (issue 23): adapters made by PEFT itself, exported, read back through the kit's
model of sglang 0.5.23's loading path; what sglang serves equals PEFT's own delta
(``get_delta_weight`` / merged weights), computed by PEFT, never by the export."""
import dataclasses
import json
import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from inkling_lab import export as export_module
from inkling_lab.adapters import CONFIG_FILE, WEIGHTS_FILE, load_adapter, save_adapter, synthetic_adapter
from inkling_lab.cli import main
from inkling_lab.compare import factor_deltas
from inkling_lab.export import export_for_sglang, shared_outer, verify_export
from inkling_lab.pool import LoRAFactors
from inkling_lab.records import FLOAT64_ROUNDING, relative_error
from inkling_lab.sglang_path import run_sglang
from peers import installed

pytestmark = pytest.mark.skipif(not installed("peft"), reason="needs peft >= 0.18 (the test extra)")

D = torch.float64
SINK = ("gate_proj", "up_proj", "down_proj")


def _close(got, want, bound, dtype):
    """float64 1e-9, float32 1e-6 (relative); 16-bit: two rounding steps of the served |B'||A'|."""
    if dtype in (torch.float64, torch.float32):
        return relative_error(got, want) <= (1e-9 if dtype == D else 1e-6)
    return bool(((got - want).abs() <= 2 * torch.finfo(dtype).eps * bound + 1e-300).all())


class _Layer(torch.nn.Module):
    def __init__(self, n, H, F, attention):
        super().__init__()
        self.mlp = torch.nn.Module()
        self.mlp.shared_experts = torch.nn.Module()
        for name, (i, o) in {"gate_proj": (H, n * F), "up_proj": (H, n * F), "down_proj": (n * F, H)}.items():
            setattr(self.mlp.shared_experts, name, torch.nn.Linear(i, o, bias=False))
        if attention:  # q and v: sglang's normalize_qkv_proj stacks them (a q_proj alone is its KeyError)
            self.self_attn = torch.nn.Module()
            self.self_attn.q_proj = torch.nn.Linear(H, 2 * H, bias=False)
            self.self_attn.v_proj = torch.nn.Linear(H, 2 * H, bias=False)


def peft_classic(folder, n, H, F, r, *, layers=1, targets=SINK, attention=False, dtype=D, seed=0, **options):
    """A classic PEFT adapter of the flat 2D shared-sink layout (docs/reference.md#adapters-on-disk), made by PEFT itself
    (``gate_proj``/``up_proj`` Linear ``H -> n*F``, ``down_proj`` ``n*F -> H``), factors
    representable in ``dtype``, saved in ``dtype``. Returns PEFT's own delta of every LoRA
    module (``get_delta_weight``, float64), by module name."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList([_Layer(n, H, F, attention) for _ in range(layers)])
    model = model.double()
    config = LoraConfig(r=r, target_modules=list(targets) + (["q_proj", "v_proj"] if attention else []),
                        init_lora_weights=False, **options)
    peft_model = get_peft_model(model, config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_((torch.randn(p.shape, generator=gen, dtype=D) / p.shape[-1] ** 0.5).to(dtype).double())
    peft_model.save_pretrained(str(folder))
    weights = folder / WEIGHTS_FILE
    save_file({k: v.to(dtype) for k, v in load_file(weights).items()}, weights)
    deltas = {}
    for name, module in peft_model.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "lora_A") and "default" in module.lora_A:
            deltas[name.removeprefix("base_model.model.")] = module.get_delta_weight("default").detach().double()
    return deltas


def served(folder, n, H, F):
    """What sglang 0.5.23 serves from ``folder``, per sink module (the kit's model, the whole
    folder read as sglang reads it): gate, up ``[n, F, H]``, down ``[n, H, F]`` and the bound
    ``|B'| @ |A'|`` of each."""
    path = run_sglang(folder, n, H, F)
    assert path.raised is None and not path.unknown and path.wrapped and not path.causes and not path.skip_warning
    out = {}
    for module, f in path.loaded.items():
        assert f.outer == 1  # the shared-outer layout sglang computes right
        out[module.removeprefix("base_model.model.")] = (factor_deltas(*f.tensors().values()),
                                                         factor_deltas(*(t.abs() for t in f.tensors().values())))
    return out, path


def per_expert(deltas, module, n, F):
    """PEFT's flat deltas of one sink module as per-expert ``[n, F, H]`` / ``[n, H, F]``."""
    gate, up, down = (deltas.get(f"{module}.{p}") for p in SINK)
    H = (down if down is not None else gate.T).shape[0]
    zero = torch.zeros(n * F, H, dtype=D)
    gate, up = (zero if t is None else t for t in (gate, up))
    down = zero.T if down is None else down
    return gate.view(n, F, H), up.view(n, F, H), down.view(H, n, F).permute(1, 0, 2)


def assert_serves_peft(out, deltas, n, H, F, dtype):
    got, path = served(out, n, H, F)
    modules = sorted({k.rsplit(".", 1)[0] for k in deltas if ".shared_experts." in k})
    assert sorted(got) == modules
    for module in modules:
        (dg, bounds) = got[module]
        for part, s, w, b in zip(SINK, dg, per_expert(deltas, module, n, F), bounds):
            assert _close(s, w, b, dtype), (module, part, relative_error(s, w))
    config = json.loads((out / CONFIG_FILE).read_text())
    weights = load_file(out / WEIGHTS_FILE)
    for name, want in deltas.items():  # other modules: sglang's one lora_alpha / r times B' @ A'
        if ".shared_experts." in name:
            continue
        a, b = (weights[f"base_model.model.{name}.lora_{ab}.weight"].double() for ab in "AB")
        assert a.shape[0] == config["r"] == b.shape[1]
        assert _close(config["lora_alpha"] / config["r"] * b @ a, want, b.abs() @ a.abs(), dtype), name
    return config, path


# -- PEFT's own adapters, exported ---------------------------------------------------------------

@pytest.mark.parametrize("options", [
    {"lora_alpha": 8},
    {"lora_alpha": 3, "use_rslora": True},
    {"lora_alpha": 4, "rank_pattern": {"down_proj": 3}, "alpha_pattern": {"up_proj": 11}},
    {"lora_alpha": 5, "use_rslora": True, "rank_pattern": {"layers.1.mlp.shared_experts.gate_proj": 1,
                                                       "layers.1.mlp.shared_experts.up_proj": 1}},
])
@pytest.mark.parametrize("targets", [SINK, ("gate_proj", "up_proj"), ("down_proj",)])
def test_a_classic_peft_adapter_is_served_as_peft_computes_it(tmp_path, options, targets):
    n, H, F = 2, 8, 3
    deltas = peft_classic(tmp_path / "in", n, H, F, 2, layers=2, targets=targets, **options)
    report = export_for_sglang(tmp_path / "in", tmp_path / "out", n)
    assert report.written, report
    config, _ = assert_serves_peft(tmp_path / "out", deltas, n, H, F, D)
    assert config["lora_alpha"] == config["r"] == report.rank  # sglang's own scaling is 1
    assert not {"use_rslora", "rank_pattern", "alpha_pattern", "target_parameters"} & {
        k for k, v in config.items() if v}
    assert set(config["target_modules"]) == {"gate_proj", "up_proj", "down_proj"}
    assert report.max_rel_error is not None and report.max_rel_error < 1e-9


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 3), H=st.integers(2, 7), F=st.integers(1, 4), r=st.integers(1, 4),
       down_rank=st.integers(1, 5), alpha=st.floats(0.25, 40), rslora=st.booleans(),
       dtype=st.sampled_from([torch.float64, torch.float32, torch.bfloat16, torch.float16]),
       seed=st.integers(0, 99))
def test_any_classic_adapter_exports_to_peft_s_math(tmp_path_factory, n, H, F, r, down_rank, alpha, rslora, dtype,
                                                    seed):
    tmp = tmp_path_factory.mktemp("export")
    deltas = peft_classic(tmp / "in", n, H, F, r, dtype=dtype, seed=seed, lora_alpha=alpha, use_rslora=rslora,
                          rank_pattern={"down_proj": down_rank})
    report = export_for_sglang(tmp / "in", tmp / "out", n)
    assert report.written, report
    assert report.rank == max(r, down_rank) and report.dtype == str(dtype).removeprefix("torch.")
    assert_serves_peft(tmp / "out", deltas, n, H, F, dtype)


# -- PEFT target_parameters exports of transformers' Inkling ------------------------------------------

@pytest.mark.parametrize("options", [
    {},
    {"use_rslora": True},
    {"rank_pattern": {"mlp.shared_experts.down_proj": 3}, "alpha_pattern": {"mlp.shared_experts.up_proj": 7.0}},
    {"use_rslora": True, "alpha_pattern": {"mlp.shared_experts.gate_proj": 0.5}},
])
def test_a_target_parameters_export_is_served_as_trained(tmp_path, options):
    pytest.importorskip("transformers.models.inkling", reason="needs transformers >= 5.24 (the test extra)")
    from inkling_lab.doctor import doctor
    from inkling_lab.transformers_interop import make_peft_sink_adapter, transformers_state

    n, H, F = 3, 8, 4
    made = make_peft_sink_adapter(tmp_path / "in", n, H, F, rank=2, lora_alpha=5.0, lora_options=options)
    before = doctor(made.folder, n, H, F)  # its keys match no target module: the buffer load fails on them
    assert before.computes.outcome == "nothing" and before.error_code == "ISL-E036"
    report = export_for_sglang(made.folder, tmp_path / "out", n)
    assert report.written, report
    ranks = [2, 3 if options.get("rank_pattern") else 2]
    assert report.rank == n * max(ranks)  # per-expert outer: stacked to n*r
    assert any(f.code == "ISL-N501" for f in report.findings)
    base = transformers_state(made.base)
    got, _ = served(tmp_path / "out", n, H, F)
    (deltas, bounds), = got.values()
    for part, delta in zip(SINK, deltas):  # PEFT's merged weights minus the base, float64
        assert relative_error(delta, made.merged[part] - base[part]) < 1e-9, part
    assert doctor(tmp_path / "out", n, H, F).ok  # the doctor: sglang serves the adapter's math


def test_identical_per_expert_outer_factors_collapse_to_rank_r():
    f = LoRAFactors.random(3, 5, 4, 2, outer=1, seed=1)
    per = LoRAFactors(f.gate_up_a.expand(3, -1, -1).clone(), f.gate_up_b, f.down_a, f.down_b.expand(3, -1, -1).clone(),
                      lora_alpha=f.lora_alpha)
    collapsed, how = shared_outer(per)
    assert how == "collapsed" and collapsed.rank == 2 and collapsed.outer == 1
    other = LoRAFactors.random(3, 5, 4, 2, outer=3, seed=2)
    stacked, how = shared_outer(other)
    assert how == "stacked" and stacked.rank == 6 and stacked.scaling == pytest.approx(other.scaling)
    for s, w in zip(factor_deltas(*stacked.tensors().values(), scaling=stacked.scaling),
                    factor_deltas(*other.tensors().values(), scaling=other.scaling)):
        assert torch.equal(s, w)  # blocks and zeros: exact, not merely close



def test_an_exact_proof_names_no_comparison_and_reads_the_same_on_every_cpu(tmp_path):
    # Scaling 8 / 4 = 2 folds into B without rounding: served and PEFT's delta differ only by
    # float64's rounding, whose largest element depends on the CPU's BLAS kernels.
    exact = export_for_sglang(save_adapter(synthetic_adapter(2, 8, 6, 4, per_expert=True, lora_alpha=8.0),
                                           tmp_path / "exact"), tmp_path / "exact_out", 2)
    assert exact.written and exact.max_rel_error <= FLOAT64_ROUNDING, exact
    text = str(exact)
    assert f"every module and expert matches to float64 rounding ({len(exact.proof)} comparisons" in text
    assert "served ==" not in text  # no noise-picked "worst" comparison
    shuffled = dataclasses.replace(exact, proof=exact.proof[::-1])
    assert str(shuffled) == text
    # Scaling 3 / 4 in a float32 export rounds B: a real difference, and the worst row is named.
    rounded = export_for_sglang(save_adapter(synthetic_adapter(2, 8, 6, 4, per_expert=True, lora_alpha=3.0,
                                                               dtype=torch.float32), tmp_path / "rounded"),
                                tmp_path / "rounded_out", 2)
    worst = max(rounded.proof, key=lambda r: r.max_rel)
    assert rounded.written and worst.max_rel > FLOAT64_ROUNDING, rounded
    assert f"  {worst}\n  every module and expert matches ({len(rounded.proof)} comparisons)" in str(rounded)

# -- the proof catches a wrong export ------------------------------------------------------------------

def test_a_wrong_export_is_caught_by_the_proof(tmp_path, monkeypatch):
    ad = synthetic_adapter(2, 8, 6, 4, per_expert=True, lora_alpha=4.0)  # scaling 1: only the layout is wrong
    src = save_adapter(ad, tmp_path / "in")
    kept = verify_export(src, load_adapter(src), 2)  # the per-expert outer layout kept, as PEFT saved it
    assert not kept.ok and "ISL-W001" in kept.failure
    with pytest.raises(ValueError, match="does not compute the adapter's math"):
        kept.check()
    rs = synthetic_adapter(2, 8, 6, 4)
    rs.config["use_rslora"] = True
    folder = save_adapter(rs, tmp_path / "rslora")
    monkeypatch.setattr(export_module, "_folded", lambda module, f: f)  # scaling not folded
    report = export_for_sglang(folder, tmp_path / "out", 2)
    assert not report.written and report.code == "ISL-K503" and report.exit_status == 1
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["in", "rslora"]
    assert any(not r.close for r in report.proof)
    assert "served != peft" in str(report)


# -- other modules: written only where sglang's normalization and buffer load take them -------------------

_ATTENTION = "base_model.model.model.layers.{layer}.self_attn.{module}.lora_{ab}.weight"

_UNLOADABLE = {  # what the kit's model of sglang 0.5.23 does with these, read from the input itself
    "q_proj alone": {"q_proj": 16},  # normalize_qkv_proj reads its v_proj: KeyError
    "q_proj and k_proj without v_proj": {"q_proj": 16, "k_proj": 8},  # the same KeyError
    # the input's config targets the sink only (its other weights fail the buffer load, ISL-E036); the
    # export's names them, and Inkling's get_hidden_dim has no buffer for them: no server start (ISL-E038)
    "k_proj and v_proj without q_proj": {"k_proj": 8, "v_proj": 8},
    "Inkling's wq_du, wk_dv, wv_dv, wr_du": {"wq_du": 8, "wk_dv": 8, "wv_dv": 8, "wr_du": 8},
    "q_proj and v_proj": {"q_proj": 16, "v_proj": 8},
    "Inkling's wq_du, wk_dv, wv_dv without wr_du": {"wq_du": 8, "wk_dv": 8, "wv_dv": 8},
    "o_proj": {"o_proj": 8},
}
_NO_BUFFER = {  # the export's target module that get_hidden_dim names (the first sorted; sglang's: hash order)
    "k_proj and v_proj without q_proj": "qkv_proj", "q_proj and v_proj": "qkv_proj", "o_proj": "o_proj",
    "Inkling's wq_du, wk_dv, wv_dv, wr_du": "wk_dv", "Inkling's wq_du, wk_dv, wv_dv without wr_du": "wk_dv",
}
_LOADABLE = {  # sglang's own Inkling attention modules (supported_lora_modules)
    "qkvr": {"qkvr": 32},
    "wo_ud": {"wo_ud": 8},
    "qkvr and wo_ud": {"qkvr": 32, "wo_ud": 8},
}


def _with_others(tmp_path, modules, layer=0, **config):
    """The synthetic adapter (rsLoRA: sglang serves it wrongly, the doctor says so) with LoRA
    pairs on ``modules`` (name -> output size) of layer ``layer``, ``target_modules`` naming them."""
    ad = synthetic_adapter(2, 8, 6, 4)
    ad.config.update(use_rslora=True, **config)
    ad.config["target_modules"] = [*SINK, *modules]
    gen = torch.Generator().manual_seed(1)
    for module, out in modules.items():
        ad.weights[_ATTENTION.format(layer=layer, module=module, ab="A")] = torch.randn(4, 8, generator=gen, dtype=D)
        ad.weights[_ATTENTION.format(layer=layer, module=module, ab="B")] = torch.randn(out, 4, generator=gen, dtype=D)
    return save_adapter(ad, tmp_path / "in")


@pytest.mark.parametrize("case", sorted(_UNLOADABLE))
def test_other_modules_sglang_cannot_load_are_refused_up_front(tmp_path, case):
    folder = _with_others(tmp_path, _UNLOADABLE[case])
    given = run_sglang(folder, 2, 8, 6)  # the input as sglang reads it: its own failure, not the export's
    assert given.raised is not None and given.raised.stage in ("normalize", "pool"), given.raised
    report = export_for_sglang(folder, tmp_path / "out", 2)
    assert (report.written, report.code, report.exit_status) == (False, "ISL-K508", 1), report.error
    assert not report.proof  # refused by the plan, before anything was written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
    named = (f"get_hidden_dim not implemented for {_NO_BUFFER[case]}" if case in _NO_BUFFER  # the export's targets
             else given.raised.text.partition(": ")[2])  # normalization's KeyError: the input's own
    assert named in report.error and "invents no factors" in report.error  # sglang's own words, and why
    for module in _UNLOADABLE[case]:
        assert f"self_attn.{module}" in report.error


def test_the_refusal_names_the_layer_sglang_fails_on(tmp_path):
    folder = _with_others(tmp_path, _UNLOADABLE["q_proj and v_proj"])
    weights = load_file(folder / WEIGHTS_FILE)
    for ab, shape in (("A", (4, 8)), ("B", (16, 4))):  # layer 3: a q_proj without its v_proj
        weights[_ATTENTION.format(layer=3, module="q_proj", ab=ab)] = torch.ones(shape, dtype=D)
    save_file(weights, folder / WEIGHTS_FILE)
    report = export_for_sglang(folder, tmp_path / "out", 2)
    assert report.code == "ISL-K508" and "(model.layers.3.self_attn.q_proj)" in report.error, report.error
    assert "layers.0.self_attn" not in report.error


@pytest.mark.parametrize("case", sorted(_LOADABLE))
@pytest.mark.parametrize("layer", [0, 1])  # 1: a layer without a sink module, read back on its own
def test_other_modules_sglang_loads_are_written_and_served(tmp_path, case, layer):
    folder = _with_others(tmp_path, _LOADABLE[case], layer)
    report = export_for_sglang(folder, tmp_path / "out", 2)
    assert report.written, report.error
    served(tmp_path / "out", 2, 8, 6)  # the whole folder through the kit's model of sglang: loads, nothing skipped
    assert {r.module for r in report.proof if r.part == "LoRA delta"} == {
        _ATTENTION.format(layer=layer, module=m, ab="A").removesuffix(".lora_A.weight") for m in _LOADABLE[case]}


@pytest.mark.parametrize("layer", [0, 1])
def test_the_proof_fails_closed_on_other_modules(tmp_path, layer):
    folder = _with_others(tmp_path, _LOADABLE["qkvr"], layer)
    assert export_for_sglang(folder, tmp_path / "out", 2).written
    weights = load_file(tmp_path / "out" / WEIGHTS_FILE)
    for ab, shape in (("A", (4, 8)), ("B", (16, 4))):  # a q_proj in the export: normalization reads its v_proj
        weights[_ATTENTION.format(layer=layer, module="q_proj", ab=ab)] = torch.zeros(shape, dtype=D)
    save_file(weights, tmp_path / "out" / WEIGHTS_FILE)
    proof = verify_export(tmp_path / "out", folder, 2)
    assert not proof.ok and "KeyError" in proof.failure and "v_proj" in proof.failure, proof.failure
    # a weight of an unmodelled name: the kit cannot tell what sglang's normalization does, so the proof fails
    weights[_ATTENTION.format(layer=layer, module="q_a_proj", ab="A")] = torch.zeros(4, 8, dtype=D)
    weights[_ATTENTION.format(layer=layer, module="q_a_proj", ab="B")] = torch.zeros(8, 4, dtype=D)
    for ab in "AB":
        del weights[_ATTENTION.format(layer=layer, module="q_proj", ab=ab)]
    save_file(weights, tmp_path / "out" / WEIGHTS_FILE)
    proof = verify_export(tmp_path / "out", folder, 2)
    assert not proof.ok and "does not model" in proof.failure, proof.failure


# -- refusals: a code, exit status 1, nothing left behind ------------------------------------------------

def _saved(tmp_path, **config):
    ad = synthetic_adapter(2, 8, 6, 4)
    ad.config.update(config)
    return save_adapter(ad, tmp_path / "in")


@pytest.mark.parametrize("config, code", [
    ({"use_dora": True}, "ISL-K303"), ({"lora_bias": True}, "ISL-K304"),
    ({"modules_to_save": ["mlp"]}, "ISL-K504"), ({"modules_to_save": ["lm_head"]}, "ISL-K504"),
    ({"init_lora_weights": "pissa"}, "ISL-K305")])
def test_what_no_export_can_serve_is_refused(tmp_path, config, code):
    report = export_for_sglang(_saved(tmp_path, **config), tmp_path / "out", 2)
    assert (report.written, report.code) == (False, code)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_nan_overflow_and_sizes_are_refused(tmp_path):
    ad = synthetic_adapter(2, 8, 6, 4, dtype=torch.float16, lora_alpha=1e6)
    assert export_for_sglang(save_adapter(ad, tmp_path / "fp16"), tmp_path / "out", 2).code == "ISL-K501"
    folder = _saved(tmp_path)
    weights = load_file(folder / WEIGHTS_FILE)
    weights["base_model.model.model.layers.0.self_attn.qkvr.lora_A.weight"] = torch.full((4, 8), math.nan)
    weights["base_model.model.model.layers.0.self_attn.qkvr.lora_B.weight"] = torch.ones(32, 4)  # one sglang serves
    save_file(weights, folder / WEIGHTS_FILE)
    assert export_for_sglang(folder, tmp_path / "out", 2).code == "ISL-K302"
    assert export_for_sglang(_saved(tmp_path / "b"), tmp_path / "out", 2, hidden=9).code == "ISL-K506"
    assert export_for_sglang(_saved(tmp_path / "c"), tmp_path / "out", 2, tp=4).code == "ISL-K102"
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_the_output_is_never_an_input_and_needs_force(tmp_path):
    folder = _saved(tmp_path)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    for out in (folder, tmp_path, folder / "inside"):
        report = export_for_sglang(folder, out, 2, force=True)
        assert report.code == "ISL-K505", out
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("x")
    report = export_for_sglang(folder, tmp_path / "out", 2)
    assert not report.written and isinstance(report.exception, FileExistsError)
    assert (tmp_path / "out" / "keep").exists()
    report = export_for_sglang(folder, tmp_path / "out", 2, force=True)
    assert report.written and sorted(os.listdir(tmp_path / "out")) == [CONFIG_FILE, WEIGHTS_FILE]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_failure_while_writing_leaves_nothing(tmp_path, monkeypatch):
    folder = _saved(tmp_path)

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_module, "stream_safetensors", broken)
    report = export_for_sglang(folder, tmp_path / "out", 2)
    assert not report.written and "No space left" in report.error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


# -- the command ------------------------------------------------------------------------------------------

def test_the_command_prints_json_and_the_server_flags(tmp_path, capsys):
    ad = synthetic_adapter(2, 8, 6, 4, per_expert=True)
    folder = save_adapter(ad, tmp_path / "in")
    code = main(["export", str(folder), "-o", str(tmp_path / "out"), "-n", "2", "--tp", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["written"] and out["rank"] == 8 and out["max_rel_error"] < 1e-9
    assert "--max-lora-rank 8" in out["server_flags"] and "--lora-backend triton" in out["server_flags"]
    assert "--lora-target-modules down_proj gate_up_proj" in out["server_flags"]
    assert out["tp_sizes"] == [1, 2, 3, 6] and "--tp-size 2" in out["server_flags"]
    assert {f["code"] for f in out["findings"]} >= {"ISL-N501"}
    code = main(["export", str(folder), "-o", str(tmp_path / "out"), "-n", "2"])
    assert code == 1 and "refused, nothing written" in capsys.readouterr().err


def test_the_doctor_says_where_export_cures(tmp_path):
    from inkling_lab.doctor import doctor

    rs = synthetic_adapter(2, 8, 6, 4)
    rs.config["use_rslora"] = True
    report = doctor(save_adapter(rs, tmp_path / "rslora"), 2, 8, 6)
    assert "4. `inkling-lab export` writes an adapter sglang serves as trained" in str(report)
    assert export_for_sglang(tmp_path / "rslora", tmp_path / "out", 2).written  # and it does
    assert "4. " not in str(doctor(tmp_path / "out", 2, 8, 6))  # served as trained: nothing to cure
    dora = doctor(_saved(tmp_path / "d", use_dora=True), 2, 8, 6)
    assert "4. inkling-lab export: cannot be cured because" in str(dora) and "use_dora" in dora.cure
    saved = doctor(_saved(tmp_path / "s", modules_to_save=["shared_experts"]), 2, 8, 6)
    assert "cannot be cured because" in saved.cure and "shared sink" in saved.cure


def test_the_export_is_proven_against_the_release_asked_for(tmp_path, capsys):
    folder = save_adapter(synthetic_adapter(2, 8, 6, 4), tmp_path / "in")
    code = main(["export", str(folder), "-o", str(tmp_path / "out"), "-n", "2", "--sglang", "0.5.19"])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("sglang 0.5.19, export in -> ") and "0.5.23" not in out
    assert "read back through sglang 0.5.19's loading path" in out


# -- the proof on probes, at every TP rank, streamed ---------------------------------------------------

@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 3), H=st.integers(2, 7), F=st.sampled_from([2, 4, 6]), r=st.integers(1, 3),
       down_rank=st.integers(1, 4), alpha=st.floats(0.25, 40), rslora=st.booleans(), tp=st.sampled_from([1, 2]),
       dtype=st.sampled_from([torch.float64, torch.float32, torch.bfloat16, torch.float16]), seed=st.integers(0, 99))
def test_the_proof_on_probes_agrees_with_peft_s_dense_delta(tmp_path_factory, n, H, F, r, down_rank, alpha, rslora,
                                                            tp, dtype, seed):
    """PEFT's layers on the probes equal PEFT's own get_delta_weight applied to them; the export
    proven at --tp sums every rank's served delta to that math."""
    from inkling_lab.peft_reference import peft_probes, probe

    tmp = tmp_path_factory.mktemp("probe")
    deltas = peft_classic(tmp / "in", n, H, F, r, dtype=dtype, seed=seed, lora_alpha=alpha, use_rslora=rslora,
                          rank_pattern={"down_proj": down_rank})
    x, u = export_module.probes(n, H, F, seed)
    ref = peft_probes(tmp / "in", n, H, F, x, u)
    assert ref.by_peft
    module = "base_model.model.model.layers.0.mlp.shared_experts"
    for got, want in zip(ref.deltas[module], probe(per_expert(deltas, "model.layers.0.mlp.shared_experts", n, F),
                                                   x, u)):
        assert relative_error(got, want) < 1e-12
    report = export_for_sglang(tmp / "in", tmp / "out", n, tp=tp)
    assert report.written and report.tp == tp, report
    assert len(report.proof) == 3 * n and all(row.close for row in report.proof)
    assert (f"every rank of --tp {tp} summed" in str(report)) == (tp > 1)


def test_a_target_parameters_proof_is_peft_s_own_delta_on_the_probes(tmp_path):
    pytest.importorskip("transformers.models.inkling", reason="needs transformers >= 5.24 (the test extra)")
    from inkling_lab.peft_reference import peft_probes, peft_reference, probe
    from inkling_lab.transformers_interop import make_peft_sink_adapter

    n, H, F = 3, 8, 4
    made = make_peft_sink_adapter(tmp_path / "in", n, H, F, rank=2, lora_alpha=5.0,
                                  lora_options={"use_rslora": True})
    x, u = export_module.probes(n, H, F)
    probes, dense = peft_probes(made.folder, n, H, F, x, u), peft_reference(made.folder, n, H, F)
    assert probes.by_peft and dense.by_peft
    (module,) = dense.deltas
    for got, want in zip(probes.deltas[module], probe(dense.deltas[module], x, u)):
        assert relative_error(got, want) < 1e-12
    report = export_for_sglang(made.folder, tmp_path / "out", n, tp=2)
    assert report.written and "PEFT" in report.reference and report.max_rel_error < 1e-9, report


@pytest.mark.parametrize("where", ["gate", "down"])
def test_one_wrong_element_of_the_export_is_caught_on_the_probes(tmp_path, monkeypatch, where):
    folder = save_adapter(synthetic_adapter(2, 8, 6, 4, per_expert=True), tmp_path / "in")
    right = export_module.flat_factors

    def wrong(f, rank):
        out = right(f, rank)
        key = {"gate": "gate_proj.lora_B", "down": "down_proj.lora_A"}[where]
        out[key] = out[key].clone()
        out[key][-1, -1] += 1e-3  # the last expert's last element: a small, local error
        return out

    monkeypatch.setattr(export_module, "flat_factors", wrong)
    report = export_for_sglang(folder, tmp_path / "out", 2)
    assert not report.written and report.code == "ISL-K503"
    assert not (tmp_path / "out").exists()


def test_the_tp_proof_catches_a_wrong_slicing(tmp_path, monkeypatch):
    """The proof reads every rank through the kit's slicing: cut the gate/up B of the rank
    without its halves (one block of [gate ‖ up] rows, as a naive row split would) and it fails."""
    from inkling_lab import sglang_path, shard

    folder = save_adapter(synthetic_adapter(2, 8, 6, 4), tmp_path / "in")
    assert export_for_sglang(folder, tmp_path / "good", 2, tp=2).written

    def rows_in_one_block(weights, tp_rank, target_module, tp_size, n, intermediate_size=None):
        w = shard.split_gate_up_b(weights, n) if weights.dim() == 2 else weights
        if shard.target_module_name(target_module) != shard.GATE_UP or tp_size == 1:
            return shard.slice_lora_b(weights, tp_rank, target_module, tp_size, n, intermediate_size)
        step = w.shape[1] // tp_size
        return w[:, tp_rank * step:(tp_rank + 1) * step].contiguous()

    monkeypatch.setattr(sglang_path, "slice_lora_b", rows_in_one_block)
    report = export_for_sglang(folder, tmp_path / "out", 2, tp=2)
    assert not report.written and report.code == "ISL-K503", report
    assert "at --tp 2" in report.error and not (tmp_path / "out").exists()


def test_the_input_is_streamed_one_module_at_a_time(tmp_path, monkeypatch):
    from inkling_lab.adapters import files

    folder = save_adapter(synthetic_adapter(2, 8, 6, 4, layers=tuple(range(5))), tmp_path / "in")
    held = []
    read = files.load_adapter

    def counting(*args, **kwargs):
        a = read(*args, **kwargs)
        held.append(len(a.modules))
        return a

    monkeypatch.setattr(export_module, "load_adapter", counting)
    report = export_for_sglang(folder, tmp_path / "out", 2)
    assert report.written and len(report.modules) == 5
    assert held and max(held) == 1  # never more than one module's factors read at once


# -- the model's activation: SiLU only -----------------------------------------------------------------

def _base_config(folder, act):
    """transformers' own Inkling config, saved as the base model's config.json."""
    pytest.importorskip("transformers.models.inkling", reason="needs transformers >= 5.24 (the test extra)")
    from transformers import InklingTextConfig

    InklingTextConfig(hidden_size=8, moe_intermediate_size=6, n_shared_experts=2, hidden_act=act).save_pretrained(
        str(folder))
    return folder


@pytest.mark.parametrize("where", ["--hidden-act", "--config", "adapter folder", "base_model_name_or_path"])
def test_a_model_of_another_activation_is_refused_saying_where_it_was_read(tmp_path, capsys, where):
    folder = _saved(tmp_path)
    args = ["export", str(folder), "-o", str(tmp_path / "out"), "-n", "2", "--json"]
    if where == "--hidden-act":
        args += ["--hidden-act", "gelu"]
    elif where == "--config":
        args += ["--config", str(_base_config(tmp_path / "base", "gelu") / "config.json")]
    elif where == "adapter folder":
        _base_config(folder, "gelu")
    else:
        _base_config(tmp_path / "base", "gelu")
        config = json.loads((folder / CONFIG_FILE).read_text())
        (folder / CONFIG_FILE).write_text(json.dumps({**config, "base_model_name_or_path": str(tmp_path / "base")}))
    assert main(args) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["code"] == "ISL-K507" and not out["written"] and "gelu(gate) * up" in out["error"]
    assert ("--hidden-act" if where == "--hidden-act" else "config.json: hidden_act") in out["error"]
    assert not (tmp_path / "out").exists()
    from inkling_lab.doctor import doctor

    report = doctor(folder, 2, 8, 6, hidden_act="gelu" if where == "--hidden-act" else None,
                    config=tmp_path / "base" if where == "--config" else None)
    assert any(f.code == "ISL-W113" for f in report.findings) and report.activation == "gelu"
    assert "cannot be cured because the model computes gelu(gate) * up" in report.cure and "ISL-K507" in report.cure


def test_the_doctor_command_reads_the_base_config(tmp_path, capsys, monkeypatch):
    folder = _saved(tmp_path, use_rslora=True)
    base = _base_config(tmp_path / "base", "gelu")
    code = main(["doctor", str(folder), "-n", "2", "--hidden", "8", "--intermediate", "6", "--config", str(base),
                 "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["model"] == {"hidden_act": "gelu", "from": f"{base / 'config.json'}: hidden_act"}
    assert "ISL-W113" in {f["code"] for f in out["findings"]} and "cannot be cured because" in out["export"]
    code = main(["doctor", str(folder), "-n", "2", "--hidden", "8", "--intermediate", "6", "--hidden-act", "silu",
                 "--config", str(base), "--json"])  # the flag wins, and says so
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == {"hidden_act": "silu", "from": "--hidden-act"}
    assert out["export"].startswith("`inkling-lab export` writes") and out["export"].endswith("--hidden-act silu")
    monkeypatch.chdir(tmp_path)  # the command it prints names the folder beside it
    assert main(out["export"].split(": ", 1)[1].split()[1:] + ["--json"]) == 0  # the command it prints, run
    assert json.loads(capsys.readouterr().out)["hidden_act_from"] == "--hidden-act"


def test_a_silu_config_is_read_and_named(tmp_path):
    folder = _saved(tmp_path)
    _base_config(folder, "silu")
    report = export_for_sglang(folder, tmp_path / "out", 2)
    assert report.written and report.hidden_act == "silu"
    assert report.hidden_act_from == f"{folder / 'config.json'}: hidden_act"
    assert f"the model's activation: silu ({folder / 'config.json'}: hidden_act)" in str(report)
    bare = export_for_sglang(_saved(tmp_path / "b"), tmp_path / "out_b", 2)
    assert bare.written and "InklingTextConfig's default" in bare.hidden_act_from


# -- the doctor's line about the cure is true in every case -----------------------------------------------

def _embedding(tmp_path):
    folder = _saved(tmp_path, use_rslora=True)
    weights = load_file(folder / WEIGHTS_FILE)
    weights["base_model.model.model.embed_tokens.lora_embedding_A"] = torch.zeros(4, 10)
    save_file(weights, folder / WEIGHTS_FILE)
    return folder


@pytest.mark.parametrize("make, tp", [
    (lambda p: _saved(p, use_rslora=True), 1), (lambda p: _saved(p, use_rslora=True), 2),
    (lambda p: save_adapter(synthetic_adapter(2, 8, 6, 4, per_expert=True), p / "in"), 3),
    (lambda p: _saved(p, use_rslora=True, modules_to_save=["lm_head"]), 1), (_embedding, 1),
    (lambda p: save_adapter(synthetic_adapter(2, 8, 6, 4, dtype=torch.float16, lora_alpha=1e6), p / "in"), 1),
    (lambda p: _base_config(_saved(p, use_rslora=True), "gelu_pytorch_tanh"), 1),
    *((lambda p, m=m: _with_others(p, m), 1) for m in (*_UNLOADABLE.values(), *_LOADABLE.values())),
])
def test_the_doctor_s_cure_line_says_what_export_does(tmp_path, make, tp):
    from inkling_lab.doctor import doctor

    folder = make(tmp_path)
    report = doctor(folder, 2, 8, 6, tp=tp)
    assert not report.ok
    exported = export_for_sglang(folder, tmp_path / "out", 2, tp=tp)
    assert report.cure.startswith("`inkling-lab export` writes") == exported.written, (report.cure, exported.error)
    if exported.written:
        assert (f"--tp {tp}" in report.cure) == (tp > 1)
        assert doctor(tmp_path / "out", 2, 8, 6, tp=tp).ok
    else:
        assert "cannot be cured because" in report.cure
        assert exported.code in report.cure or "the kit refuses the adapter" in report.cure
