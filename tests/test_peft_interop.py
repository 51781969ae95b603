"""The real thing: transformers' own InklingSharedExperts, PEFT's own target_parameters
exports of it, and the kit reading, converting and computing them (issue 13)."""
import itertools
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from inkling_lab.adapters import (
    CONFIG_FILE, WEIGHTS_FILE, is_target_parameters_export, load_adapter, peft_target_parameter_keys, save_adapter)
from inkling_lab.batch import SlotBatch
from inkling_lab.convert import convert
from inkling_lab.doctor import doctor
from inkling_lab.errors import expect_error
from inkling_lab.records import relative_error
from inkling_lab.transformers_interop import (
    PARAMETERS, make_peft_sink_adapter, peft_agreement, sink_from_checkpoint, sink_from_transformers, to_transformers,
    transformers_state)
from peers import installed

pytestmark = [pytest.mark.skipif(not installed("transformers.models.inkling"),
                                 reason="needs transformers >= 5.24 (the test extra)"),
              pytest.mark.skipif(not installed("peft"), reason="needs peft >= 0.18 (the test extra)")]

D = torch.float64


def _inputs(T, H, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, H, generator=g, dtype=D), torch.rand(T, n, generator=g, dtype=D) * 2 - 0.5


def _hf_sink(n, H, F, seed, dtype=D):
    from transformers import InklingTextConfig
    from transformers.models.inkling.modeling_inkling import InklingSharedExperts

    module = InklingSharedExperts(InklingTextConfig(hidden_size=H, moe_intermediate_size=F, n_shared_experts=n))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in PARAMETERS:
            getattr(module, p).copy_(torch.randn(getattr(module, p).shape, generator=g) / H ** 0.5)
    return module.to(dtype)


# -- transformers' sink and the kit's ---------------------------------------------------

@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 3), H=st.integers(1, 12), F=st.integers(1, 8), T=st.integers(1, 5),
       interleaved=st.booleans(), seed=st.integers(0, 999))
def test_the_kit_sink_computes_transformers_forward(n, H, F, T, interleaved, seed):
    hf = _hf_sink(n, H, F, seed)
    sink = sink_from_transformers(hf, interleaved=interleaved)
    x, gammas = _inputs(T, H, n, seed)
    with torch.no_grad():
        want = hf(x, gammas)
        # transformers rounds its expert sum through float32 even in float64; the kit keeps float64. So the
        # bound is float32's rounding of the terms summed, each expert's share as transformers computes it
        # (the other experts' gammas zero), not of the sum, which can cancel to nearly nothing (n 3, H 1, F 1).
        shares = [hf(x, gammas * (torch.arange(n) == e).to(D)) for e in range(n)]
    scale = torch.stack(shares).abs().sum(0).norm()
    for got in (sink.base_forward(x, gammas, form="per_expert"), sink(x, gammas)):
        assert (got - want).norm() <= 1e-6 * scale


@pytest.mark.parametrize("interleaved", [True, False])
def test_weights_go_there_and_back_exactly(interleaved):
    hf = _hf_sink(2, 6, 4, seed=1)
    sink = sink_from_transformers(hf, interleaved=interleaved)
    F = 4
    gate_rows = torch.arange(F) * 2 if interleaved else torch.arange(F)
    assert torch.equal(sink.w13[:, gate_rows], hf.gate_proj) and torch.equal(sink.w2, hf.down_proj)
    state = transformers_state(sink)
    assert all(torch.equal(state[p], getattr(hf, p)) for p in PARAMETERS)
    back = to_transformers(sink)
    assert all(torch.equal(getattr(back, p), getattr(hf, p)) for p in PARAMETERS)


