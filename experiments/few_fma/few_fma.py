"""v48b: 2-8 tokens as an FMA weight stream (the bare forward, no LoRA yet): each program streams a few weight rows
across all of ``K`` as the one-token GEMV does (v14, v47), through Triton's pipelined loop, and multiplies every step
by all the batch's tokens at once with FMAs into a float32 tile that keeps ``V`` products of each thread's own
``K`` columns summed in registers (no cross-thread sum until the loop ends). The question it answers: does a
few-token stream keep one token's speed where the MMA path (v48's ``tl.dot`` tiles) does not?

Shapes in the SPEC's symbols: ``x [T, H]``, ``w13 [n*2F, H]`` (gate/up rows as ``up_kernel`` reads them), ``gammas
[T, n]``, ``act [T, n*F]``, ``w2 [n, H, F]`` at strides ``(W2_E, W2_H, 1)``, ``out [T, H]``; ``T <= TP``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def fma_up_kernel(x_ptr, w13_ptr, gam_ptr, act_ptr, T, H, F, N_EXP, ROW_STEP, UP_OFFSET,
                  TP: tl.constexpr, BF: tl.constexpr, BK: tl.constexpr, V: tl.constexpr, STAGES: tl.constexpr):
    """Grid ``(n * cdiv(F, BF),)``: program ``(e, block)`` streams the ``2*BF`` gate/up rows of ``BF`` features of
    expert ``e`` across ``H`` in ``[2*BF, BK]`` steps, each step times the ``[TP, BK]`` tile of ``x`` into
    ``acc [TP, 2*BF, BK/V]``; then SwiGLU x gamma into ``act``."""
    pid = tl.program_id(0)
    fb = tl.cdiv(F, BF)
    e = pid // fb
    f0 = (pid % fb) * BF
    jj = tl.arange(0, 2 * BF)
    f_of_j = f0 + jj // 2
    w_ok = f_of_j < F
    w_base = w13_ptr + (e * 2 * F + f_of_j * ROW_STEP + (jj % 2) * UP_OFFSET)[:, None] * H
    t = tl.arange(0, TP)
    t_ok = t < T
    kk = tl.arange(0, BK)
    acc = tl.zeros((TP, 2 * BF, BK // V), dtype=tl.float32)
    for k in tl.range(0, H, BK, num_stages=STAGES):
        k_ok = k + kk < H
        w = tl.load(w_base + (k + kk)[None, :], mask=w_ok[:, None] & k_ok[None, :], other=0.0,
                    eviction_policy="evict_first").to(tl.float32)
        xt = tl.load(x_ptr + t[:, None] * H + (k + kk)[None, :], mask=t_ok[:, None] & k_ok[None, :],
                     other=0.0).to(tl.float32)
        if V == 1:
            acc += xt[:, None, :] * w[None, :, :]
        else:
            acc += tl.sum(tl.reshape(xt[:, None, :] * w[None, :, :], (TP, 2 * BF, BK // V, V)), axis=3)
    gate, up = tl.split(tl.reshape(tl.sum(acc, axis=2), (TP, BF, 2)))
    gam = tl.load(gam_ptr + t * N_EXP + e, mask=t_ok, other=0.0).to(tl.float32)
    act = gate / (1.0 + tl.exp(-gate)) * up * gam[:, None]
    fs = f0 + tl.arange(0, BF)
    tl.store(act_ptr + t[:, None] * (N_EXP * F) + e * F + fs[None, :], act.to(act_ptr.dtype.element_ty),
             mask=t_ok[:, None] & (fs < F)[None, :])


@triton.jit
def fma_down_kernel(act_ptr, w2_ptr, out_ptr, T, H, F, N_EXP, W2_E, W2_H,
                    TP: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr, V: tl.constexpr, STAGES: tl.constexpr):
    """Grid ``(cdiv(H, BH),)``: program ``p`` streams rows ``p*BH ...`` of ``w2`` over each expert's ``F`` in
    ``[BH, BK]`` steps, each step times the ``[TP, BK]`` tile of ``act`` into ``acc [TP, BH, BK/V]``; then ``out``."""
    pid = tl.program_id(0)
    hs = pid * BH + tl.arange(0, BH)
    h_ok = hs < H
    t = tl.arange(0, TP)
    t_ok = t < T
    kk = tl.arange(0, BK)
    kb = tl.cdiv(F, BK)
    w_base = w2_ptr + hs[:, None] * W2_H
    acc = tl.zeros((TP, BH, BK // V), dtype=tl.float32)
    for i in tl.range(0, N_EXP * kb, num_stages=STAGES):
        e = i // kb
        fc = (i - e * kb) * BK + kk
        f_ok = fc < F
        w = tl.load(w_base + e * W2_E + fc[None, :], mask=h_ok[:, None] & f_ok[None, :], other=0.0,
                    eviction_policy="evict_first").to(tl.float32)
        a = tl.load(act_ptr + t[:, None] * (N_EXP * F) + e * F + fc[None, :], mask=t_ok[:, None] & f_ok[None, :],
                    other=0.0).to(tl.float32)
        if V == 1:
            acc += a[:, None, :] * w[None, :, :]
        else:
            acc += tl.sum(tl.reshape(a[:, None, :] * w[None, :, :], (TP, BH, BK // V, V)), axis=3)
    out = tl.sum(acc, axis=2)
    tl.store(out_ptr + t[:, None] * H + hs[None, :], out.to(out_ptr.dtype.element_ty), mask=t_ok[:, None] & h_ok[None, :])


def bare_forward(x: torch.Tensor, gammas: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, interleaved: bool,
                 *, bf: int = 2, bk: int = 256, bh: int = 4, dk: int = 256, v: int = 1, stages: int = 6,
                 warps: int = 4, act: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """The shared sink's forward without LoRA for ``x [T, H]`` (one token tile of the next power of two, meant for
    2-8 tokens), ``gammas [T, n]``, ``w13 [n, 2F, H]`` (gate/up rows interleaved or not), ``w2 [n, H, F]`` -> ``out [T,
    H]``: two launches, ``bf`` features by ``bk`` of ``H`` a step up, ``bh`` rows of ``w2`` by ``dk`` of ``F`` a step
    down, ``stages`` steps deep; ``v`` > 1 sums that many products of a column block in each step (v48b's first
    form: the compiler spread that sum across threads, 960 shuffles a step at 8 tokens on sm_90), 1 keeps every
    product's column apart until the loop ends."""
    T, H = x.shape
    n, F = w2.shape[0], w2.shape[2]
    tp = max(2, triton.next_power_of_2(T))
    row_step, up_offset = (2, 1) if interleaved else (1, F)
    act = torch.empty(T, n * F, dtype=x.dtype, device=x.device) if act is None else act
    out = torch.empty_like(x) if out is None else out
    fma_up_kernel[(n * triton.cdiv(F, bf),)](x, w13, gammas, act, T, H, F, n, row_step, up_offset,
                                               TP=tp, BF=bf, BK=bk, V=v, STAGES=stages, num_warps=warps, num_stages=1)
    fma_down_kernel[(triton.cdiv(H, bh),)](act, w2, out, T, H, F, n, w2.stride(0), w2.stride(1),
                                            TP=tp, BH=bh, BK=dk, V=v, STAGES=stages, num_warps=warps, num_stages=1)
    return out
