"""PEFT's own test configurations, replayed on transformers' Inkling as clients of the kit.

Each case restates, in our words, a configuration of a PEFT test (the file and test are
named on each case). For every configuration PEFT accepts on a tiny transformers Inkling
(float64), the kit's converted pool computes PEFT's own merged-weight delta to 1e-9, and
the doctor's sglang verdict is upstream's: a ``target_parameters`` export's keys match no
target module of sglang 0.5.23, whose buffer load warns (ISL-W002) and then fails on the
first of them (ISL-E036). A configuration PEFT refuses on
Inkling leaves nothing for the kit to do.
"""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

from inkling_lab.adapters import load_adapter
from inkling_lab.compare import factor_deltas
from inkling_lab.convert import convert
from inkling_lab.doctor import doctor
from peers import installed

pytestmark = [pytest.mark.skipif(not installed("peft"), reason="peft is not installed in this environment"),
              pytest.mark.skipif(not installed("transformers.models.inkling"),
                                 reason="transformers >= 5.24 (Inkling) is not installed")]

N, H, F = 2, 32, 16
"""transformers' Inkling text tester's sink (tests/models/inkling/test_modeling_inkling.py on
tests/causal_lm_tester.py: hidden 32, moe_intermediate_size 16, the config's 2 shared experts)."""
SINK = "mlp.shared_experts."
ALL = [SINK + p for p in ("gate_proj", "up_proj", "down_proj")]

