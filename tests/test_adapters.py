import hashlib
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inkling_lab.adapters import (CONFIG_FILE, NAMINGS, WEIGHTS_FILE, Adapter, load_adapter, normalize_shared_sink,
                                  save_adapter, synthetic_adapter)
from inkling_lab.errors import expect_error, find_entry

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "adapters"
MANIFEST = json.loads((SAMPLES / "MANIFEST.json").read_text())
M = "m.mlp.shared_experts"


def _key(proj, ab, expert=None):
    return f"{M}{'' if expert is None else f'.{expert}'}.{proj}.lora_{ab}.weight"


@pytest.mark.parametrize("naming", sorted(NAMINGS))
@pytest.mark.parametrize("per_expert", [False, True])
def test_save_then_load_gives_the_same_adapter(tmp_path, naming, per_expert):
    a = synthetic_adapter(2, 8, 6, 3, naming=naming, per_expert=per_expert, layers=(0, 3), lora_alpha=5, seed=7)
    folder = save_adapter(a, tmp_path / "ad")
    b = load_adapter(folder)
    assert b.weights.keys() == a.weights.keys()
    assert all(torch.equal(a.weights[k], b.weights[k]) for k in a.weights)
    assert (b.r, b.lora_alpha, b.target_modules, b.name) == (3, 5.0, a.target_modules, "ad")
    assert b.sha256 == hashlib.sha256((folder / WEIGHTS_FILE).read_bytes()).hexdigest()
    assert load_adapter(folder / CONFIG_FILE).weights.keys() == a.weights.keys()  # the config file names its folder
    assert b.findings == []


def test_flat_factors_normalize_as_the_spec_says():
    r, n, F, H = 2, 3, 4, 5
    g = torch.Generator().manual_seed(0)
    w = {_key("gate_proj", "A"): torch.randn(r, H, generator=g), _key("gate_proj", "B"): torch.randn(n * F, r, generator=g),
         _key("up_proj", "A"): torch.randn(r, H, generator=g), _key("up_proj", "B"): torch.randn(n * F, r, generator=g),
         _key("down_proj", "A"): torch.randn(r, n * F, generator=g), _key("down_proj", "B"): torch.randn(H, r, generator=g),
         "m.self_attn.q_proj.lora_A.weight": torch.ones(1)}
    out = normalize_shared_sink(w, n)
    ga, gb = out[_key("gate_up_proj", "A")], out[_key("gate_up_proj", "B")]
    da, db = out[_key("down_proj", "A")], out[_key("down_proj", "B")]
    assert ga.shape == (1, 2 * r, H) and gb.shape == (n, 2 * F, r) and da.shape == (n, r, F) and db.shape == (1, H, r)
    assert torch.equal(ga[0, :r], w[_key("gate_proj", "A")]) and torch.equal(ga[0, r:], w[_key("up_proj", "A")])
    for e in range(n):
        for f in range(F):
            assert torch.equal(gb[e, f], w[_key("gate_proj", "B")][e * F + f])
            assert torch.equal(gb[e, F + f], w[_key("up_proj", "B")][e * F + f])
            for k in range(r):
                assert da[e, k, f] == w[_key("down_proj", "A")][k, e * F + f]
    assert torch.equal(db[0], w[_key("down_proj", "B")])
    assert out["m.self_attn.q_proj.lora_A.weight"] is w["m.self_attn.q_proj.lora_A.weight"]
    assert _key("gate_proj", "A") not in out and _key("up_proj", "B") not in out


def test_fused_w_names_gate_only_up_only_and_per_expert_normalization():
    r, n, F, H = 2, 2, 3, 4
    fused_a, fused_b = torch.randn(r, H), torch.randn(n * 2 * F, r)
    out = normalize_shared_sink({_key("gate_up_proj", "A"): fused_a, _key("gate_up_proj", "B"): fused_b}, n)
    assert torch.equal(out[_key("gate_up_proj", "A")][0], torch.cat([fused_a, fused_a]))  # one A for both halves
    assert torch.equal(out[_key("gate_up_proj", "B")][1], fused_b[2 * F:])  # per-expert blocks gate_1, up_1

    w1a, w1b, w2a = torch.randn(r, H), torch.randn(n * F, r), torch.randn(r, n * F)
    out = normalize_shared_sink({_key("w1", "A"): w1a, _key("w1", "B"): w1b, _key("w2", "A"): w2a,
                                 _key("w3", "A"): torch.zeros(0)}, n)  # a zero-size up placeholder
    assert set(out) == {_key("gate_up_proj", "A"), _key("gate_up_proj", "B"), _key("down_proj", "A")}
    assert torch.equal(out[_key("gate_up_proj", "A")][0], torch.cat([w1a, torch.zeros(r, H)]))
    assert (out[_key("gate_up_proj", "B")][:, F:] == 0).all()

    up = {_key("up_proj", "A"): torch.randn(r, H), _key("up_proj", "B"): torch.randn(n * F, r)}
    assert set(normalize_shared_sink(up, n)) == {_key("up_proj", "A"), _key("up_proj", "B")}  # left unstacked

    per = {_key("gate_proj", "A", 1): torch.randn(r, H), _key("up_proj", "A", 1): torch.randn(r, H),
           _key("down_proj", "A", 1): torch.randn(r, F)}
    out = normalize_shared_sink(per, n)
    assert out[_key("gate_up_proj", "A", 1)].shape == (2 * r, H)  # stacked, no expert axis added
    assert torch.equal(out[_key("down_proj", "A", 1)], per[_key("down_proj", "A", 1)])


