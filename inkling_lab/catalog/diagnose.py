"""Findings of ``diagnose_pool``: what sglang 0.5.23's ``set_lora_info`` does not check
and users trip over later (a raw torch error, or silently wrong output)."""
from __future__ import annotations

from ._snippets import BUFFERS, POOL
from .entry import EVERY_RELEASE, INKLING_LORA, KIT_FINDING, CatalogEntry

_D = "il.diagnose_pool"
_LOADED = POOL + "pool.load(0, il.LoRAFactors.random(n=2, hidden=8, intermediate=6, rank=2, seed=0))\n" + BUFFERS
_NOT_CHECKED = ("sglang/srt/models/inkling_common/lora.py: InklingBatchDenseMLPWithLoRA.set_lora_info checks "
                "only the five conditions of ISL-E001..E005; ")


def _finding(code: str, title: str, message: str, meaning: str, when: str, trigger: str, fix: str,
             remedy: str, upstream: str, setup: str = _LOADED, related: tuple[str, ...] = (),
             releases: tuple[str, ...] | None = None) -> CatalogEntry:
    return CatalogEntry(code=code, title=title, exc_type=None, kind="finding", message=message, meaning=meaning,
                        when=when, setup=setup, trigger=trigger, fix=fix, remedy=remedy,
                        upstream=_NOT_CHECKED + upstream, generation=KIT_FINDING, related=related, releases=releases)


