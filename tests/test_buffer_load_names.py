"""The buffer load's names (``sglang_path.check_buffer_names`` and the path around it): weights
that match no target module are warned about (ISL-W002) and then fail
``load_lora_weight_to_buffer``'s per-layer loop (ISL-E036, every release); 0.5.23 refuses an
indexed shared-expert weight on a layer whose sink is not wrapped (ISL-E037). ``selfcheck``'s
``loading`` area checks the same against each wheel's own function (test_selfcheck.py)."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inkling_lab import explain
from inkling_lab.adapters import Adapter, save_adapter, synthetic_adapter
from inkling_lab.catalog import CATALOG, RELEASES
from inkling_lab.doctor import doctor
from inkling_lab.export import export_for_sglang
from inkling_lab.releases import raised_line
from inkling_lab.sglang_path import (SORTED_NOTE, check_buffer_names, run_sglang, server_target_modules,
                                     skipped_weights, target_module_of, targets_text)

ROOT = Path(__file__).resolve().parents[1]
SINK = ("gate_up_proj", "down_proj")
L = "model.layers.{}.mlp.shared_experts."
T3, T2 = torch.zeros(1, 1, 1), torch.zeros(1, 1)


def names(layer: int, *parts: str, dims: int = 3) -> dict[str, torch.Tensor]:
    return {L.format(layer) + p: (T3 if dims == 3 else T2) for p in parts}


def saved(tmp_path, weights, **config) -> Path:
    ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4)
    config = {**ad.config, **config}
    return save_adapter(Adapter(ad.name, config["r"], config["lora_alpha"], config["target_modules"], weights, config),
                        tmp_path / "adapter")


# -- the name checks, case by case --------------------------------------------------------------------

def test_the_first_unmatched_name_of_the_lowest_layer_in_the_layers_own_order_fails():
    layers = {0: names(0, "gate_up_proj.lora_A.weight", "down_proj.lora_A.weight"),
              1: names(1, "up_proj.lora_B.weight", "up_proj.lora_A.weight"),  # B first: the layer's own order
              2: names(2, "base_layer.lora_A.weight")}
    check = check_buffer_names(layers, [], set(SINK), wrapped=True)
    assert check.code == "ISL-E036" and check.layer == 1 and check.name == L.format(1) + "up_proj.lora_B.weight"
    assert check.text == ("ValueError: Cannot find target module name for model.layers.1.mlp.shared_experts."
                          "up_proj.lora_B.weight in {'down_proj', 'gate_up_proj'}")


@pytest.mark.parametrize("wrapped", [True, False])
def test_a_skipped_weight_fails_whether_the_sink_is_wrapped_or_not(wrapped):
    targets = set(SINK) if wrapped else {"gate_up_proj"}
    check = check_buffer_names({0: names(0, "gate_up_proj.lora_A.weight", "router.lora_A.weight", dims=3)}, [],
                               targets, wrapped)
    assert check.code == "ISL-E036" and check.name.endswith("router.lora_A.weight")


def test_every_sink_weight_skipped_fails_on_the_first_of_them():
    layers = {0: names(0, "base_layer.lora_A.weight", "base_layer.lora_B.weight", "lora_A.weight", dims=2)}
    check = check_buffer_names(layers, [], set(), wrapped=False)
    assert check.name == L.format(0) + "base_layer.lora_A.weight" and check.text.endswith(" in set()")


def test_embedding_weights_are_checked_after_every_layer():
    embedding = ["model.embed_tokens.lora_embedding_A", "lm_head.lora_B.weight"]
    check = check_buffer_names({0: names(0, "gate_up_proj.lora_A.weight")}, embedding, set(SINK), True)
    assert check.code == "ISL-E036" and check.layer is None and check.name == embedding[0]
    later = check_buffer_names({0: names(0, "up_proj.lora_A.weight")}, embedding, set(SINK), True)
    assert later.layer == 0  # a layer's error comes first
    matched_first = check_buffer_names({}, embedding, {"embed_tokens", *SINK}, True)
    assert not matched_first.text and "does not model loading embed_tokens" in matched_first.unknown


@pytest.mark.parametrize("version", RELEASES)
def test_an_indexed_shared_expert_weight_on_an_unwrapped_sink(version):
    layer = {0: {**names(0, "0.gate_up_proj.lora_A.weight", "1.gate_up_proj.lora_B.weight", dims=2)}}
    check = check_buffer_names(layer, [], {"gate_up_proj"}, wrapped=False, sglang=version)
    if version == "0.5.23":
        assert check.code == "ISL-E037" and check.text == (
            "ValueError: Cannot load LoRA weight 'model.layers.0.mlp.shared_experts.0.gate_up_proj.lora_A.weight': "
            "layer 0 has no matching target for indexed shared-expert weights.")
    else:  # filed with the routed experts, which are not wrapped either: no error
        assert check.text == "" and not check.unknown
    wrapped = check_buffer_names(layer, [], set(SINK), wrapped=True, sglang=version)
    assert wrapped.text == ""  # the sink's own branch takes it


def test_in_one_layer_the_earlier_name_wins_between_the_two_errors():
    skipped_first = {0: {L.format(0) + "0.down_proj.lora_A.weight": T2, L.format(0) + "0.gate_up_proj.lora_A.weight": T2}}
    assert check_buffer_names(skipped_first, [], {"gate_up_proj"}, False).code == "ISL-E036"
    indexed_first = {0: dict(reversed(skipped_first[0].items()))}
    assert check_buffer_names(indexed_first, [], {"gate_up_proj"}, False).code == "ISL-E037"
    assert check_buffer_names(indexed_first, [], {"gate_up_proj"}, False, sglang="0.5.22").code == "ISL-E036"


def test_a_buffer_the_pool_does_not_have_is_a_key_error():
    shared_3d = check_buffer_names({0: names(0, "0.down_proj.lora_B.weight", dims=3)}, [], {"down_proj"}, False)
    assert shared_3d.text == "KeyError: 'down_proj_shared_moe'"
    routed = check_buffer_names({0: {"model.layers.0.mlp.experts.0.w1.lora_A.weight": T2}}, [], {"w1"}, False)
    assert routed.text == "KeyError: 'w1_moe'"


@settings(max_examples=30, deadline=None)
@given(targets=st.sets(st.sampled_from(["gate_up_proj", "down_proj", "qkv_proj", "up_proj", "o_proj"]), max_size=4),
       name=st.sampled_from(["x.shared_experts.gate_up_proj.lora_A.weight", "x.self_attn.qkv_proj.lora_B.weight",
                             "x.shared_experts.up_proj.lora_A.weight", "x.o_proj.lora_A.weight"]))
def test_get_target_module_name_is_the_longest_target_in_the_name(targets, name):
    best = target_module_of(name, targets)
    held = [t for t in targets if t in name]
    assert (best is None) == (not held) and (best is None or len(best) == max(map(len, held)))
    assert skipped_weights([name], targets) == ([] if held else [name])


def test_the_target_set_prints_sorted_whatever_the_hash_seed():
    names = "{'qkv_proj', 'down_proj', 'gate_up_proj', 'o_proj'}"
    code = ("from inkling_lab.sglang_path import check_buffer_names; import torch; "
            f"print(list({names})); print(check_buffer_names({{0: {{'layers.0.x.lora_A.weight': torch.zeros(1, 1)}}}}, "
            f"[], {names}, True).text)")
    want = ("ValueError: Cannot find target module name for layers.0.x.lora_A.weight in "
            "{'down_proj', 'gate_up_proj', 'o_proj', 'qkv_proj'}\n")
    here = check_buffer_names({0: {"layers.0.x.lora_A.weight": torch.zeros(1, 1)}}, [], ast.literal_eval(names), True).text
    runs = {str(list(ast.literal_eval(names))): here + "\n"}  # this process's hash seed, and its order of the set
    # Seeds 0 and 2 iterate these four names in different orders (seed 1 orders them as 0
    # does): a process of the first whose order this one has not shown yet (each launch is
    # a torch import), so the text is seen under at least two orders.
    for seed in ("0", "2"):
        order, text = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                     env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)},
                                     ).stdout.split("\n", 1)
        runs[order] = text
        if len(runs) > 1:
            break
    assert len(runs) == 2 and set(runs.values()) == {want}, runs
    assert targets_text({"b", "a"}) == "{'a', 'b'}" and targets_text(set()) == "set()"


# -- the path and the doctor ----------------------------------------------------------------------------

def test_the_doctor_quotes_the_warning_then_the_raise_and_says_the_set_is_sorted(tmp_path):
    ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4)
    report = doctor(saved(tmp_path, {k: v for k, v in ad.weights.items() if ".gate_proj." not in k}), 2, 8, 6)
    assert report.load.outcome == "raises" and report.load.stage == "pool" and report.error_code == "ISL-E036"
    assert report.load.warning.startswith("LoRA adapter '<lora id>': 2 weight(s) skipped") and \
        report.load.note == SORTED_NOTE
    text = str(report)
    assert text.index(report.load.warning) < text.index(report.load.text) < text.index(SORTED_NOTE)
    assert report.computes.outcome == "nothing" and "fails to load it" in text


def test_a_shape_error_of_an_earlier_layer_comes_before_a_name_error_of_a_later_one(tmp_path):
    ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4, layers=(0, 1))
    key = "base_model.model.model.layers.{}.mlp.shared_experts.down_proj.lora_B.weight"
    weights = {**ad.weights, key.format(0): torch.zeros(8, 3)}  # layer 0: rank 3 against r=4
    weights = {k: v for k, v in weights.items() if not ("layers.1." in k and ".gate_proj." in k)}  # layer 1: lone up
    assert "AssertionError" in doctor(saved(tmp_path / "a", weights), 2, 8, 6).load.text
    swapped = {**ad.weights, key.format(1): torch.zeros(8, 3)}
    swapped = {k: v for k, v in swapped.items() if not ("layers.0." in k and ".gate_proj." in k)}
    assert doctor(saved(tmp_path / "b", swapped), 2, 8, 6).error_code == "ISL-E036"


def test_layers_are_walked_from_zero_not_in_the_files_sorted_order(tmp_path):
    ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4, layers=(2, 10))
    weights = {k: v for k, v in ad.weights.items() if ".gate_proj." not in k}  # both layers: a lone up
    path = run_sglang(saved(tmp_path, weights), 2, 8, 6)
    assert "layers.2." in path.raised.text  # 'layers.10.' sorts first in the file, layer 2 is loaded first


@pytest.mark.parametrize("version", ["0.5.22", "0.5.23"])
def test_a_per_expert_gate_up_adapter_on_a_server_without_down_proj(tmp_path, version):
    per = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4, per_expert=True)
    folder = saved(tmp_path, {k: v for k, v in per.weights.items() if ".down_proj." not in k},
                   target_modules=["gate_proj", "up_proj"])
    report = doctor(folder, 2, 8, 6, sglang=version)
    codes = [f.code for f in report.findings]
    assert "ISL-W103" in codes
    if version == "0.5.23":
        assert report.error_code == "ISL-E037" and report.load.stage == "pool" and not report.load.warning
    else:
        assert report.load.outcome == "loads" and report.computes.outcome == "base"


def test_explain_knows_both_messages_and_their_releases():
    e036 = ("ValueError: Cannot find target module name for model.layers.0.mlp.shared_experts.base_layer.lora_A."
            "weight in {'gate_up_proj', 'down_proj'}")
    e037 = ("ValueError: Cannot load LoRA weight 'model.layers.3.mlp.shared_experts.1.down_proj.lora_A.weight': "
            "layer 3 has no matching target for indexed shared-expert weights.")
    assert explain(e036).code == "ISL-E036" and CATALOG["ISL-E036"].releases == RELEASES
    assert explain(e037).code == "ISL-E037" and CATALOG["ISL-E037"].releases == ("0.5.23",)
    assert raised_line(CATALOG["ISL-E037"], "0.5.22").startswith("sglang 0.5.22 does not raise this")
    assert raised_line(CATALOG["ISL-E036"], "0.5.16").startswith("sglang 0.5.16 raises this")


# -- the cures stay cures ---------------------------------------------------------------------------------

def export_names(folder: Path) -> tuple[list[str], set[str]]:
    """An export's weight names as sglang's buffer load checks them (normalized layer by
    layer) and the target modules its config gives the server."""
    import json

    from safetensors.torch import load_file

    from inkling_lab.adapters import normalize_layer
    from inkling_lab.sglang_path import layer_id

    weights = load_file(folder / "adapter_model.safetensors")
    layers: dict[int, dict] = {}
    for k, t in weights.items():
        layers.setdefault(layer_id(k), {})[k] = t
    r = json.loads((folder / "adapter_config.json").read_text())["r"]
    names = [k for lid in sorted(layers) for k in normalize_layer(layers[lid], 2, r)]
    config = json.loads((folder / "adapter_config.json").read_text())
    return names, server_target_modules(config["target_modules"])


EXPORTED = ["gate_up", "per_expert", "up_only", "w_names", "fused", "mixed_outer"]


@pytest.mark.parametrize("name", EXPORTED)
def test_an_export_has_no_weight_its_own_target_modules_miss(tmp_path, name):
    report = export_for_sglang(ROOT / "data" / "adapters" / name, tmp_path / "out", 2)
    assert report.written, report
    names, targets = export_names(tmp_path / "out")
    assert skipped_weights(names, targets) == [] and set(SINK) <= targets
    path = run_sglang(tmp_path / "out", 2, 8, 6)
    assert path.raised is None and not path.skip_warning and not path.unknown and path.wrapped


@pytest.mark.parametrize("targets", [["all"], None])
def test_all_resolves_to_module_names_the_kit_does_not_read(tmp_path, targets):
    """'all' (the flag, or the adapter's own 'all-linear') resolves to the base model's own module
    names: a sink weight holding gate_up_proj or down_proj matches, any other weight the kit
    cannot judge, and says so rather than that it is served."""
    ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4)
    plain = doctor(saved(tmp_path / "a", ad.weights, target_modules="all-linear"), 2, 8, 6, target_modules=targets,
                   measure=False)
    assert plain.ok
    lone_up = {k: v for k, v in ad.weights.items() if ".gate_proj." not in k}
    report = doctor(saved(tmp_path / "b", lone_up, target_modules="all-linear"), 2, 8, 6, target_modules=targets,
                    measure=False)
    assert report.load.outcome == "unknown" and "auto_detect_lora_target_modules" in report.load.why
    assert "up_proj.lora_A.weight" in report.load.why and report.computes.outcome == "unknown"


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "data" / "adapters").iterdir() if p.is_dir()))
def test_every_target_modules_flag_the_doctor_advises_does_what_it_says(name):
    """Where a fix names a --lora-target-modules list (ISL-W103, W002, E036, E037, E038), the doctor on
    that server finds the sink wrapped, no weight its targets miss and a server that starts (no ISL-E034,
    no ISL-E038)."""
    import json
    import re

    manifest = {m["name"]: m for m in json.loads((ROOT / "data" / "adapters" / "MANIFEST.json").read_text())}
    sink = manifest.get(name, {}).get("sink") or {"n_shared_experts": 2, "hidden": 8, "intermediate": 6}
    args = (sink["n_shared_experts"], sink["hidden"], sink["intermediate"])
    report = doctor(ROOT / "data" / "adapters" / name, *args, measure=False)
    flags = {m.group(1) for f in report.findings
             for m in re.finditer(r"--lora-target-modules ((?:[a-z_0-9]+ ?)+)", f.fix)
             if f.code in ("ISL-W103", "ISL-W002", "ISL-E036", "ISL-E037", "ISL-E038")}
    assert flags or name != "one_sided"  # cured by a flag (w_names is not: its w1 has no buffer, ISL-E038)
    assert not flags or name != "w_names"
    for flag in flags:
        served = doctor(ROOT / "data" / "adapters" / name, *args, target_modules=flag.split(),
                        measure=False)
        codes = {f.code for f in served.findings}
        assert not codes & {"ISL-W103", "ISL-W002", "ISL-E036", "ISL-E037", "ISL-E034", "ISL-E038"}, (flag, str(served))


@pytest.mark.parametrize("targets, fails", [(["gate_proj", "up_proj", "down_proj", "wq_du", "wk_dv", "wv_dv", "wr_du"],
                                             True), (["gate_proj", "up_proj", "down_proj", "qkvr"], False)])
def test_inkling_attention_is_stacked_into_qkvr_before_the_names_are_checked(tmp_path, targets, fails):
    """normalize_inkling_qkvr_proj (lora.py) stacks wq_du, wk_dv, wv_dv and wr_du into qkvr: with
    their PEFT names as targets the server does not start (Inkling's get_hidden_dim has no buffer for
    them, ISL-E038); with qkvr it loads."""
    ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4)
    attention = {f"base_model.model.model.layers.0.self_attn.{p}.lora_{ab}.weight": torch.randn(4, 8) if ab == "A"
                 else torch.randn(8, 4) for p in ("wq_du", "wk_dv", "wv_dv", "wr_du") for ab in "AB"}
    report = doctor(saved(tmp_path, {**ad.weights, **attention}, target_modules=targets), 2, 8, 6, measure=False)
    if fails:
        assert report.error_code == "ISL-E038" and report.load.text == (
            "NotImplementedError: get_hidden_dim not implemented for wk_dv")  # the first sorted
    else:
        assert report.ok, str(report)