def test_a_flat_factor_that_does_not_split_raises_upstreams_raw_reshape_error():
    with pytest.raises(RuntimeError) as caught:
        normalize_shared_sink({_key("down_proj", "A"): torch.randn(2, 13)}, 3)
    assert str(caught.value) == "shape '[2, 3, 4]' is invalid for input of size 26"
    assert find_entry(caught.value).code == "ISL-E012"
    with pytest.raises(RuntimeError, match=r"shape '\[2, 12, 4\]' is invalid for input of size 100"):
        normalize_shared_sink({_key("gate_up_proj", "B"): torch.randn(25, 4)}, 2)
    assert normalize_shared_sink({_key("down_proj", "A"): torch.randn(0, 13)}, 3)[_key("down_proj", "A")].shape == (3, 0, 4)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 3), H=st.integers(1, 5), F=st.integers(1, 4), r=st.integers(1, 4),
       naming=st.sampled_from(sorted(NAMINGS)), per_expert=st.booleans(), seed=st.integers(0, 99))
def test_factors_have_the_pool_shapes_for_every_layout(n, H, F, r, naming, per_expert, seed):
    f = synthetic_adapter(n, H, F, r, naming=naming, per_expert=per_expert, seed=seed).factors(n)
    (factors,) = f.values()
    O = n if per_expert else 1
    assert [tuple(t.shape) for t in factors.tensors().values()] == [(O, 2 * r, H), (n, 2 * F, r), (n, r, F), (O, H, r)]
    assert factors.scaling == 2.0  # synthetic lora_alpha = 2r


def _broken(name):
    return next(m for m in MANIFEST if m["name"] == name)


@pytest.mark.parametrize("sample", [m for m in MANIFEST if m["kind"] == "broken" and m["code"].startswith("ISL-K")],
                         ids=lambda m: m["name"])
def test_every_broken_sample_raises_its_documented_error(sample):
    with expect_error(sample["code"], show=False) as caught:
        load_adapter(SAMPLES / sample["name"]).factors(sample["sink"]["n_shared_experts"])
    assert sample["name"] in str(caught.exception) or "adapter folder: " in "".join(caught.exception.__notes__)
    assert "/work/" not in str(caught.exception)  # the message names the folder, the note the full path


def test_errors_name_the_file_and_key_and_carry_the_full_path_as_a_note():
    folder = SAMPLES / "typo_name"
    with pytest.raises(ValueError) as caught:
        load_adapter(folder)
    msg = str(caught.value)
    assert re.match(r"typo_name/adapter_model.safetensors: tensor 'base_model.model.model.layers.0.mlp."
                    r"shared_experts.gate_prj.lora_[AB].weight' is under shared_experts", msg)
    assert "did you mean 'gate_proj'?" in msg
    assert caught.value.__notes__ == [f"adapter folder: {folder}"]


def test_a_pickle_checkpoint_is_refused_without_being_opened(tmp_path, monkeypatch):
    folder = save_adapter(synthetic_adapter(2, 8, 6, 2), tmp_path / "old")
    (folder / WEIGHTS_FILE).rename(folder / "adapter_model.bin")
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("a pickle was opened"))
    with expect_error("ISL-K203", show=False) as caught:
        load_adapter(folder)
    assert "found adapter_model.bin: pickle checkpoints are never loaded" in str(caught.exception)