ENTRIES: list[CatalogEntry] = [
    _finding("ISL-D101", "hidden size H disagrees", "hidden size H disagrees: {detail}",
             "H is read from gate-up A's last axis and down B's axis 2; the two must agree, and equal the "
             "sink's hidden size when it is given.",
             "An adapter for another model, or an outer factor transposed.",
             f"{_D}(ga, gb, da, db, n_shared_experts=2, hidden_size=9)\n",
             f"{_D}(ga, gb, da, db, n_shared_experts=2, hidden_size=8)\n",
             "Use the adapter with the model it was trained for (its hidden_size); a square-looking mismatch "
             "is often a transposed factor.",
             "the forward then fails with a matmul shape error.", releases=EVERY_RELEASE),
    _finding("ISL-D102", "intermediate size F disagrees", "intermediate size F disagrees: {detail}",
             "F is read from gate-up B's 2F (halved) and down A's last axis; they must agree, and equal the "
             "sink's per-rank F when it is given (F/tp under tensor parallelism).",
             "An adapter for another model, or one sharded for another tensor-parallel size.",
             f"{_D}(ga, gb, da[..., :5], db, n_shared_experts=2)\n",
             f"{_D}(ga, gb, da, db, n_shared_experts=2)\n",
             "Shard the adapter for this tensor-parallel size (inkling-lab convert --tp), or use it with the "
             "model it was trained for.",
             "the forward then fails with a matmul shape error.", releases=EVERY_RELEASE),
    _finding("ISL-D103", "gate-up B has an odd 2F",
             "gate-up B has 2F={two_f}, which is odd: gate and up halves cannot be split",
             "Gate-up B holds F gate rows, then F up rows: its axis 2 must be even.",
             "A row lost on export, or gate and up halves of different sizes.",
             f"{_D}(ga, gb[:, :, :11], da, db, n_shared_experts=2)\n",
             f"{_D}(ga, gb, da, db, n_shared_experts=2)\n",
             "Re-export gate and up B with F rows each (F as in down A).",
             "shared outer: a raw RuntimeError inside set_lora_info (ISL-E012); per-expert outer: "
             "set_lora_info accepts it and nothing checks it before the forward.", related=("ISL-E012",), releases=EVERY_RELEASE),
    _finding("ISL-D104", "slot counts differ between buffers", "slot counts differ: {detail}",
             "Every buffer holds one entry per pool slot: the four slot axes must be equal.",
             "One buffer sliced to the active slots, or buffers from two pools.",
             f"{_D}(ga, gb, da[:2], db, n_shared_experts=2)\n",
             f"{_D}(ga, gb, da, db, n_shared_experts=2)\n",
             "Give all four buffers the pool's slot count (a zero slot means no adapter).",
             "it raises only when down A has fewer slots than gate-up B (shared outer: an IndexError, "
             "ISL-E013) and accepts every other difference (a gate-up A or gate-up B with fewer slots); "
             "the kernels then index each buffer by slot id without a bound (sglang/kernels/ops/lora/dense/"
             "trtllm_lora_temp/sgemm_lora_a.py).", related=("ISL-E013",), releases=EVERY_RELEASE),
    _finding("ISL-D105", "mixed dtypes", "mixed dtypes: {detail}",
             "The four buffers are multiplied together in the forward: they need one dtype (the sink's).",
             "One buffer cast (or loaded) separately.",
             f"{_D}(ga.double(), gb, da, db, n_shared_experts=2)\n",
             f"{_D}(ga, gb, da, db, n_shared_experts=2)\n",
             "Cast all four buffers to the sink's dtype.",
             "a matmul of mixed dtypes fails in the forward.", releases=EVERY_RELEASE),
    _finding("ISL-D106", "mixed devices", "mixed devices: {detail}",
             "The four buffers must live on the sink's device.",
             "One buffer moved (or created) on another device.",
             f"{_D}(ga.to('meta'), gb, da, db, n_shared_experts=2)\n",
             f"{_D}(ga, gb, da, db, n_shared_experts=2)\n",
             "Move all four buffers to the sink's device with .to(device).",
             "the forward fails with a device mismatch.", releases=EVERY_RELEASE),
    _finding("ISL-D107", "NaN or Inf in a buffer", "{buffer} holds {count} NaN/Inf value(s)",
             "A non-finite value in a factor makes every output of its slot NaN (or infinite).",
             "An fp16 export that overflowed (above 65504), a diverged training run, a corrupt file.",
             "bad = db.clone(); bad[0, 0, 0, 0] = float('nan')\n"
             f"{_D}(ga, gb, da, bad, n_shared_experts=2)\n",
             f"{_D}(ga, gb, da, db, n_shared_experts=2)\n",
             "Reload the adapter from a finite checkpoint (check it with inkling-lab doctor); export in "
             "bf16 or fp32 if fp16 overflowed.",
             "every output of that slot is NaN.", releases=EVERY_RELEASE),
    _finding("ISL-D108", "more slots than the pool has",
             "the buffers have {slots} slots but the pool serves max_loras_per_batch={max_loras}",
             "The buffers' slot axis is longer than the number of slots the engine serves.",
             "Buffers built for another --max-loras-per-batch.",
             f"{_D}(ga, gb, da, db, n_shared_experts=2, max_loras=2)\n",
             f"{_D}(ga, gb, da, db, n_shared_experts=2, max_loras=3)\n",
             "Build the pool with --max-loras-per-batch slots, or raise it to the buffers' slot count.",
             "the extra slots are never served.", releases=EVERY_RELEASE),
    _finding("ISL-D109", "rank padding is not zero", "slot {slot}: {detail}",
             "A slot holds an adapter of rank r in buffers of rank R: ranks r..R-1 must be zero, and every "
             "factor of the slot must use the same ranks.",
             "Buffers filled by hand without zeroing, or a slot reused without clearing.",
             "padded = da.clone(); padded[0, :, 3] = 1.0\n"
             f"{_D}(ga, gb, padded, db, n_shared_experts=2, lora_ranks=[2, 0, 0])\n",
             f"{_D}(ga, gb, da, db, n_shared_experts=2, lora_ranks=[2, 0, 0])\n",
             "Zero ranks r..R-1 of the slot (LoRAPool.load and sglang's pool load do this).",
             "the padding adds a delta nobody trained.", releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-D110", title="a buffer whose shape cannot be read", exc_type=None, kind="finding",
        message="could not read the buffers' shapes: {error}",
        meaning="diagnose_pool reads the four buffers' shapes first (a tensor's or array's shape, or a bare shape "
                "tuple of whole numbers). One of them is neither, so nothing else can be checked.",
        when="A buffer passed as something else: a string, a list of tensors, a shape with a size that is no "
             "whole number.",
        setup=POOL + BUFFERS,
        trigger=f"{_D}(ga, gb, da, 'db', n_shared_experts=2)  # a name, not the tensor\n",
        fix=f"{_D}(ga, gb, da, db, n_shared_experts=2)\n",
        remedy="pass four tensors (or four shape tuples)",
        upstream=f"{INKLING_LORA}: InklingBatchDenseMLPWithLoRA.set_lora_info reads every buffer's `weight.ndim` "
                 "in its first check; an object without one fails there with Python's own AttributeError, before "
                 "any of its messages.",
        generation="inkling_lab diagnose_pool (a finding; sglang 0.5.23 has no message of its own for it)",
        related=("ISL-E001",), releases=EVERY_RELEASE),
]
