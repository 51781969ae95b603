"""Merged weights kept per slot: an adapter folded into its own copy of the base weights, made
when the slot is written and read by every later forward of that slot (``SharedSinkLoRA.keep_merged``).

For slot ``s`` at scaling ``c`` (docs/reference.md#the-forward), shared outer:
``w13_s = w13_lin + c * w1_delta[s] @ gate_up_a[s, 0]`` ``[n*2F, H]`` and
``w2_s = w2_lin + c * a_cat[s]^T @ down_b[s, 0]^T`` ``[n*F, H]``, kept as its transpose ``[H, n*F]``
(``F.linear``'s layout of the down weight: row ``h`` holds every expert's features, so one token's GEMV
streams it as it streams ``w2 [n, H, F]``, and a GEMM reads it transposed); per-expert outer, each
expert's rows with its own outer factor (``remerge``). Summed in float32 (float64 for float64 weights) and
rounded once to the weights' dtype. A forward of that slot is then the base forward on
``w13_s`` / ``w2_s``: no LoRA work per token, at the price of ``n*3F*H`` weight elements of
memory per kept slot. The copies stay at one address (CUDA graphs replay against them) and are
rewritten in place when the pool's slot changes (``on_lora_slots_updated``, which sglang 0.5.23
calls after it writes a slot: ``srt/lora/lora_manager.py``: ``LoRAManager.fetch_new_loras`` ->
``_notify_lora_slots_updated``), when the pool is set again, and when the base weights change.
"""
from __future__ import annotations

import math
import numbers

import torch

from .operands import KeptMerge, SinkOperands
from .sink import accumulation_dtype, gate_up_rows

MERGE_ROWS = 2048
"""Weight rows merged per step: the step's temporaries stay under ``MERGE_ROWS * H`` float32
elements (50 MB at Inkling's ``H = 6144``) whatever the weights' size."""


def float32(value: float) -> float:
    """``value`` as a float32 holds it (a ``SlotBatch``'s scalings are float32)."""
    return float(torch.tensor(value, dtype=torch.float32))


def check_keep(ops: SinkOperands, scalings: dict) -> str | None:
    """Why ``scalings`` (slot -> scaling) cannot be kept merged on ``ops``, or ``None``."""
    if ops.buffers is None:
        return "the sink has no pool: call set_lora_info first"
    _, gb, da, _ = ops.buffers
    F = ops.intermediate
    if gb.shape[2] != 2 * F or da.shape[3] != F:
        return (f"the pool is not of the sink's F = {F} (gate_up_b {list(gb.shape)}, down_a {list(da.shape)}; "
                f"ISL-K153): set a pool built for this sink")
    wrong = sorted({str(b.dtype) for b in ops.buffers if b.dtype != ops.dtype})
    if wrong:
        return f"the pool holds {', '.join(wrong)} but the sink's weights are {ops.dtype} (ISL-K161)"
    S = ops.slots
    for s, c in scalings.items():
        if isinstance(s, bool) or not isinstance(s, numbers.Integral) or not 0 <= s < S:
            return f"slot {s!r} is not a slot of the pool (0..{S - 1})"
        if isinstance(c, bool) or not isinstance(c, numbers.Real) or not math.isfinite(c):
            return f"the scaling of slot {s} is {c!r}: pass a finite number (the batch's scaling for it)"
    return None


def kept_merge(ops: SinkOperands, scalings: dict[int, float], base: tuple, old: KeptMerge | None = None
               ) -> KeptMerge | None:
    """The merges of ``scalings`` (slot -> scaling, checked: ``check_keep``) on ``ops``' weights and
    pool, written into ``old``'s storage where it holds the same number of slots of the same
    shapes (the address stays fixed), else new; ``None`` for no slot."""
    if not scalings:
        return None
    slots = tuple(sorted(scalings))
    K, H, nf = len(slots), ops.hidden, ops.n * ops.intermediate
    if old is not None and old.w13.shape == (K, 2 * nf, H) and old.w2.shape == (K, H, nf) \
            and old.w13.dtype == ops.dtype and old.w13.device == ops.device:
        w13, w2 = old.w13, old.w2
    else:
        w13 = torch.empty(K, 2 * nf, H, dtype=ops.dtype, device=ops.device)
        w2 = torch.empty(K, H, nf, dtype=ops.dtype, device=ops.device)
    kept = KeptMerge(slots, tuple(float32(scalings[s]) for s in slots), w13, w2, base)
    remerge(ops, kept, slots)
    return kept


def remerge(ops: SinkOperands, kept: KeptMerge, slots) -> None:
    """Write the merges of those of ``slots`` that ``kept`` holds again, in place, from ``ops``' base
    weights and pool buffers (not the derived operands: either outer layout merges), expert by expert:
    expert ``e``'s gate rows of ``w13_lin`` take ``c * gate_up_b[s, e, :F] @ gate_up_a[s, o, :R]``, its
    up rows ``c * gate_up_b[s, e, F:] @ gate_up_a[s, o, R:]``, its ``F`` columns of ``w2_s^T`` (``w2[e]``)
    ``c * down_b[s, o] @ down_a[s, e]`` (``o`` is 0 shared outer, else ``e``)."""
    ga, gb, da, db = ops.buffers
    n, F, R, shared = ops.n, ops.intermediate, gb.shape[-1], ga.shape[1] == 1
    gate, up = gate_up_rows(F, ops.interleaved, ops.device)
    every = torch.arange(ops.hidden, device=ops.device)
    for k, s in enumerate(kept.slots):
        if s not in slots:
            continue
        c = kept.scalings[k]
        for e in range(n):
            o = 0 if shared else e
            w13, out13 = ops.w13_lin[e * 2 * F:(e + 1) * 2 * F], kept.w13[k, e * 2 * F:(e + 1) * 2 * F]
            _merge_rows(w13, gate, gb[s, e, :F], ga[s, o, :R], c, out13)
            _merge_rows(w13, up, gb[s, e, F:], ga[s, o, R:], c, out13)
            _merge_rows(ops.w2[e], every, db[s, o], da[s, e], c, kept.w2[k, :, e * F:(e + 1) * F])


def _merge_rows(w: torch.Tensor, rows: torch.Tensor, p: torch.Tensor, q: torch.Tensor, c: float,
                out: torch.Tensor) -> None:
    """``out[rows] = w[rows] + c * p @ q`` for ``rows [M]`` of ``w``, ``p [M, K]``, ``q [K, N]``, summed in
    the weights' accumulation dtype (float32; float64 stays float64), ``MERGE_ROWS`` rows a step."""
    acc = accumulation_dtype(w.dtype)
    with torch.no_grad():
        q_acc = q.to(acc)
        for a in range(0, rows.numel(), MERGE_ROWS):
            idx = rows[a:a + MERGE_ROWS]
            out.index_copy_(0, idx, torch.addmm(w[idx].to(acc), p[a:a + MERGE_ROWS].to(acc), q_acc, alpha=c)
                            .to(out.dtype))