def test_a_transposed_factor_is_repaired_and_reported_or_refused():
    a = synthetic_adapter(2, 8, 6, 4, seed=3)
    key = next(k for k in a.weights if "down_proj.lora_A" in k)
    weights = {**a.weights, key: a.weights[key].T.contiguous()}
    repaired = Adapter.from_state(a.config, weights)
    assert torch.equal(repaired.weights[key], a.weights[key])
    assert [f.code for f in repaired.findings] == ["ISL-K206"] and "transposed [12, 4]" in repaired.findings[0].message
    with expect_error("ISL-K206", show=False):
        Adapter.from_state(a.config, weights, repair=False)


def test_no_repair_when_no_factor_confirms_the_configs_rank():
    # r=8 with H=8: gate A [4, 8] could read as a transposed rank-8 factor, but no factor has rank 8
    a = synthetic_adapter(2, 8, 6, 4, seed=3)
    with pytest.raises(ValueError, match=r"its rank axis \(dim 0\) is 4, but adapter_config.json says r=8; .*no factor has rank 8 "
                       r"\(their rank axes are \[4\]\): fix r in adapter_config.json"):
        Adapter.from_state({**a.config, "r": 8}, a.weights)


def test_an_up_without_a_gate_is_stacked_with_a_zero_gate_and_reported():
    a = synthetic_adapter(2, 8, 6, 4, seed=4)
    up_only = {k: v for k, v in a.weights.items() if ".gate_proj." not in k}
    repaired = Adapter.from_state(a.config, up_only)
    (f,) = repaired.factors(2).values()
    assert (f.gate_up_a[0, :4] == 0).all() and (f.gate_up_b[:, :6] == 0).all()
    assert torch.equal(f.gate_up_a[0, 4:], a.factors(2)[next(iter(a.modules))].gate_up_a[0, 4:])
    assert [x.code for x in repaired.findings] == ["ISL-K211"]
    repaired.factors(2)
    assert len(repaired.findings) == 1  # reported once, however often it is converted
    with expect_error("ISL-K211", show=False):
        Adapter.from_state(a.config, up_only, repair=False).factors(2)


def test_a_partial_adapter_gets_zero_factors_and_a_note():
    a = synthetic_adapter(2, 8, 6, 4, seed=5)
    down_only = Adapter.from_state(a.config, {k: v for k, v in a.weights.items() if ".down_proj." in k})
    (f,) = down_only.factors(2).values()
    assert f.gate_up_a.shape == (1, 8, 8) and f.gate_up_b.shape == (2, 12, 4)
    assert (f.gate_up_a == 0).all() and (f.gate_up_b == 0).all()
    assert [x.code for x in down_only.findings] == ["ISL-N201"]
    pe = synthetic_adapter(2, 8, 6, 4, per_expert=True, seed=5)
    gate_up_only = Adapter.from_state(pe.config, {k: v for k, v in pe.weights.items() if ".down_proj." not in k})
    (f,) = gate_up_only.factors(2).values()
    assert f.down_b.shape == (2, 8, 4) and (f.down_b == 0).all()  # zeros in the per-expert layout, no repair
    assert [x.code for x in gate_up_only.findings] == ["ISL-N201"]


def test_config_checks():
    a = synthetic_adapter(2, 8, 6, 4)
    for config, detail in [({**a.config, "r": 0}, '"r" must be a positive integer, got 0'),
                           ({k: v for k, v in a.config.items() if k != "r"}, 'no "r"'),
                           ({**a.config, "lora_alpha": "8"}, '"lora_alpha" must be a number'),
                           ({**a.config, "peft_type": "IA3"}, "only LoRA adapters"), ([1, 2], "a JSON object")]:
        with pytest.raises(ValueError, match="malformed adapter config: .*" + detail.replace('"', '.')):
            Adapter.from_state(config, a.weights)
    rs = Adapter.from_state({**a.config, "use_rslora": True, "lora_alpha": 8}, a.weights)
    assert rs.scaling == 4.0 and next(iter(rs.factors(2).values())).scaling == 4.0  # alpha / sqrt(r)


def test_the_samples_are_what_the_script_makes(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("make_samples", ROOT / "scripts" / "data" / "make_sample_adapters.py")
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "make_samples", script)  # its dataclass looks itself up there
    spec.loader.exec_module(script)
    manifest = script.write_samples(tmp_path / "adapters")
    assert manifest == MANIFEST
    made = sorted(p.relative_to(tmp_path / "adapters") for p in (tmp_path / "adapters").rglob("*") if p.is_file())
    stored = sorted(p.relative_to(SAMPLES) for p in SAMPLES.rglob("*") if p.is_file())
    assert made == stored
    for rel in made:
        assert (tmp_path / "adapters" / rel).read_bytes() == (SAMPLES / rel).read_bytes(), f"{rel} differs: re-run the script"
    assert script.readme_table(manifest) in (ROOT / "data" / "README.md").read_text()


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 3), H=st.integers(1, 6), F=st.integers(1, 5), r=st.integers(1, 3),
       keep=st.sets(st.sampled_from(["gate_proj", "up_proj", "down_proj"]), min_size=1), seed=st.integers(0, 99))
