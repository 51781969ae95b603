"""peft_reference: PEFT's delta computed by PEFT itself, and compare's independence from
the kit's reader (a wrong scaling in the kit is caught, because PEFT does not share it)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from inkling_lab.adapters import Adapter, PeftConfig, load_adapter
from inkling_lab.compare import compare
from inkling_lab.peft_reference import PeftRefused, kit_reading, peft_reference
from peers import installed

pytestmark = pytest.mark.skipif(not installed("peft"), reason="peft is not installed in this environment")

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "adapters"
MANIFEST = {m["name"]: m for m in json.loads((SAMPLES / "MANIFEST.json").read_text())}
GOOD = ["gate_up", "fused", "w_names", "alpha_pattern", "rank_pattern", "rslora", "per_expert", "per_expert_fused",
        "gate_only", "up_only", "mixed_outer", "rank8"]


@pytest.mark.parametrize("name", GOOD)
def test_peft_s_own_delta_of_each_sample_is_what_the_kit_reads(name):
    """Classic folders: PEFT, on an nn.Linear stand-in with the adapter's module names,
    merges to the same per-expert deltas the kit reads from the factors."""
    sink = MANIFEST[name]["sink"]
    n, H, F = sink["n_shared_experts"], sink["hidden"], sink["intermediate"]
    ref = peft_reference(SAMPLES / name, n, H, F)
    adapter = load_adapter(SAMPLES / name)
    assert ref.by_peft and "PEFT" in ref.label and sorted(ref.deltas) == sorted(adapter.modules)
    for module in adapter.modules:
        for mine, peft in zip(kit_reading(adapter, module, n), ref.deltas[module]):
            assert mine.shape == peft.shape and peft.dtype == torch.float64
            torch.testing.assert_close(mine, peft, rtol=0, atol=1e-12)


def test_a_target_parameters_export_is_merged_by_peft_on_transformers_module(tmp_path):
    pytest.importorskip("transformers.models.inkling")
    from inkling_lab.transformers_interop import make_peft_sink_adapter, transformers_state

    made = make_peft_sink_adapter(tmp_path / "tp", n=3, hidden=8, intermediate=4, rank=2)
    ref = peft_reference(tmp_path / "tp", 3, 8, 4)
    (module,) = ref.deltas
    base = transformers_state(made.base)
    for got, p in zip(ref.deltas[module], ("gate_proj", "up_proj", "down_proj")):
        torch.testing.assert_close(got, made.merged[p] - base[p], rtol=0, atol=1e-12)


def test_peft_s_own_errors_are_its_refusal(tmp_path):
    with pytest.raises(PeftRefused, match=r"size mismatch for .*down_proj\.lora_B\.weight.*\[16, 4\]"):
        peft_reference(SAMPLES / "hidden16", 2, 8, 6)
    with pytest.raises(PeftRefused, match="expert 2 has no place on a sink of n=2"):
        peft_reference(SAMPLES / "per_expert_three", 2, 8, 6)
    with pytest.raises(PeftRefused, match="lora_bias"):  # PEFT cannot merge a LoRA bias into a bias-free sink
        peft_reference(SAMPLES / "lora_bias", 2, 8, 6)
    with pytest.raises(FileNotFoundError, match="adapter_model.safetensors"):  # never unpickled
        peft_reference(SAMPLES / "bin_only", 2, 8, 6)


def test_without_peft_the_kit_s_reading_is_used_and_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    ref = peft_reference(SAMPLES / "alpha_pattern", 2, 8, 6)
    assert ref.computed_by == "kit" and ref.why == "PEFT is not installed"
    assert "the kit's reading" in ref.label and "PEFT is not installed" in ref.label
    report = compare([SAMPLES / "gate_up"], 2, 8, 6)
    assert "PEFT's math computed by the kit's reading of the config (PEFT is not installed)" in str(report)


def _wrong_scaling(monkeypatch):
    """The kit's reader gets one module's scaling wrong (1.5x for down_proj)."""
    right = PeftConfig.scaling_of
    monkeypatch.setattr(PeftConfig, "scaling_of",
                        lambda self, module: right(self, module) * (1.5 if module.endswith("down_proj") else 1))


def test_compare_catches_a_wrong_scaling_in_the_kit_s_reader(monkeypatch):
    assert compare([SAMPLES / "alpha_pattern"], 2, 8, 6).agree is False  # sglang ignores alpha_pattern
    right = compare([SAMPLES / "gate_up"], 2, 8, 6)
    assert right.agree and "PEFT's math computed by PEFT" in str(right)
    _wrong_scaling(monkeypatch)
    wrong = compare([SAMPLES / "gate_up"], 2, 8, 6)
    bad = [r for r in wrong.rows if r.got == "kit" and not r.close]
    assert bad and not wrong.agree and "kit != peft" in str(wrong)
    assert all(r.cause == "the kit's pool differs from PEFT's math (a bug)" for r in bad)


def test_without_peft_compare_cannot_catch_it_and_says_why(monkeypatch):
    _wrong_scaling(monkeypatch)
    monkeypatch.setitem(sys.modules, "peft", None)
    report = compare([SAMPLES / "gate_up"], 2, 8, 6)
    assert all(r.close for r in report.rows if r.got == "kit")  # the kit agrees with its own mistake ...
    assert "(PEFT is not installed)" in str(report)  # ... and the report says whose math it compared against


def test_compare_uses_peft_where_the_kit_refuses_the_folder():
    report = compare([SAMPLES / "dora"], 2, 8, 6)
    assert report.status["kit"][0].startswith("not computed: the kit refuses it") and report.peft_by[0].startswith("PEFT")


def test_an_adapter_in_memory_is_given_to_peft_as_it_is():
    from inkling_lab.adapters import synthetic_adapter

    adapter = synthetic_adapter(2, 8, 6, 3, naming="fused", lora_alpha=5.0)
    assert isinstance(adapter, Adapter) and not adapter.source
    ref = peft_reference(adapter, 2, 8, 6)
    assert ref.by_peft
    for mine, peft in zip(kit_reading(adapter, adapter.modules[0], 2), ref.deltas[adapter.modules[0]]):
        torch.testing.assert_close(mine, peft, rtol=0, atol=1e-12)
