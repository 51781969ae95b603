"""Errors of ``set_lora_info``, first wrapper generation: its five checks and the
raw torch errors of the derived-operand step that follows them."""
from __future__ import annotations

from ._snippets import BUFFERS, POOL, SINK
from .entry import EVERY_RELEASE, INKLING_LORA, V1, CatalogEntry

_SET = f"{INKLING_LORA}: InklingBatchDenseMLPWithLoRA.set_lora_info"
_POOL2 = "pool = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=2, max_rank=4)\n"

ENTRIES: list[CatalogEntry] = [
    CatalogEntry(
        code="ISL-E001", title="a pool buffer is not 4D", exc_type=ValueError,
        message="Inkling shared-sink LoRA requires four 4D MoE buffers",
        meaning="set_lora_info takes exactly four buffers, each with four axes: gate-up A "
                "[S, O, 2R, H], gate-up B [S, n, 2F, R], down A [S, n, R, F], down B [S, O, H, R]. "
                "At least one has fewer or more axes: usually the slot axis or the expert axis is missing.",
        when="Handing one adapter's factors (3D, no slot axis) or PEFT's flat 2D matrices straight to "
             "set_lora_info, or a dense (non-MoE) LoRA buffer.",
        setup=SINK + POOL + BUFFERS,
        trigger="sink.set_lora_info(ga[0], gb, da, db)  # ga[0] has lost the slot axis\n",
        fix="sink.set_lora_info(ga, gb, da, db)      # all four keep [S, ...]\n",
        remedy="Give set_lora_info the pool's own four buffers, each [S, ...]; il.diagnose_pool on the same "
               "tensors names the buffer and the reshape that gives it four axes.",
        upstream=f"{_SET}: its first check, `any(weight.ndim != 4 ...)`.",
        diagnosis="{name} is {ndim}D {shape}; the pool needs 4D {symbol}",
        generation=V1, adapter_caused=True, related=("ISL-E006", "ISL-E021"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-E002", title="an outer factor's expert dimension is neither 1 nor n", exc_type=ValueError,
        message="Inkling shared-sink LoRA outer factors must have expert dimension 1 or {n}",
        meaning="The outer factors (gate-up A and down B) are shared by all experts (dim 1 = 1) or "
                "given per expert (dim 1 = n). Any other count cannot be mapped onto the sink's experts.",
        when="An adapter exported for a model with another number of shared experts, or routed-expert "
             "factors (many experts) sent to the shared sink.",
        setup=SINK,
        trigger="pool = il.LoRAPool(n=3, hidden=8, intermediate=6, slots=2, max_rank=4, outer=3)\n"
                "sink.set_lora_info(*pool.buffers())  # built for 3 experts; the sink has 2\n",
        fix="pool = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=2, max_rank=4, outer=2)\n"
            "sink.set_lora_info(*pool.buffers())\n",
        remedy="Build the pool for the model's n_shared_experts (the n in the message); an adapter exported "
               "for another n belongs to another model.",
        upstream=f"{_SET}: second check, gate-up A's and down B's dim 1 against (1, n_shared_experts).",
        diagnosis="{name} has outer expert dimension {k}; it must be 1 (shared) or n={n}",
        generation=V1, adapter_caused=True, related=("ISL-E003", "ISL-E004"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-E003", title="gate-up A and down B use different outer layouts", exc_type=ValueError,
        message="Inkling shared-sink gate-up A and down B must use the same expert layout",
        meaning="One outer factor is shared (dim 1 = 1) and the other per expert (dim 1 = n). The pool "
                "has one layout for both.",
        when="Mixing buffers from a shared-outer and a per-expert-outer export, or expanding only one "
             "factor by hand.",
        setup=SINK + "pool = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=2, max_rank=4, outer=1)\n" + BUFFERS,
        trigger="sink.set_lora_info(ga.expand(-1, 2, -1, -1), gb, da, db)  # only A made per expert\n",
        fix="sink.set_lora_info(ga.expand(-1, 2, -1, -1), gb, da, db.expand(-1, 2, -1, -1))  # both, exactly\n",
        remedy="Give both outer factors one layout: expand the shared one to every expert (exact), or keep "
               "both shared.",
        upstream=f"{_SET}: third check, gate-up A's dim 1 against down B's.",
        diagnosis="gate-up A has outer dimension {gate_up_a} but down B has {down_b}: both outer factors must be "
                  "shared (1) or both per expert (n)",
        generation=V1, adapter_caused=True, related=("ISL-E002", "ISL-K212"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-E004", title="an inner factor's expert count is not n", exc_type=ValueError,
        message="Inkling shared-sink LoRA expert count does not match",
        meaning="Gate-up B and down A are always per expert: their dim 1 must equal the sink's "
                "n_shared_experts.",
        when="Flat PEFT factors given an expert axis of 1 instead of being split per expert, or an "
             "adapter for a model with another number of shared experts.",
        setup=SINK + _POOL2 + BUFFERS,
        trigger="flat_b = gb.reshape(2, 1, 24, 4)   # experts stacked along rows, expert axis 1\n"
                "sink.set_lora_info(ga, flat_b, da, db)\n",
        fix="flat_b = gb.reshape(2, 1, 24, 4)\n"
            "sink.set_lora_info(ga, flat_b.reshape(2, 2, 12, 4), da, db)  # split the stacked experts\n",
        remedy="Split the stacked experts of gate-up B / down A into an expert axis of n (il.diagnose_pool "
               "prints the reshape), or use the adapter with the model it was trained for.",
        upstream=f"{_SET}: fourth check, gate-up B's and down A's dim 1 against n_shared_experts.",
        diagnosis="{name} has {k} experts; the sink has n={n}",
        generation=V1, adapter_caused=True, related=("ISL-E001", "ISL-E002"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-E005", title="rank dimensions disagree", exc_type=ValueError,
        message="Inkling shared-sink LoRA rank dimensions do not match",
        meaning="R is read from gate-up B's last axis. Gate-up A must then have 2R rows (gate A, then up "
                "A), down A R rows and down B R columns.",
        when="Gate-up A holding one half only (R rows instead of 2R), a transposed factor, or buffers "
             "padded to different max ranks.",
        setup=SINK + POOL + BUFFERS,
        trigger="sink.set_lora_info(ga[:, :, :4], gb, da, db)  # gate A only: R rows, not 2R\n",
        fix="sink.set_lora_info(ga, gb, da, db)               # gate A at rows 0..R-1, up A at R..2R-1\n",
        remedy="Pad every factor to the pool's max rank R (gate A and up A each in its own half of gate-up "
               "A's 2R rows); a factor whose other axis is R is transposed.",
        upstream=f"{_SET}: fifth check, R = gate-up B's last axis against gate-up A's dim 2 (2R), down A's "
                 "dim 2 and down B's last axis.",
        diagnosis="{name} axis {axis} is {got}; with R={R} (gate-up B's last axis) it must be {want}",
        generation=V1, adapter_caused=True, related=("ISL-E016", "ISL-E006"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-E007", title="the pool's shape changed after initialization", exc_type=RuntimeError,
        message="Shared-sink LoRA pool shape changed after initialization: gate-up {old_gate_up} -> "
                "{new_gate_up}, down-A {old_down} -> {new_down}",
        meaning="In the shared-outer layout the derived operands w1_delta [S, n*2F, 2R] and a_cat "
                "[S, R, n*F] are allocated once and kept at a fixed address, because CUDA graphs replay "
                "against it. A later set_lora_info whose buffers would change those shapes (more slots, "
                "another rank, another F) cannot be honoured in place. The shapes in the message are "
                "those of w1_delta and a_cat, not of the pool buffers; a change of H alone does not "
                "trigger it. Upstream has already adopted the new buffers when it raises (the next "
                "refresh then fails); the kit leaves the module as it was.",
        when="Re-creating the pool with another max_loras_per_batch or max_lora_rank while the model "
             "(and its captured graphs) lives on.",
        setup=SINK + "small = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=2)\n"
              "sink.set_lora_info(*small.buffers())\n",
        trigger="big = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=4, max_rank=2)\n"
                "sink.set_lora_info(*big.buffers())  # 3 -> 4 slots\n",
        fix="sink = il.SharedSinkLoRA(n_shared_experts=2, hidden_size=8, intermediate_size=6)  # a fresh module\n"
            "big = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=4, max_rank=2)\n"
            "sink.set_lora_info(*big.buffers())\n",
        remedy="Keep the pool's slot count and max rank for the life of the model (restart the server to "
               "change --max-loras-per-batch or --max-lora-rank).",
        upstream=f"{INKLING_LORA}: InklingBatchDenseMLPWithLoRA._allocate_lora_operands, called by "
                 "set_lora_info after it adopted the new buffers.",
        generation=V1, related=("ISL-E008", "ISL-E020"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-E012", title="a raw reshape error: a size that does not split", exc_type=RuntimeError,
        message="shape '{shape}' is invalid for input of size {size}",
        meaning="Upstream does not check every size before it reshapes, so some mistakes surface as "
                "torch's own reshape error. In set_lora_info (shared outer) it means gate-up B's 2F "
                "is odd and cannot be split into gate and up halves; in adapter normalization it means "
                "a flat factor's width or height is not a multiple of n. The bracketed shape is what "
                "the code tried: [S, n, F, 2, 2R] for the derived gate-up operand, [r, n, F] for a flat "
                "down A.",
        when="A gate-up B whose gate and up halves have different sizes, a missing row, or a flat "
             "factor for another number of experts.",
        setup=SINK + _POOL2 + BUFFERS,
        trigger="sink.set_lora_info(ga, gb[:, :, :11], da, db)  # 2F = 11 is odd\n",
        fix="print(il.diagnose_pool(ga, gb[:, :, :11], da, db, n_shared_experts=2).codes)  # ISL-D103\n"
            "sink.set_lora_info(ga, gb, da, db)                # 2F = 12\n",
        remedy="Give gate-up B an even 2F (F gate rows, then F up rows, F as in down A); for an adapter, "
               "re-export the flat factors for the model's n.",
        doctor_fix="check --n-shared-experts: a flat factor's expert features do not split into n",
        upstream=f"torch's view error inside {INKLING_LORA}: InklingBatchDenseMLPWithLoRA."
                 "_refresh_lora_operands (the [S, n, F, 2, 2R] view of w1_delta, reached from set_lora_info), "
                 "or inside sglang/srt/lora/lora.py: LoRAAdapter._normalize_shared_expert_moe (the "
                 "[r, n, F] view of a flat factor).",
        generation=V1, adapter_caused=True, related=("ISL-E010", "ISL-E011", "ISL-E013", "ISL-D103"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-E013", title="a raw IndexError: buffers with different slot counts", exc_type=IndexError,
        message="index {index} is out of bounds for dimension {dim} with size {size}",
        meaning="set_lora_info does not compare the four buffers' slot counts. In the shared-outer "
                "layout it then builds the derived operands slot by slot over gate-up B's slots, and a "
                "down A with fewer slots runs out: torch's own IndexError.",
        when="Buffers cut to different numbers of slots, e.g. one of them sliced to the active slots "
             "only.",
        setup=SINK + POOL + BUFFERS,
        trigger="sink.set_lora_info(ga, gb, da[:2], db)  # down A has 2 slots, gate-up B 3\n",
        fix="print(il.diagnose_pool(ga, gb, da[:2], db, n_shared_experts=2).codes)  # ISL-D104\n"
            "sink.set_lora_info(ga, gb, da, db)\n",
        remedy="Give all four buffers the same slot count S (the pool's max_loras_per_batch); never slice "
               "one of them to the active slots.",
        upstream=f"torch's indexing error inside {INKLING_LORA}: InklingBatchDenseMLPWithLoRA."
                 "_refresh_lora_operands (`a_down[slot]` over gate-up B's slots), reached from set_lora_info.",
        generation=V1, related=("ISL-E012", "ISL-D104"), releases=EVERY_RELEASE),
]