def test_a_checkpoint_is_read_one_layer_at_a_time(tmp_path):
    layers = [_hf_sink(2, 6, 4, seed=s, dtype=torch.float32) for s in range(2)]
    state = {f"model.layers.{i}.mlp.shared_experts.{p}": getattr(m, p).detach() for i, m in enumerate(layers)
             for p in PARAMETERS}
    state["model.embed_tokens.weight"] = torch.zeros(3, 6)
    save_file(state, tmp_path / "model.safetensors")
    sink = sink_from_checkpoint(tmp_path, layer=1)
    assert torch.equal(sink.w2, layers[1].down_proj) and sink.dtype == torch.float32
    # sharded: the index says which file holds which tensor
    shard = tmp_path / "sharded"
    shard.mkdir()
    first = {k: v for k, v in state.items() if "gate_proj" in k}
    save_file(first, shard / "part-1.safetensors")
    save_file({k: v for k, v in state.items() if k not in first}, shard / "part-2.safetensors")
    index = {"weight_map": {k: "part-1.safetensors" if k in first else "part-2.safetensors" for k in state}}
    (shard / "model.safetensors.index.json").write_text(json.dumps(index))
    assert torch.equal(sink_from_checkpoint(shard, layer=1).w13, sink.w13)
    with pytest.raises(KeyError, match=r"layer 7's '...layers.7.mlp.shared_experts.gate_proj' \(or "
                                       r"\.shared_w13_weight\) found none: pass prefix=; the layers with shared "
                                       r"experts are \[0, 1\]"):
        sink_from_checkpoint(tmp_path, layer=7)
    with pytest.raises(KeyError, match=r"model.layers.1.mlp.shared_experts \(transformers format\): no up_proj"):
        sink_from_checkpoint(shard / "part-1.safetensors", layer=1)  # one shard holds only gate_proj
    # the multimodal model's names: found without being told
    multimodal = {k.replace("model.layers", "model.language_model.layers"): v for k, v in state.items()}
    save_file(multimodal, tmp_path / "mm.safetensors")
    assert torch.equal(sink_from_checkpoint(tmp_path / "mm.safetensors", layer=1).w13, sink.w13)


def test_a_module_of_wrong_shapes_is_refused_by_name():
    with pytest.raises(ValueError, match=r"down_proj \[2, 4, 6\]; InklingSharedExperts has"):
        sink_from_transformers({"gate_proj": torch.zeros(2, 4, 6), "up_proj": torch.zeros(2, 4, 6),
                                "down_proj": torch.zeros(2, 4, 6)})


# -- PEFT target_parameters exports --------------------------------------------------------

ORDERS = [list(p) for k in (1, 2, 3) for c in itertools.combinations(PARAMETERS, k) for p in itertools.permutations(c)]


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 3), H=st.integers(2, 8), F=st.integers(1, 5), r=st.integers(1, 3),
       targets=st.sampled_from(ORDERS), interleaved=st.booleans(), seed=st.integers(0, 999))
def test_a_peft_target_parameters_export_converts_to_peft_s_own_math(tmp_path_factory, n, H, F, r, targets,
                                                                     interleaved, seed):
    """Any subset of the three parameters, listed in any order: PEFT nests the wrappers in
    the module's parameter order, and the converted pool computes PEFT's merged weights."""
    made = make_peft_sink_adapter(tmp_path_factory.mktemp("peft"), n, H, F, r, lora_alpha=r + 1.5,
                                  targets=tuple(targets), interleaved=interleaved, seed=seed)
    adapter = load_adapter(made.folder)
    assert is_target_parameters_export(adapter) and adapter.target_parameter_keys
    assert any(f.code == "ISL-N204" for f in adapter.findings)
    pool = convert([adapter], n, hidden=H, intermediate=F)
    assert pool.buffers()[0].dtype == D and pool.geometry.outer == n  # lossless: the adapter's float64
    sink = made.base
    sink.set_lora_info(*pool.buffers())
    x, gammas = _inputs(4, H, n, seed)
    batch = SlotBatch.from_token_slots([0] * 4, num_slots=1, lora_ranks=pool.lora_ranks)
    got = sink(x, gammas, batch=batch, backend="reference")
    merged = sink_from_transformers(made.merged, interleaved=interleaved)  # PEFT's W + s*B@A, float64 all through
    assert relative_error(got, merged(x, gammas)) < 1e-9
    with torch.no_grad():
        assert relative_error(got, made.peft_sink(x, gammas)) < 1e-6  # PEFT's forward sums in float32


def test_expert_blocks_are_read_as_paramwrapper_lays_them(tmp_path):
    """A grouped by expert (rows e*r..), B strided by expert (columns e, e+n, ...)."""
    made = make_peft_sink_adapter(tmp_path / "a", n=3, hidden=5, intermediate=4, rank=2, targets=("down_proj",))
    adapter = load_adapter(made.folder)
    (key_a,) = [k for k in adapter.target_parameter_keys if "lora_A" in k]
    raw_b = made.peft_sink.lora_B["default"].weight.detach()
    module = key_a.rsplit(".lora_A", 1)[0]
    for e in range(3):
        assert torch.equal(adapter.weights[f"{module}.{e}.down_proj.lora_A.weight"],
                           made.peft_sink.lora_A["default"].weight.detach()[2 * e:2 * e + 2])
        assert torch.equal(adapter.weights[f"{module}.{e}.down_proj.lora_B.weight"], raw_b[:, e::3])


