"""The vectorized torch path: the linearized base plus one shrink and one expand per
slot present in the batch. Runs on CPU and GPU in the sink's dtype."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..sink import accumulation_dtype, gate_up_rows, swiglu_sink

if TYPE_CHECKING:
    from ..batch import SlotBatch
    from ..lora import SharedSinkLoRA


def _slot_tokens(batch: "SlotBatch", device: torch.device) -> dict[int, torch.Tensor]:
    """Token indices (original order) of each active slot."""
    slots = batch.token_slots()
    return {s: torch.nonzero(slots == s).flatten().to(device) for s in batch.active_slots()}


def torch_forward(sink: "SharedSinkLoRA", x: torch.Tensor, gammas: torch.Tensor,
                  batch: "SlotBatch | None") -> torch.Tensor:
    """``x [T, H]``, ``gammas [T, n]`` -> ``out [T, H]`` in ``x``'s dtype."""
    n, F = sink.n_shared_experts, sink.intermediate_size
    w13_lin, w2_lin = sink.linearized()
    y = (x @ w13_lin.T).view(-1, n, 2 * F)
    groups = _slot_tokens(batch, x.device) if batch is not None and sink.lora_buffers is not None else {}
    if groups:
        ga, gb, da, db = sink.lora_buffers
        R = gb.shape[-1]
        shared = sink.shared_outer
        gate_rows, up_rows = gate_up_rows(F, sink.interleaved, x.device)
        y = y.clone()
        for s, idx in groups.items():
            xs = x[idx]
            scale = float(batch.scalings[s])
            if shared:
                shrink = xs @ ga[s, 0].T                                   # [Ts, 2R]
                y[idx] += (scale * (shrink @ sink.w1_delta[s].T)).view(-1, n, 2 * F)
            else:
                g = torch.einsum("th,erh->ter", xs, ga[s, :, :R])          # [Ts, n, R]
                u = torch.einsum("th,erh->ter", xs, ga[s, :, R:])
                dy = torch.zeros(xs.shape[0], n, 2 * F, dtype=y.dtype, device=y.device)
                dy[:, :, gate_rows] = torch.einsum("ter,efr->tef", g, gb[s, :, :F])
                dy[:, :, up_rows] = torch.einsum("ter,efr->tef", u, gb[s, :, F:])
                y[idx] += scale * dy
    act = swiglu_sink(y, gammas, sink.interleaved)                          # [T, n, F]
    acc = accumulation_dtype(x.dtype)
    out = (act.reshape(-1, n * F) @ w2_lin).to(acc)
    for s, idx in groups.items():
        scale = float(batch.scalings[s])
        if shared:
            mid = act[idx].reshape(-1, n * F) @ sink.a_cat[s].T            # [Ts, R]: the expert sum
            out[idx] += scale * (mid @ db[s, 0].T).to(acc)
        else:
            mid = torch.einsum("tef,erf->ter", act[idx], da[s])            # [Ts, n, R]
            out[idx] += scale * torch.einsum("ter,ehr->th", mid, db[s]).to(acc)
    return out.to(x.dtype)
