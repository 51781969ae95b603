"""Normalization of an adapter's shared-sink factors: stacking gate and up,
splitting flat factors per expert, per-expert names; refusals and notes."""
from __future__ import annotations

from ._snippets import ADAPTER
from .entry import EVERY_RELEASE, KIT, KIT_NOTE, CatalogEntry, Repair

_NORMALIZE = "sglang/srt/lora/lora.py: LoRAAdapter._normalize_shared_expert_moe"
_STACK = "sglang/srt/lora/lora.py: LoRAAdapter.normalize_gate_up_proj"
_PER_EXPERT = "per_expert = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4, per_expert=True)\n"
_UP_ONLY = "up_only = {k: v for k, v in ad.weights.items() if '.gate_proj.' not in k}\n"

ENTRIES: list[CatalogEntry] = [
    CatalogEntry(
        code="ISL-K210", title="per-expert factors that do not cover the sink's experts", exc_type=ValueError,
        message="{file}: per-expert factor {factor} is given {problem}",
        meaning="Per-expert named factors (shared_experts.<e>.<proj>...) give one factor per expert; the "
                "pool needs exactly experts 0..n-1, and one form per factor (not also a shared one).",
        when="An adapter exported for a model with another number of shared experts, or a lost expert.",
        setup="from inkling_lab.adapters import synthetic_adapter\n" + _PER_EXPERT,
        trigger="per_expert.factors(3)  # exported for 2 experts\n",
        fix="per_expert.factors(2)\n",
        remedy="Use the adapter with the model it was exported for (its n_shared_experts), or export every "
               "expert 0..n-1 of every per-expert factor, and each factor in one form only.",
        doctor_fix="check --n-shared-experts against the experts the factors are saved for",
        upstream=f"{_NORMALIZE} leaves per-expert names (shared_experts.<e>.) as they are and the pool "
                 "load places them expert by expert (sglang/srt/lora/mem_pool.py: LoRAMemoryPool."
                 "load_lora_weight_to_buffer); nothing there compares the expert ids with 0..n-1.",
        generation=KIT, adapter_caused=True, related=("ISL-E004", "ISL-E012"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K211", title="an up_proj without its gate_proj", exc_type=ValueError,
        message="{file}: {module}: up_proj has no gate_proj, so upstream leaves it unstacked and never "
                "applies it; {advice}",
        meaning="Upstream's normalization stacks gate and up into gate_up_proj; a gate alone gets a zero up, "
                "but an up alone stays unstacked and never reaches the pool: sglang serves the base model for "
                "it, silently. The converter stacks it with a zero gate (exact) and reports it; repair=False "
                "refuses.",
        when="Training only up_proj of the shared experts.",
        setup=ADAPTER + _UP_ONLY,
        trigger="Adapter.from_state(ad.config, up_only, repair=False).factors(2)\n",
        fix="repaired = Adapter.from_state(ad.config, up_only)  # repair=True\n"
            "repaired.factors(2)\nprint(repaired.findings[-1].code, 'stacked with a zero gate')\n",
        remedy="Convert it with inkling-lab convert (it stacks a zero gate, exactly), or export gate_proj "
               "too (zeros if only up was trained).",
        upstream=f"{_STACK} stacks only from a gate_proj name (a missing up becomes zeros) and keeps an "
                 "orphan up_proj as it is; the server's target modules name it gate_up_proj "
                 "(sglang/srt/lora/utils.py: get_normalized_target_modules), so the pool load names the "
                 "orphan in ISL-W002's warning and then fails on it (ISL-E036).",
        repaired=Repair("{module}: up_proj has no gate_proj; stacked with a zero gate",
                        "none needed: the converter stacks it; export gate_proj too to silence this",
                        "sglang leaves it unstacked, names it in its skip warning (ISL-W002) and then fails its "
                        "buffer load on it (ISL-E036)"),
        generation=KIT, adapter_caused=True, related=("ISL-K212", "ISL-N203"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K212", title="one outer factor per expert, the other shared", exc_type=ValueError,
        message="{file}: {module}: {per_expert} is given per expert but {shared} is shared; both outer factors "
                "must use one layout: {advice}",
        meaning="A pool slot has one outer layout (O = 1 or n) for gate-up A and down B together. When one "
                "of them is per expert and the other shared, giving the shared one to every expert is exact: "
                "the converter does that and reports it; repair=False refuses.",
        when="A per-expert export that kept down B (or gate/up A) shared.",
        setup=ADAPTER + _PER_EXPERT
              + "mixed = {k: v for k, v in per_expert.weights.items() if 'down_proj' not in k}\n"
                "mixed.update({k: v for k, v in ad.weights.items() if 'down_proj' in k})\n",
        trigger="Adapter.from_state(ad.config, mixed, repair=False).factors(2)\n",
        fix="repaired = Adapter.from_state(ad.config, mixed)  # repair=True\n"
            "print(next(iter(repaired.factors(2).values())).down_b.shape)  # down B for each of the 2 experts\n",
        remedy="Convert it with inkling-lab convert (it gives every expert the shared factor, exactly), or "
               "name the shared factor per expert too.",
        upstream="sglang decides the pool's outer layout from gate-up A alone (sglang/srt/lora/"
                 "lora_manager.py: LoRAManager._detect_shared_outer_loras); with a shared gate-up A and a "
                 "per-expert down B the pool load then raises ISL-E015's message for down_proj_moe lora_B.",
        repaired=Repair("{module}: {per_expert} is per expert but {shared} is shared; the shared one now serves "
                        "each of the {n} experts (exact)",
                        "none needed: the converter expands {shared}; name it per expert to silence this"),
        generation=KIT, adapter_caused=True, related=("ISL-E003", "ISL-E015", "ISL-K211"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K214", title="factors of one projection with different shapes", exc_type=ValueError,
        message="{file}: {key} is {shape} but {other} is {other_shape}: the factors of one projection must "
                "have one shape (gate and up alike, every expert alike); re-export the adapter",
        meaning="Normalization stacks gate and up (their A along the rank axis, their B along the feature "
                "axis) and stacks per-expert factors along the expert axis: they must have one shape. "
                "The kit names the two tensors that differ.",
        when="Gate and up exported with different ranks or for different F, or one expert's factor cut short.",
        setup="from inkling_lab.adapters import Adapter, synthetic_adapter\n"
              "ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4)  # flat factors, PEFT names\n"
              "up_b = 'base_model.model.model.layers.0.mlp.shared_experts.up_proj.lora_B.weight'  # [n*F, r]\n",
        trigger="Adapter.from_state(ad.config, {**ad.weights, up_b: ad.weights[up_b][:10]})  # F=5 for up\n",
        fix="Adapter.from_state(ad.config, ad.weights)  # gate B and up B both [12, 4]\n",
        remedy="Re-export the adapter so that gate and up (and every expert) have one rank and one F; the "
               "message names the two tensors that differ.",
        doctor_fix="re-export the adapter with one shape per projection (gate and up alike, every expert alike)",
        upstream=f"{_STACK} joins gate and up with torch.cat along the rank axis (A) or the feature axis "
                 "(B): factors whose other axis differs fail there with torch's 'Sizes of tensors must match' "
                 "RuntimeError; factors that differ only along the joined axis are joined into a factor of "
                 "the wrong size, which the pool load refuses with ISL-E016's assertion.",
        generation=KIT, adapter_caused=True, related=("ISL-K205", "ISL-E012"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-N201", title="the adapter trains only part of the sink", exc_type=None, kind="note",
        message="{module}: the adapter has no {missing} factors; they are zero in the pool",
        meaning="The adapter has gate/up factors but no down factors, or the reverse. In the pool the "
                "missing factors are zero, which adds no delta for them. sglang 0.5.23 wraps the shared sink "
                "only when the server's target modules hold both gate_up_proj and down_proj: served with "
                "the adapter's own target modules, such an adapter's sink factors are loaded and never "
                "applied (the sink serves the base model).",
        when="An adapter trained with only gate_proj/up_proj (or only down_proj) of the shared experts in "
             "target_modules.",
        setup=ADAPTER + "gate_up_only = {k: v for k, v in ad.weights.items() if 'down_proj' not in k}\n",
        trigger="partial = Adapter.from_state(ad.config, gate_up_only)\npartial.factors(2)\npartial.findings\n",
        fix="whole = Adapter.from_state(ad.config, ad.weights)\nwhole.factors(2)\nwhole.findings\n",
        remedy="Serve it with --lora-target-modules naming both gate_up_proj and down_proj (so that sglang "
               "wraps the sink), or retrain with both in target_modules; inkling-lab doctor says which.",
        upstream="sglang/srt/lora/lora_manager.py: LoRAManager.init_lora_modules calls the shared sink's "
                 "initialize_lora only when the server's target modules (after renaming gate_proj/up_proj/w1/w3 "
                 "to gate_up_proj and w2 to down_proj) contain both gate_up_proj and down_proj.",
        generation=KIT_NOTE, adapter_caused=True, related=("ISL-N203",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-N202", title="tensors for other modules are left out of the sink's pool", exc_type=None,
        kind="note",
        message="{count} tensor(s) for other modules are not part of the shared sink and are left out of its pool",
        meaning="The adapter also trains modules other than the shared sink (attention, routed experts). "
                "The sink's pool holds only the sink's factors; the others are served by their own LoRA "
                "modules.",
        when="Any adapter that trains more than the shared experts.",
        setup=ADAPTER + "extra = {**ad.weights, 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight': "
              "torch.zeros(4, 8)}\n",
        trigger="Adapter.from_state(ad.config, extra).findings\n",
        fix="Adapter.from_state(ad.config, ad.weights).findings  # the sink's factors only\n",
        remedy="Nothing to do for the sink; make sure the server's --lora-target-modules covers the other "
               "modules too (else sglang's buffer load fails on them: ISL-W002, ISL-E036).",
        upstream="sglang loads each module's factors into that module's own buffers "
                 "(sglang/srt/lora/mem_pool.py: LoRAMemoryPool.load_lora_weight_to_buffer).",
        generation=KIT_NOTE, related=("ISL-W002",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-N203", title="a gate without an up gets a zero up", exc_type=None, kind="note",
        message="{key} has no up_proj: its up half is zero",
        meaning="gate_proj and up_proj are stacked into gate_up_proj; when the up factors are missing their "
                "half is zero, as upstream does.",
        when="Training only gate_proj of the shared experts.",
        setup=ADAPTER + "gate_only = {k: v for k, v in ad.weights.items() if '.up_proj.' not in k}\n",
        trigger="a = Adapter.from_state(ad.config, gate_only)\na.factors(2)\na.findings\n",
        fix="a = Adapter.from_state(ad.config, ad.weights)\na.factors(2)\na.findings\n",
        remedy="Nothing to do: the zero up half is what the adapter means.",
        upstream=f"{_STACK} fills the missing up half with zeros, as the kit does.",
        generation=KIT_NOTE, related=("ISL-K211",), releases=EVERY_RELEASE),
]