def test_target_parameter_keys_are_told_apart_by_name(tmp_path):
    made = make_peft_sink_adapter(tmp_path / "a")
    from safetensors import safe_open
    with safe_open(str(made.folder / WEIGHTS_FILE), framework="pt") as f:
        keys = list(f.keys())
    assert peft_target_parameter_keys(keys) == keys and is_target_parameters_export(keys)
    plain = ["base_model.model.model.layers.0.mlp.shared_experts.gate_proj.lora_A.weight"]
    assert not is_target_parameters_export(plain)
    # re-saved by the kit: per-expert names, no longer a target_parameters export
    again = load_adapter(save_adapter(load_adapter(made.folder), tmp_path / "renamed"))
    assert not is_target_parameters_export(again)


def test_an_export_whose_config_lost_its_target_parameters_is_refused(tmp_path):
    made = make_peft_sink_adapter(tmp_path / "a")
    config = json.loads((made.folder / CONFIG_FILE).read_text())
    (made.folder / CONFIG_FILE).write_text(json.dumps({**config, "target_parameters": ["mlp.shared_experts.up_proj"]}))
    with expect_error("ISL-K401", show=False):
        load_adapter(made.folder)
    (made.folder / CONFIG_FILE).write_text(json.dumps({**config, "r": 5}))
    with expect_error("ISL-K402", show=False):
        load_adapter(made.folder)


def test_the_cli_converts_a_float64_peft_export_losslessly(tmp_path):
    from inkling_lab.cli import main
    from inkling_lab.convert import load_pool

    made = make_peft_sink_adapter(tmp_path / "a", n=2, hidden=6, intermediate=4, rank=2, seed=3)
    out = tmp_path / "pool.safetensors"
    assert main(["convert", str(made.folder), "-n", "2", "-o", str(out), "-q"]) == 0
    agreement = peft_agreement(made, load_pool(out))
    assert agreement["vs_peft_merged"] < 1e-9 and agreement["vs_peft_forward"] < 1e-6


def test_the_kit_writes_a_target_parameters_export_as_peft_does(tmp_path):
    """save_adapter(..., target_parameters=True) of what load_adapter read from PEFT's
    file gives PEFT's own tensors back, key for key, bit for bit."""
    from safetensors.torch import load_file

    made = make_peft_sink_adapter(tmp_path / "peft", n=3, hidden=5, intermediate=4, rank=2, seed=7)
    again = save_adapter(load_adapter(made.folder), tmp_path / "kit", target_parameters=True)
    peft, kit = load_file(made.folder / WEIGHTS_FILE), load_file(again / WEIGHTS_FILE)
    assert peft.keys() == kit.keys() and all(torch.equal(peft[k], kit[k]) for k in peft)
    assert json.loads((again / CONFIG_FILE).read_text())["target_parameters"] == \
        [f"mlp.shared_experts.{p}" for p in PARAMETERS]


def test_the_doctor_says_sglang_fails_a_target_parameters_export_and_how_to_serve_it(tmp_path):
    made = make_peft_sink_adapter(tmp_path / "peft_inkling", n=2, hidden=8, intermediate=6, rank=2)
    report = doctor(made.folder, n_shared_experts=2, hidden=8, intermediate=6)
    (skip,) = [f for f in report.findings if f.code == "ISL-W002"]
    assert "6 weight(s) skipped" in skip.message and ".base_layer." in skip.message
    assert "merge_and_unload" in skip.fix and "inkling-lab export" in skip.fix and "zero gate" not in skip.fix
    # the warning is logged, and the buffer load then fails on the first of those weights
    assert report.load.warning == skip.message and report.load.outcome == "raises"
    assert report.load.text.startswith("ValueError: Cannot find target module name for ") and ".base_layer." in \
        report.load.text
    assert report.exit_status == 1 and report.computes.outcome == "nothing"


def test_a_target_parameters_export_fails_the_buffer_load_whatever_the_sinks_flag(tmp_path):
    """Its keys match no target module whatever --lora-target-modules says, so the buffer load
    fails on them, the sink wrapped or not; and no finding advises a flag that would not help."""
    made = make_peft_sink_adapter(tmp_path / "peft_inkling", n=2, hidden=8, intermediate=6, rank=2)
    for targets in (None, ["gate_up_proj", "down_proj"]):
        report = doctor(made.folder, 2, 8, 6, target_modules=targets)
        assert report.computes.outcome == "nothing" and report.error_code == "ISL-E036"
        fixes = " ".join(f.fix for f in report.findings)
        assert "serve with --lora-target-modules" not in fixes and "start the server with every module" not in fixes
        if targets is None:
            (w103,) = [f for f in report.findings if f.code == "ISL-W103"]
            assert "no --lora-target-modules makes sglang 0.5.23 serve it" in w103.fix
