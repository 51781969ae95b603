"""The second wrapper generation (``InklingBatchDenseMLPWithLoRAV2``, the dense engine,
also in the sglang 0.5.23 wheel): its ``initialize_lora`` errors, its one combined pool
message, its ``down_cat`` shape error, and Python's own errors where it has no check."""
from __future__ import annotations

from ._snippets import POOL
from .entry import INKLING_LORA, SINCE_0_5_23, V2, CatalogEntry

_V2 = f"{INKLING_LORA}: InklingBatchDenseMLPWithLoRAV2"
_SINK = ("sink = il.SharedSinkLoRA(n_shared_experts=2, hidden_size=8, intermediate_size=6, interleaved=False,\n"
         "                         dtype=torch.bfloat16)  # V2 wants the contiguous bf16 base\n")
_READY = _SINK + "sink.initialize_lora(il.LoRABackend('triton_v2', 3), generation='v2')\n" + POOL \
    + "ga, gb, da, db = pool.buffers()\n"
_UNPACK = ("V2's set_lora_info has no 4D check: it unpacks `slots, outer, two_rank, _ = gate_up_a.shape` and "
           "`_, _, two_f, rank = gate_up_b.shape` first, so a gate-up A or B with another number of axes "
           "ends in Python's own unpacking error there. These words mean this only in that frame: a bare "
           "unpacking error elsewhere is not this entry.")
_FRAME = ("set_lora_info", "validate_pool")

