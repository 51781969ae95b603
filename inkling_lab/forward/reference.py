"""The ground truth: the forward of docs/reference.md#the-forward in float64, one slot and one expert at a time.

Written to be read next to docs/reference.md#the-forward, not to be fast: each line is one
term of the formula, for all the tokens of one slot at once. It uses the pool buffers
directly (not the derived operands), so it also checks that those are right. It runs on
the device of ``x`` (the profiler checks the H200's kernels against it there, at up to
8192 tokens of the real model's size).
"""
from __future__ import annotations

import torch

from ..batch import SlotBatch
from ..operands import SinkOperands
from ..sink import gate_up_rows


def reference_forward(ops: SinkOperands, x: torch.Tensor, gammas: torch.Tensor,
                      batch: SlotBatch | None, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x [T, H]``, ``gammas [T, n]`` -> ``out [T, H]`` in float64 on ``x``'s device (base plus LoRA;
    ``out``: a float64 ``[T, H]`` tensor the result is copied into and returned)."""
    f64, device = torch.float64, x.device
    n, F = ops.n, ops.intermediate
    w13, w2 = ops.w13.detach().to(device, f64), ops.w2.detach().to(device, f64)
    xs, gs = x.detach().to(f64), gammas.detach().to(f64)
    gate_rows, up_rows = gate_up_rows(F, ops.interleaved, device)

    # The slots with LoRA work: some token uses them and their rank is not 0.
    slots: list[tuple[torch.Tensor, list[torch.Tensor], float]] = []
    if ops.buffers is not None and batch is not None:
        pool = [b.detach().to(device, f64) for b in ops.buffers]
        token_slots = batch.token_slots().to(device)
        for s in batch.active_slots():
            tokens = torch.nonzero(token_slots == s).flatten()
            slots.append((tokens, [b[s] for b in pool], float(batch.scalings[s])))

    y = torch.einsum("th,efh->tef", xs, w13)                    # [T, n, 2F] in the sink's layout
    gate, up = y[..., gate_rows], y[..., up_rows]                 # [T, n, F] each
    for tokens, (ga, gb, _, _), scaling in slots:
        R = gb.shape[-1]
        for e in range(n):
            o = 0 if ga.shape[0] == 1 else e                      # shared or per-expert outer
            # B @ (A @ x): A shrinks x to R features, B expands them to F.
            gate[tokens, e] += scaling * (xs[tokens] @ ga[o, :R].T) @ gb[e, :F].T
            up[tokens, e] += scaling * (xs[tokens] @ ga[o, R:].T) @ gb[e, F:].T
    act = torch.nn.functional.silu(gate) * up * gs[..., None]     # [T, n, F]
    res = torch.einsum("tef,ehf->th", act, w2)
    for tokens, (_, _, da, db), scaling in slots:
        shrink = torch.einsum("tef,erf->ter", act[tokens], da)    # [t, n, R]: each expert's down A
        if db.shape[0] == 1:                                      # shared down B: sum the shrinks, expand once
            res[tokens] += scaling * shrink.sum(1) @ db[0].T
        else:
            res[tokens] += scaling * torch.einsum("ter,ehr->th", shrink, db)
    return res if out is None else out.copy_(res)
