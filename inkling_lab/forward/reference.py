"""The ground truth: the forward of docs/reference.md#the-forward in float64, one token and one expert at a time.

Written to be read next to docs/reference.md#the-forward, not to be fast. It uses the pool buffers
directly (not the derived operands), so it also checks that those are right.
"""
from __future__ import annotations

import torch

from ..batch import SlotBatch
from ..operands import SinkOperands
from ..sink import gate_up_rows


def reference_forward(ops: SinkOperands, x: torch.Tensor, gammas: torch.Tensor,
                      batch: SlotBatch | None) -> torch.Tensor:
    """``x [T, H]``, ``gammas [T, n]`` -> ``out [T, H]`` in float64 (base plus LoRA)."""
    f64 = torch.float64
    n, F = ops.n, ops.intermediate
    w13, w2 = ops.w13.detach().cpu().to(f64), ops.w2.detach().cpu().to(f64)
    xs, gs = x.detach().cpu().to(f64), gammas.detach().cpu().to(f64)
    gate_rows, up_rows = gate_up_rows(F, ops.interleaved)
    slots = batch.token_slots() if batch is not None else torch.full((xs.shape[0],), -1)
    pool = None
    if ops.buffers is not None and batch is not None:
        pool = [b.detach().cpu().to(f64) for b in ops.buffers]
        R = pool[1].shape[-1]

    out = torch.zeros(xs.shape, dtype=f64)
    for t in range(xs.shape[0]):
        s = int(slots[t])
        use_lora = pool is not None and s >= 0 and int(batch.lora_ranks[s]) != 0
        if use_lora:
            ga, gb, da, db = (b[s] for b in pool)
            scaling = float(batch.scalings[s])
        down_shrink = torch.zeros(R, dtype=f64) if use_lora else None
        for e in range(n):
            y = w13[e] @ xs[t]                                   # [2F] in the sink's layout
            gate, up = y[gate_rows].clone(), y[up_rows].clone()
            if use_lora:
                o = 0 if ga.shape[0] == 1 else e                 # shared or per-expert outer
                # B @ (A @ x): A shrinks x to R features, B expands them to F.
                gate += scaling * (gb[e, :F] @ (ga[o, :R] @ xs[t]))
                up += scaling * (gb[e, F:] @ (ga[o, R:] @ xs[t]))
            act = torch.nn.functional.silu(gate) * up * gs[t, e]  # [F]
            out[t] += w2[e] @ act
            if use_lora:
                if db.shape[0] == 1:                             # shared down B: sum the shrinks, expand once
                    down_shrink += da[e] @ act
                else:
                    out[t] += scaling * (db[e] @ (da[e] @ act))
        if use_lora and db.shape[0] == 1:
            out[t] += scaling * (db[0] @ down_shrink)
    return out
