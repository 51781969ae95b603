"""The kit's own refusals at the forward's and the batch's inputs (codes ISL-K150..K179)."""
from __future__ import annotations

from ._snippets import SINK
from .entry import KIT, CatalogEntry

_UPSTREAM_FORWARD = ("sglang/srt/models/inkling_common/lora.py: InklingBatchDenseMLPWithLoRA._forward_bf16_linearized "
                     "runs torch.mm(x_td, w13_lin.T) on what it is given")

ENTRIES: list[CatalogEntry] = [
    CatalogEntry(
        code="ISL-K150", title="the tokens are of another dtype than the sink", exc_type=TypeError,
        message="x is {got} but the sink's weights are {want}: pass x.to({want}) (or build the sink with dtype={got})",
        meaning="The sink computes in its weights' dtype: the up GEMM multiplies x by w13 as they are. "
                "Tokens of another dtype would fail inside torch's matmul with words that name neither x "
                "nor the sink; the kit refuses them first. (gammas may be of any floating dtype: they are "
                "read in float32.)",
        when="float32 tokens from torch.randn next to a bfloat16 sink; a sink built in float64 for the "
             "reference next to the model's bf16 activations.",
        setup=SINK + "x, gammas = torch.randn(5, 8, dtype=torch.float64), torch.rand(5, 2)\n",
        trigger="sink(x, gammas)  # the sink is float32\n",
        fix="sink(x.to(sink.dtype), gammas)\n",
        remedy="Cast the tokens to the sink's dtype (x.to(sink.dtype)), or build the sink in the tokens' dtype.",
        upstream=_UPSTREAM_FORWARD + ", where another dtype is torch's own RuntimeError (mat1 and mat2 dtypes); "
                 "sglang's engine always hands it the model's dtype.",
        generation=KIT, related=("ISL-K151",)),
    CatalogEntry(
        code="ISL-K151", title="an input lives on another device than the sink", exc_type=ValueError,
        message="{what} is on {got} but the sink's weights are on {want}: pass {what}.to('{want}')",
        meaning="Every tensor of one forward must be on the sink's device; the kit names the one that is not "
                "instead of torch's device-mismatch error from inside a matmul or a kernel.",
        when="A sink moved to CUDA with tokens still on the CPU, or the other way round.",
        setup=SINK + "x, gammas = torch.randn(5, 8, device='meta'), torch.rand(5, 2)\n",
        trigger="sink(x, gammas)  # the sink is on the CPU\n",
        fix="sink(torch.randn(5, 8), gammas)\n",
        remedy="Move the input to the sink's device (x.to(sink.device)), or the sink to the input's.",
        upstream=_UPSTREAM_FORWARD + ", where another device is torch's own RuntimeError; sglang's engine "
                 "keeps every tensor on the rank's GPU.",
        generation=KIT, related=("ISL-K150",)),
    CatalogEntry(
        code="ISL-K152", title="a batch's slot ids are not whole numbers", exc_type=TypeError,
        message="SlotBatch: {what} must hold integers, but {what}[{index}] is {value} ({kind}): pass whole numbers",
        meaning="A slot id, a segment length and a rank are whole numbers. Turned into integers they would be "
                "truncated (0.7 -> slot 0), booleans would become slots 0 and 1: the kit refuses them instead.",
        when="Slot ids computed with a division, read from JSON as floats, or a mask passed where ids were meant.",
        setup="",
        trigger="il.SlotBatch.from_token_slots([0.7, 1.2, 2.9], num_slots=3)\n",
        fix="il.SlotBatch.from_token_slots([0, 1, 2], num_slots=3)\n",
        remedy="Pass integer slot ids (-1 for base model only): round them yourself where a fraction is expected.",
        upstream="sglang builds its LoRABatchInfo from the scheduler's integer buffer ids "
                 "(sglang/srt/lora/lora_manager.py: LoRAManager.prepare_lora_batch), so it never sees a float id.",
        generation=KIT, related=("ISL-K103",)),
]
