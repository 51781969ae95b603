"""The vectorized torch path: the linearized base plus, per slot present in the batch,
a shrink (down to the rank-``R`` LoRA features) and an expand (back up) around each of
the two GEMMs. Runs on CPU and GPU in the sink's dtype."""
from __future__ import annotations

import torch

from ..batch import SlotBatch
from ..operands import SinkOperands
from ..sink import accumulation_dtype, gate_up_rows, swiglu_sink


def _slot_tokens(batch: SlotBatch, device: torch.device) -> dict[int, torch.Tensor]:
    """Token indices (original order) of each active slot."""
    slots = batch.token_slots()
    return {s: torch.nonzero(slots == s).flatten().to(device) for s in batch.active_slots()}


def shrink_gate_up(ops: SinkOperands, s: int, xs: torch.Tensor) -> torch.Tensor:
    """``xs [Ts, H]`` -> ``[Ts, O, 2R]``: gate (first ``R``) and up (last ``R``) LoRA
    features through slot ``s``'s gate-up A, once (shared outer) or per expert."""
    ga = ops.buffers[0][s]                                                 # [O, 2R, H]
    if ops.shared_outer:
        return (xs @ ga[0].T).unsqueeze(1)
    return torch.einsum("th,erh->ter", xs, ga)


def expand_gate_up(ops: SinkOperands, s: int, shrunk: torch.Tensor) -> torch.Tensor:
    """``shrunk [Ts, O, 2R]`` -> the delta of ``y``, ``[Ts, n, 2F]`` in the sink's gate/up
    row layout: gate B from the gate features, up B from the up features."""
    n, F, R = ops.n, ops.intermediate, ops.max_rank
    if ops.shared_outer:  # w1_delta [n*2F, 2R] places both halves of B in y's layout already
        return (shrunk[:, 0] @ ops.w1_delta[s].T).view(-1, n, 2 * F)
    gb = ops.buffers[1][s]                                                 # [n, 2F, R]
    gate_rows, up_rows = gate_up_rows(F, ops.interleaved, shrunk.device)
    dy = shrunk.new_zeros(shrunk.shape[0], n, 2 * F)
    dy[:, :, gate_rows] = torch.einsum("ter,efr->tef", shrunk[..., :R], gb[:, :F])
    dy[:, :, up_rows] = torch.einsum("ter,efr->tef", shrunk[..., R:], gb[:, F:])
    return dy


def shrink_down(ops: SinkOperands, s: int, act: torch.Tensor) -> torch.Tensor:
    """``act [Ts, n, F]`` -> ``[Ts, R]`` summed over the experts (shared down B: one
    expand serves them all), or ``[Ts, n, R]`` per expert."""
    if ops.shared_outer:  # a_cat [R, n*F]: one matmul over all experts' features is the expert sum
        return act.reshape(act.shape[0], -1) @ ops.a_cat[s].T
    return torch.einsum("tef,erf->ter", act, ops.buffers[2][s])


def expand_down(ops: SinkOperands, s: int, shrunk: torch.Tensor) -> torch.Tensor:
    """The down delta ``[Ts, H]`` from ``shrink_down``'s output, through slot ``s``'s down B."""
    db = ops.buffers[3][s]                                                 # [O, H, R]
    if ops.shared_outer:
        return shrunk @ db[0].T
    return torch.einsum("ter,ehr->th", shrunk, db)


def torch_forward(ops: SinkOperands, x: torch.Tensor, gammas: torch.Tensor,
                  batch: SlotBatch | None, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x [T, H]``, ``gammas [T, n]`` -> ``out [T, H]`` in ``x``'s dtype (``out``: a tensor of
    that shape and dtype the result is written into and returned)."""
    n, F = ops.n, ops.intermediate
    y = (x @ ops.w13_lin.T).view(-1, n, 2 * F)
    groups = _slot_tokens(batch, x.device) if batch is not None and ops.has_pool else {}
    if groups:
        y = y.clone()
        for s, idx in groups.items():
            y[idx] += float(batch.scalings[s]) * expand_gate_up(ops, s, shrink_gate_up(ops, s, x[idx]))
    act = swiglu_sink(y, gammas, ops.interleaved)                          # [T, n, F]
    acc = accumulation_dtype(x.dtype)
    res = (act.reshape(-1, n * F) @ ops.w2_lin).to(acc)
    for s, idx in groups.items():
        res[idx] += (float(batch.scalings[s]) * expand_down(ops, s, shrink_down(ops, s, act[idx]))).to(acc)
    return res.to(x.dtype) if out is None else out.copy_(res)  # copy_ casts, as .to would
