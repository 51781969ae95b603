"""Errors of the slot refresh (``on_lora_slots_updated``), first wrapper generation."""
from __future__ import annotations

from ._snippets import FACTORS, POOL, SINK
from .entry import EVERY_RELEASE, INKLING_LORA, V1, CatalogEntry

ENTRIES: list[CatalogEntry] = [
    CatalogEntry(
        code="ISL-E008", title="a refreshed slot is out of range", exc_type=IndexError,
        message="Shared-sink LoRA slot out of range: {slot_ids}",
        meaning="After the pool changes a slot in place, on_lora_slots_updated copies it into the "
                "derived operands. Every id must be a slot 0..S-1; the message lists every requested "
                "id, sorted, not only the bad ones. Per-expert pools (and a module before set_lora_info) "
                "have nothing derived and accept any id silently. None means every slot.",
        when="An off-by-one between the engine's slot table and the pool, or -1 ('no adapter') passed "
             "as a slot to refresh.",
        setup=SINK + POOL + "sink.set_lora_info(*pool.buffers())\n" + FACTORS + "pool.load(2, factors)\n",
        trigger="sink.on_lora_slots_updated([2, 3])  # the pool has slots 0..2\n",
        fix="sink.on_lora_slots_updated([2])\n",
        remedy="Refresh only pool slot indices 0..S-1 (the buffer ids the pool gave out, not adapter ids), "
               "or None for every slot.",
        upstream=f"{INKLING_LORA}: InklingBatchDenseMLPWithLoRA._refresh_lora_operands, called by "
                 "on_lora_slots_updated (only in the shared-outer layout after a successful set_lora_info).",
        generation=V1, related=("ISL-E007", "ISL-K103"), releases=EVERY_RELEASE),
]
