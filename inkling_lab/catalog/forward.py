"""Errors of the forward: the kernels and the batch that drives them."""
from __future__ import annotations

from ._snippets import POOL, SINK
from .entry import EVERY_RELEASE, KIT, V1, CatalogEntry

ENTRIES: list[CatalogEntry] = [
    CatalogEntry(
        code="ISL-E014", title="the multi-slot kernels need Triton on CUDA", exc_type=RuntimeError,
        message="Multi-slot dense LoRA requires Triton on CUDA",
        meaning="The Triton kernels run on a CUDA device (or, for tests, in Triton's CPU interpreter "
                "with TRITON_INTERPRET=1). On a CPU tensor use the 'torch' backend, or 'auto', which "
                "picks the fastest correct backend for the device.",
        when="Asking for backend='triton' with CPU tensors, e.g. a notebook written on a GPU machine "
             "run on a laptop.",
        setup=SINK + POOL + "sink.set_lora_info(*pool.buffers())\n"
              "x, gammas = torch.randn(5, 8), torch.rand(5, 2)\n"
              "batch = il.SlotBatch.from_token_slots([0, 0, 1, 2, -1], num_slots=3)\n",
        trigger="import os; os.environ.pop('TRITON_INTERPRET', None)\n"
                "sink(x, gammas, batch=batch, backend='triton')  # x is on the CPU\n",
        fix="sink(x, gammas, batch=batch, backend='auto')  # torch on CPU, triton on CUDA\n",
        remedy="In sglang: serve with --lora-backend triton on a CUDA device. In the kit: backend='auto' "
               "(or 'torch' on a CPU).",
        upstream="sglang/srt/lora/trtllm_lora_temp/inkling_dense.py: apply_multi_lora (the backend is not "
                 "'triton' or the input is not on CUDA).",
        generation=V1, related=("ISL-E009",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K103", title="a batch names a slot the pool does not have", exc_type=ValueError,
        message="SlotBatch: {where} {index} uses slot {slot}, but the pool has slots 0..{last} "
                "(-1 means base model only); {count} {where}(s) out of range",
        meaning="Every token names a slot of the pool, or -1 for the base model only. A slot past the "
                "pool's end has no adapter behind it; the kit refuses the batch.",
        when="Slot ids from the engine's adapter table (which can be larger than the pool) instead of "
             "the pool's slot indices.",
        setup="",
        trigger="il.SlotBatch.from_token_slots([0, 1, 3], num_slots=3)\n",
        fix="il.SlotBatch.from_token_slots([0, 1, 2], num_slots=3)\n",
        remedy="Map each request's adapter to the pool slot it was loaded into (0..S-1), and -1 for "
               "requests without an adapter.",
        upstream="sglang builds the slot ids itself from the pool's buffer ids, so they are in range by "
                 "construction; its kernels do not check them: sglang/kernels/ops/lora/dense/trtllm_lora_temp/"
                 "sgemm_lora_a.py loads `weights + w_index * w_stride_0` and `lora_ranks + w_index` with no "
                 "bound on w_index, so an id past the end would read memory past the buffers.",
        generation=KIT, related=("ISL-E008", "ISL-K104"), releases=EVERY_RELEASE),
]