def test_a_target_parameters_export_reads_back_to_the_same_per_expert_factors(tmp_path_factory, n, H, F, r, keep,
                                                                               seed):
    from inkling_lab.adapters import Adapter, is_target_parameters_export, save_adapter

    ad = synthetic_adapter(n, H, F, r, per_expert=True, seed=seed, layers=(0, 3))
    kept = Adapter.from_state(ad.config, {k: v for k, v in ad.weights.items() if k.split(".")[-3] in keep})
    folder = save_adapter(kept, tmp_path_factory.mktemp("tp"), target_parameters=True)
    back = load_adapter(folder)
    assert is_target_parameters_export(back) and not is_target_parameters_export(kept)
    assert back.weights.keys() == kept.weights.keys()
    assert all(torch.equal(back.weights[k], kept.weights[k]) for k in kept.weights)


def test_only_the_listed_projections_are_reshaped_their_neighbours_stay_as_they_are():
    """docs/reference.md#adapters-on-disk step 1: a router, a gate weight or a bias under
    shared_experts. is left exactly as it is, 2D or not; the sink's factors beside them are
    reshaped (upstream's own test of the name: lora.py, _normalize_shared_expert_moe)."""
    n, r, H, F = 2, 3, 4, 5
    g = torch.Generator().manual_seed(1)
    neighbours = {f"{M}.router.lora_A.weight": torch.randn(r, H, generator=g),
                  f"{M}.gate.lora_B.weight": torch.randn(n * F, r, generator=g),
                  f"{M}.gate.weight": torch.randn(n, H, generator=g),
                  f"{M}.down_proj.lora_B.bias": torch.randn(H, generator=g)}
    factors = {_key("down_proj", "A"): torch.randn(r, n * F, generator=g), _key("down_proj", "B"): torch.randn(H, r)}
    out = normalize_shared_sink({**neighbours, **factors}, n)
    for key, t in neighbours.items():
        assert out[key] is t  # the same tensor: not even viewed
    assert out[_key("down_proj", "A")].shape == (n, r, F) and out[_key("down_proj", "B")].shape == (1, H, r)


@pytest.mark.parametrize("fused_first", [True, False])
def test_a_fused_and_a_split_gate_up_follow_upstream_s_order_and_the_kit_refuses_them(fused_first):
    """docs/reference.md#adapters-on-disk step 3, last paragraph: the result depends on the keys'
    order (selfcheck compares it with the wheel's code); the converter refuses such an adapter
    naming the keys (ISL-K312)."""
    n, r, H, F = 2, 2, 4, 3
    g = torch.Generator().manual_seed(2)
    fused = {_key("gate_up_proj", "A"): torch.randn(r, H, generator=g),
             _key("gate_up_proj", "B"): torch.randn(n * 2 * F, r, generator=g)}
    split = {_key(p, ab): torch.randn(*((r, H) if ab == "A" else (n * F, r)), generator=g)
             for p in ("gate_proj", "up_proj") for ab in "AB"}
    weights = {**fused, **split} if fused_first else {**split, **fused}
    out = normalize_shared_sink(weights, n)
    a = out[_key("gate_up_proj", "A")]
    stacked = torch.cat([split[_key("gate_proj", "A")], split[_key("up_proj", "A")]])
    if fused_first:  # the fused A was repeated, then the split pair's stack wrote over it
        assert torch.equal(a[0], stacked)
    else:  # the split pair's stack wrote over the fused A, and the walk reached that name later: repeated
        assert torch.equal(a[0], stacked.repeat(2, 1))
    config = {"r": r, "lora_alpha": 4, "target_modules": ["gate_proj", "up_proj", "gate_up_proj", "down_proj"]}
    with pytest.raises(ValueError) as caught:
        Adapter.from_state(config, {**weights, _key("down_proj", "A"): torch.randn(r, n * F),
                                    _key("down_proj", "B"): torch.randn(H, r)})
    text = str(caught.value)
    assert find_entry(caught.value).code == "ISL-K312"
    assert all(k in text for k in weights) and "depends on the keys' order" in text
