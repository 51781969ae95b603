"""Errors of ``initialize_lora``, first wrapper generation: can this sink be wrapped?"""
from __future__ import annotations

from .entry import EVERY_RELEASE, INKLING_LORA, V1, CatalogEntry

ENTRIES: list[CatalogEntry] = [
    CatalogEntry(
        code="ISL-E009", title="the dense LoRA wrapper is ineligible", exc_type=ValueError,
        message="InklingBatchDenseMLPWithLoRA is ineligible: {problems}",
        meaning="The first-generation wrapper needs the Triton backend whenever a batch can hold more "
                "than one adapter (problem 'multi-slot dense LoRA requires the Triton backend') and a "
                "sink whose weights are linearized in bf16, which only the interleaved base is "
                "('the shared sink does not use linearized BF16 weights'). The problems are joined by '; '.",
        when="Serving with --lora-backend other than triton and max_loras_per_batch > 1; a float32 or "
             "fp16 sink; a contiguous-layout sink on the first-generation wrapper.",
        setup="sink = il.SharedSinkLoRA(n_shared_experts=2, hidden_size=8, intermediate_size=6,\n"
              "                         interleaved=True, dtype=torch.bfloat16)\n",
        trigger="sink.initialize_lora(il.LoRABackend(name='csgmv', max_loras_per_batch=4))\n",
        fix="sink.initialize_lora(il.LoRABackend(name='triton', max_loras_per_batch=4))\n",
        remedy="Serve with --lora-backend triton when --max-loras-per-batch is above 1, and keep the shared "
               "sink in bf16 with its interleaved, linearized weights (the default for this wrapper).",
        upstream=f"{INKLING_LORA}: InklingBatchDenseMLPWithLoRA.initialize_lora (collects both problems, "
                 "then raises once).",
        generation=V1, related=("ISL-E014", "ISL-E017", "ISL-E018", "ISL-E019"), releases=EVERY_RELEASE),
]