CASES = {
    # tests/test_target_parameters.py, ALL_CONFIGS: "target down_proj"
    "all_configs/down_proj": dict(target_modules=[], target_parameters=[SINK + "down_proj"]),
    # ALL_CONFIGS: "target gate_up_proj and down_proj, but not on the same module" (layer-qualified keys)
    "all_configs/gate_and_down_on_other_layers": dict(
        target_modules=[], target_parameters=["0." + SINK + "gate_proj", "1." + SINK + "down_proj"]),
    # ALL_CONFIGS: "target down_proj and gate_up_proj on the same module", r=8, lora_alpha=32, bias none
    "all_configs/several_parameters_one_module": dict(r=8, lora_alpha=32, target_modules=None, bias="none",
                                                      target_parameters=ALL),
    # ALL_CONFIGS: "target q_proj, v_proj as modules, and down_proj as parameter"
    "all_configs/modules_and_a_parameter": dict(target_modules=["q_proj", "v_proj"],
                                                target_parameters=[SINK + "down_proj"]),
    # test_rank_pattern_for_moe_target_parameters: r=8 over n experts, the MoE parameter at r // n
    "moe/rank_pattern": dict(r=8, lora_alpha=32, target_modules=["q_proj", "v_proj"], target_parameters=ALL,
                             rank_pattern={"shared_experts.gate_proj": max(1, 8 // N)}),
    # tests/test_initialization.py: the scaling tests (lora_alpha / r), rsLoRA (lora_alpha / sqrt(r))
    "initialization/scaling": dict(r=4, lora_alpha=7, target_modules=[], target_parameters=ALL),
    "initialization/rslora": dict(r=4, lora_alpha=7, use_rslora=True, target_modules=[], target_parameters=ALL),
    # test_initialization.py: rank_pattern and alpha_pattern, PEFT's keys (suffix, layer-qualified, regex)
    "initialization/rank_pattern": dict(r=4, target_modules=[], target_parameters=ALL,
                                        rank_pattern={"0.mlp.shared_experts.up_proj": 2, "down_proj": 6}),
    "initialization/alpha_pattern": dict(r=4, lora_alpha=8, target_modules=[], target_parameters=ALL,
                                         alpha_pattern={"shared_experts.gate_proj": 32,
                                                        r"layers\.1\..*down_proj": 3}),
    # test_initialization.py: rank_alpha_pattern_override (the first matching key wins, for rank and alpha)
    "initialization/rank_alpha_pattern_override": dict(
        r=4, lora_alpha=8, target_modules=[], target_parameters=ALL,
        rank_pattern={"1.mlp.shared_experts.gate_proj": 3, "gate_proj": 5},
        alpha_pattern={"1.mlp.shared_experts.gate_proj": 9, "gate_proj": 2}),
    # test_initialization.py: the bias arguments (the sink has no bias to train)
    "initialization/bias_all": dict(target_modules=[], target_parameters=ALL, bias="all"),
    "initialization/bias_lora_only": dict(target_modules=[], target_parameters=ALL, bias="lora_only"),
    # tests/test_custom_models.py: dropout (the merged weights ignore it), DoRA, lora_bias
    "custom_models/dropout": dict(target_modules=[], target_parameters=ALL, lora_dropout=0.1),
    "custom_models/dora": dict(target_modules=[], target_parameters=ALL, use_dora=True),
    "custom_models/lora_bias": dict(target_modules=[], target_parameters=ALL, lora_bias=True),
}


def _tiny_inkling() -> InklingForCausalLM:
    """The text tester's model (hidden 32, gelu, 2 layers), every layer's MLP sparse so that
    both layers hold a shared sink (the tester's second layer is the sparse one)."""
    from transformers import InklingForCausalLM, InklingTextConfig

    torch.manual_seed(0)
    config = InklingTextConfig(vocab_size=99, hidden_size=H, num_hidden_layers=2, num_attention_heads=2,
                               num_key_value_heads=2, intermediate_size=37, hidden_act="gelu", pad_token_id=0,
                               layer_types=["hybrid_sliding", "hybrid"], mlp_layer_types=["sparse", "sparse"],
                               moe_intermediate_size=F, n_routed_experts=16)
    return InklingForCausalLM(config).double()


@pytest.mark.parametrize("case", sorted(CASES))
def test_peft_s_configurations_on_inkling_convert_to_peft_s_own_merged_weights(case, tmp_path):
    from peft import LoraConfig, get_peft_model

    model = _tiny_inkling()
    base = {k: v.detach().clone() for k, v in model.named_parameters() if "shared_experts" in k}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            peft_model = get_peft_model(model, LoraConfig(init_lora_weights=False, **CASES[case]))
            merged = copy.deepcopy(peft_model).merge_and_unload()
    except (ValueError, TypeError, NotImplementedError, RuntimeError):
        return  # PEFT refuses this configuration on Inkling: nothing for the kit to do
    peft_model.save_pretrained(tmp_path / "adapter")
    after = {k: v.detach() for k, v in merged.named_parameters() if "shared_experts" in k}
    folder = tmp_path / "adapter"
    report = doctor(folder, N, H, F)
    if CASES[case].get("target_modules", ()) is None:  # saved as null: sglang refuses a config without a list
        for targets in (None, ["gate_up_proj", "down_proj"]):  # (lora_manager.py, init_lora_shapes), flag or not
            report = doctor(folder, N, H, F, target_modules=targets)
            assert report.load.outcome == "raises" and "only supports inferring LoRA target" in report.load.text
    elif {"q_proj", "v_proj"} & set(CASES[case]["target_modules"]):
        # q/v_proj become qkv_proj, which sglang's Inkling model has no LoRA for (models/inkling.py,
        # InklingForConditionalGeneration.get_hidden_dim): the server does not start
        assert report.error_code == "ISL-E038" and report.load.outcome == "raises" and \
            "get_hidden_dim not implemented for qkv_proj" in report.load.text, str(report)
    else:
        # the export's keys match no target module: the warning, then the buffer load's ValueError
        assert report.error_code == "ISL-E036" and report.load.warning and report.computes.outcome == "nothing", \
            str(report)
    try:
        adapter = load_adapter(folder)
    except ValueError:
        assert CASES[case].get("use_dora"), "the kit refuses only what a pool cannot hold (DoRA)"
        assert report.kit.outcome == "refuses"
        return
    pool = convert([adapter], N, hidden=H, intermediate=F)
    trained = {k.rsplit(".", 1)[0] for k in base if not torch.equal(after[k], base[k])}
    assert {m.removeprefix("base_model.model.") for m in adapter.modules} == trained
    for module in adapter.modules:
        path = module.removeprefix("base_model.model.")
        mine = factor_deltas(*(b[0] for b in pool.buffers(module)))
        for got, param in zip(mine, ("gate_proj", "up_proj", "down_proj")):
            want = after[f"{path}.{param}"] - base[f"{path}.{param}"]
            torch.testing.assert_close(got, want, rtol=0, atol=1e-9, msg=f"{case}: {path}.{param}")


def test_a_second_adapter_reuses_the_wrapper_and_is_read_from_its_own_folder(tmp_path):
    """tests/test_target_parameters.py, the MoE tests: a second adapter on the same parameters
    goes into the existing ParamWrapper (no deeper nesting), and PEFT saves it in a subfolder
    named after it; the kit reads each at its own folder as PEFT's own math."""
    from peft import LoraConfig, get_peft_model

    model = _tiny_inkling()
    base = {k: v.detach().clone() for k, v in model.named_parameters() if "shared_experts" in k}
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=[], target_parameters=ALL,
                                                  init_lora_weights=False))
    peft_model.add_adapter("other", LoraConfig(r=3, lora_alpha=5, target_modules=[], target_parameters=ALL,
                                               init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "saved")
    for name, folder in (("default", tmp_path / "saved"), ("other", tmp_path / "saved" / "other")):
        peft_model.set_adapter(name)
        merged = copy.deepcopy(peft_model).merge_and_unload(adapter_names=[name])
        after = {k: v.detach() for k, v in merged.named_parameters() if "shared_experts" in k}
        adapter = load_adapter(folder)
        pool = convert([adapter], N, hidden=H, intermediate=F)
        for module in adapter.modules:
            path = module.removeprefix("base_model.model.")
            for got, param in zip(factor_deltas(*(b[0] for b in pool.buffers(module))),
                                  ("gate_proj", "up_proj", "down_proj")):
                torch.testing.assert_close(got, after[f"{path}.{param}"] - base[f"{path}.{param}"], rtol=0,
                                           atol=1e-9)