ENTRIES: list[CatalogEntry] = [
    CatalogEntry(
        code="ISL-E017", title="V2: the backend has no dense engine", exc_type=ValueError,
        message="{cls} needs a backend with the dense engine",
        meaning="The second-generation wrapper runs its LoRA through the backend's dense engine (upstream: "
                "the backend's runner). A backend without one cannot serve it.",
        when="Selecting the V2 wrapper with a LoRA backend that does not build the dense engine.",
        setup=_SINK,
        trigger="sink.initialize_lora(il.LoRABackend('triton', 3), generation='v2')  # no dense engine\n",
        fix="sink.initialize_lora(il.LoRABackend('triton_v2', 3), generation='v2')\n",
        remedy="Serve with a LoRA backend that provides the dense engine, or use the first-generation "
               "wrapper (interleaved bf16 sink, --lora-backend triton).",
        upstream=f"{_V2}.initialize_lora, first check (`getattr(lora_backend, 'runner', None) is None`).",
        generation=V2, related=("ISL-E018", "ISL-E019", "ISL-E009"), releases=SINCE_0_5_23),
    CatalogEntry(
        code="ISL-E018", title="V2: the shared sink is not linearized bf16", exc_type=ValueError,
        message="{cls} needs the linearized BF16 shared sink",
        meaning="The dense engine works on the sink's bf16 weights, linearized; a sink in another dtype "
                "(or not linearized) cannot be wrapped.",
        when="A float32 or fp16 model, or a quantized sink without the bf16 fallback.",
        setup="sink = il.SharedSinkLoRA(n_shared_experts=2, hidden_size=8, intermediate_size=6, interleaved=False)\n",
        trigger="sink.initialize_lora(il.LoRABackend('triton_v2', 3), generation='v2')  # a float32 sink\n",
        fix="sink = il.SharedSinkLoRA(n_shared_experts=2, hidden_size=8, intermediate_size=6, interleaved=False,\n"
            "                         dtype=torch.bfloat16)\n"
            "sink.initialize_lora(il.LoRABackend('triton_v2', 3), generation='v2')\n",
        remedy="Serve the model in bf16 (--dtype bfloat16) with the sink's linearized bf16 weights.",
        upstream=f"{_V2}.initialize_lora, second check (`self._linearized_bf16_enabled`).",
        generation=V2, related=("ISL-E017", "ISL-E019", "ISL-E009"), releases=SINCE_0_5_23),
    CatalogEntry(
        code="ISL-E019", title="V2: the sink's gate/up rows are interleaved", exc_type=ValueError,
        message="The V2 shared sink must select contiguous W13 before loading",
        meaning="The second generation needs the contiguous gate/up base ([gate ‖ up] rows of w13); the "
                "first generation needs the interleaved one. A sink built interleaved cannot take the V2 "
                "wrapper.",
        when="Switching a model from the first-generation wrapper to V2 without switching its w13 layout.",
        setup="sink = il.SharedSinkLoRA(n_shared_experts=2, hidden_size=8, intermediate_size=6,\n"
              "                         dtype=torch.bfloat16)  # interleaved, as the first generation wants\n",
        trigger="sink.initialize_lora(il.LoRABackend('triton_v2', 3), generation='v2')\n",
        fix=_SINK + "sink.initialize_lora(il.LoRABackend('triton_v2', 3), generation='v2')\n",
        remedy="Build (load) the sink with contiguous W13 for the V2 wrapper, or keep the interleaved sink "
               "on the first-generation wrapper.",
        upstream=f"{_V2}.initialize_lora, third check (`self._w13_gate_up_contiguous`).",
        generation=V2, related=("ISL-E017", "ISL-E018", "ISL-E009"), releases=SINCE_0_5_23),
    CatalogEntry(
        code="ISL-E006", title="V2: the pool buffers do not agree", exc_type=ValueError,
        message="Inkling shared-sink LoRA pool buffers do not agree: expected gate-up A [slots, 1 or {n}, 2R, H], "
                "gate-up B [slots, {n}, 2F, R], down A [slots, {n}, R, F], down B [slots, 1 or {n}, H, R] "
                "with one layout",
        meaning="The second generation folds the outer-dim, layout, expert-count and rank checks "
                "(ISL-E002..E005 of the first) into this one message. Run il.diagnose_pool on the same "
                "buffers to see which of the four it is.",
        when="Any of the ISL-E002..E005 situations, on the V2 wrapper.",
        setup=_READY,
        trigger="sink.set_lora_info(ga[:, :, :4], gb, da, db)  # a rank mismatch, in V2's words\n",
        fix="print(il.diagnose_pool(ga[:, :, :4], gb, da, db, n_shared_experts=2).codes)  # which check\n"
            "sink.set_lora_info(ga, gb, da, db)\n",
        remedy="Run il.diagnose_pool (or inkling-lab doctor on the adapter) on the same buffers: it names "
               "the buffer, the axis and the reshape that fixes it.",
        upstream=f"{_V2}.set_lora_info (one condition, evaluated left to right).",
        generation=V2, adapter_caused=True, related=("ISL-E002", "ISL-E003", "ISL-E004", "ISL-E005"), releases=SINCE_0_5_23),
    CatalogEntry(
        code="ISL-E020", title="V2: the pool's shape changed after initialization", exc_type=RuntimeError,
        message="Shared-sink LoRA pool shape changed after initialization: {old} -> {new}",
        meaning="The second generation's only derived operand, down_cat ([S, R, n*F] shared outer, "
                "[S, H, n*R] per expert), keeps its address for CUDA graphs. A later set_lora_info whose "
                "down_cat would have another shape is refused before anything is adopted: the module keeps "
                "its old pool. The shapes are down_cat's.",
        when="Re-creating the pool with another slot count, rank or F (or switching the outer layout) while "
             "the model lives on.",
        setup=_READY + "sink.set_lora_info(ga, gb, da, db)\n",
        trigger="big = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=5)\n"
                "sink.set_lora_info(*big.buffers())  # R 4 -> 5\n",
        fix="same = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=4)\n"
            "sink.set_lora_info(*same.buffers())  # the same shapes: accepted\n",
        remedy="Keep the pool's slot count, max rank and outer layout for the life of the model (restart the "
               "server to change them).",
        upstream=f"{_V2}.set_lora_info (the down_cat shape test, before anything is adopted).",
        generation=V2, related=("ISL-E007",), releases=SINCE_0_5_23),
    CatalogEntry(
        code="ISL-E021", title="V2: a gate-up buffer with too few axes", exc_type=ValueError,
        message="not enough values to unpack (expected 4, got {got})", frame=_FRAME,
        meaning=_UNPACK + " Here gate-up A or gate-up B has fewer than four axes (usually the slot axis "
                "is missing).",
        when="One adapter's 3D factors handed to set_lora_info on the V2 wrapper.",
        setup=_READY,
        trigger="sink.set_lora_info(ga[0], gb, da, db)  # ga[0] has lost the slot axis\n",
        fix="sink.set_lora_info(ga, gb, da, db)\n",
        remedy="Give set_lora_info the pool's own four 4D buffers; il.diagnose_pool names the one without "
               "four axes and the reshape that fixes it.",
        upstream=f"{_V2}.set_lora_info (the shape unpacking of gate-up A and gate-up B).",
        generation=V2, adapter_caused=True, related=("ISL-E001", "ISL-E022", "ISL-E023"), releases=SINCE_0_5_23),
    CatalogEntry(
        code="ISL-E022", title="V2: a gate-up buffer with too many axes", exc_type=ValueError,
        message="too many values to unpack (expected 4{got})", frame=_FRAME,
        meaning=_UNPACK + " Here gate-up A or gate-up B has more than four axes.",
        when="An extra axis left on a buffer (an unsqueeze too many, or a [S, n, 2, F, R] view).",
        setup=_READY,
        trigger="sink.set_lora_info(ga.unsqueeze(0), gb, da, db)  # 5 axes\n",
        fix="sink.set_lora_info(ga, gb, da, db)\n",
        remedy="Give set_lora_info the pool's own four 4D buffers; il.diagnose_pool names the one with "
               "extra axes.",
        upstream=f"{_V2}.set_lora_info (the shape unpacking of gate-up A and gate-up B).",
        generation=V2, adapter_caused=True, related=("ISL-E001", "ISL-E021"), releases=SINCE_0_5_23),
    CatalogEntry(
        code="ISL-E023", title="V2: down B (or down A) with too few axes", exc_type=IndexError,
        message="tuple index out of range", frame=_FRAME,
        meaning="V2's set_lora_info reads down_b.shape[2] (the hidden size) before its combined check, "
                "and down A's axes inside it: a down buffer with too few axes ends in Python's own "
                "IndexError there. Only in that frame does this mean a down buffer; a bare 'tuple index "
                "out of range' elsewhere is not this entry.",
        when="Down B (or down A) without its slot or expert axis, on the V2 wrapper.",
        setup=_READY,
        trigger="sink.set_lora_info(ga, gb, da, db[0, 0])  # down B as [H, R]\n",
        fix="sink.set_lora_info(ga, gb, da, db)\n",
        remedy="Give set_lora_info the pool's own four 4D buffers; il.diagnose_pool names the one without "
               "four axes.",
        upstream=f"{_V2}.set_lora_info (`down_lora_b_weights.shape[2]`, then the combined condition).",
        generation=V2, adapter_caused=True, related=("ISL-E001", "ISL-E021"), releases=SINCE_0_5_23),
]

ENTRIES.append(CatalogEntry(
    code="ISL-E030", title="V2: a refreshed slot past the end", exc_type=IndexError,
    message="index {index} is out of bounds for dimension {dim} with size {size}", frame=("on_lora_slots_updated",),
    meaning="The second generation's refresh does not range-check the slot ids (the first generation "
            "raises ISL-E008): an id past the pool's end ends in torch's own IndexError from the copy into "
            "down_cat, and a negative id silently refreshes a slot counted from the end. Only in the refresh "
            "frame do these words mean this; elsewhere see ISL-E013.",
    when="An off-by-one between the engine's slot table and the pool, on the V2 wrapper.",
    setup=_READY + "sink.set_lora_info(ga, gb, da, db)\n",
    trigger="sink.on_lora_slots_updated({7})  # the pool has slots 0..2\n",
    fix="sink.on_lora_slots_updated({2})\n",
    remedy="Refresh only pool slot indices 0..S-1 (the buffer ids the pool gave out), or None for every slot.",
    upstream=f"{_V2}.on_lora_slots_updated (`target[slot].copy_(source[slot])`, no range check).",
    generation=V2, related=("ISL-E008", "ISL-E013"), releases=SINCE_0_5_23))
