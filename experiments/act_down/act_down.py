"""v25 and v26 (issue 26 target 1; KERNEL_NOTES.md v25, v26): a few tokens of one slot in two steps where
the kit and sglang's base run three (cuBLAS, an activation kernel, cuBLAS). ``kept_forward``, on a slot whose
merge is kept (``SharedSinkLoRA.keep_merged``): cuBLAS's ``y = x @ w13_s.T`` on the slot's copy and
``act_down_kernel``, the down GEMM with the activation made inside its K loop, or the library's
``up_act_kernel`` (``inkling_lab/forward/kernels.py``), the up GEMM with the activation in its epilogue (its
``H`` split over ``Tiles.split`` programs a tile, v26), and cuBLAS's down GEMM. ``slot_forward``, on the pool
with nothing kept: cuBLAS's ``y`` with the gate/up shrink beside it, then ``act_down_kernel`` with the slot's
LoRA in the same K loop.

Shapes in the SPEC's symbols: ``x [T, H]``, ``gammas [T, n]``, a kept row's ``w13_s [n*2F, H]`` (rows as
``w13_lin``'s) and ``w2_s^T [H, n*F]`` (``merged.KeptMerges``), ``out [T, H]``. Measured on an H100
(``data/profiles/h100_act_down.json``, ``h100_act_down_v26*``): the up fold was ahead of the kept path's three
launches at A, B and Inkling unsplit and at the TP-8 slice split, and is routed (``triton_backend.up_acts``);
the down fold and the slot fold lost everywhere and stay here as measured attempts. v26's other slot fold,
``slot_up_forward`` (the pool's LoRA inside ``up_act_kernel``), lost by more (1.07-2.18x sglang's base) and was
removed; its code is at commit a115e0d.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from inkling_lab.forward import kernels, triton_backend


@dataclass(frozen=True)
class Tiles:
    """``bt`` tokens on the MMA's N side (16 or more); ``bh`` rows of ``w2_s^T`` per program and ``bk`` of
    ``n*F`` per step (inside one expert) for ``act_down_kernel``, ``bh`` features (twice as many weight
    rows) and ``bk`` of ``H`` per step for ``up_act_kernel``; ``stages`` steps in flight, ``warps`` per
    program; ``split`` programs share each ``up_act_kernel`` tile, each reducing a slice of ``H``."""

    bt: int
    bh: int = 64
    bk: int = 128
    stages: int = 4
    warps: int = 4
    split: int = 1


def tiles(num_tokens: int, bh: int = 64, bk: int = 128, stages: int = 4, warps: int = 4, split: int = 1) -> Tiles:
    """The tiles for ``num_tokens``: the token tile the next power of two from 16 (the MMA's smallest N)."""
    return Tiles(max(16, triton.next_power_of_2(num_tokens)), bh, bk, stages, warps, split)


def workspace(ops, num_tokens: int, t: Tiles, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``up_act_kernel``'s float32 workspace ``[T, n*2F]`` and int32 counter per tile, zero (the kernel leaves
    them so); a split of 1 reads neither."""
    n, F = ops.n, ops.intermediate
    return (torch.zeros(num_tokens * n * 2 * F if t.split > 1 else 1, dtype=torch.float32, device=device),
            torch.zeros(n * triton.cdiv(F, t.bh), dtype=torch.int32, device=device))


def _launch_options(T: int, t: Tiles) -> dict:
    """The constants and launch options both kernels take from ``t``; ``T`` tokens must fit its token tile."""
    if T > t.bt:
        raise ValueError(f"act_down: {T} tokens do not fit its token tile of {t.bt}; make the tiles with tiles({T})")
    return dict(BT=t.bt, BK=t.bk, STAGES=t.stages, num_warps=t.warps, num_stages=t.stages)


FOLDS = ("down", "up")
"""Where ``kept_forward`` makes the activation: in the down GEMM's K loop (``act_down_kernel`` after cuBLAS's
up GEMM) or in the up GEMM's epilogue (``up_act_kernel`` before cuBLAS's down GEMM)."""


def kept_forward(ops, x: torch.Tensor, gammas: torch.Tensor, row: int, out: torch.Tensor, t: Tiles,
                 fold: str = "down", work: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """``out [T, H]`` for every token of ``x [T, H]`` on kept row ``row`` of ``ops.kept`` (``T <= t.bt``) in
    two launches. ``fold="down"``: ``y = x @ w13_s.T`` (cuBLAS), then ``act_down_kernel`` over ``w2_s^T``
    (``t.bh`` its rows per program, ``t.bk`` of ``n*F`` per step); ``fold="up"``: ``up_act_kernel`` makes
    ``act [T, n*F]`` (``t.bh`` features per program, ``t.bk`` of ``H`` per step, ``t.split`` programs a tile
    on ``work``, ``workspace``'s), then ``out = act @ w2_s`` (cuBLAS)."""
    T, H = x.shape
    if fold not in FOLDS:
        raise ValueError(f"act_down: fold {fold!r} is not one of {FOLDS}")
    meta = _launch_options(T, t)
    n, F = ops.n, ops.intermediate
    w13, w2t = ops.kept.w13[row], ops.kept.w2[row]
    if fold == "up":
        act = torch.empty(T, n * F, dtype=x.dtype, device=x.device)
        ws, cnt = work if work is not None else workspace(ops, T, t, x.device)
        row_step, up_offset = (2, 1) if ops.interleaved else (1, F)
        kernels.up_act_kernel[(n * triton.cdiv(F, t.bh) * t.split,)](
            x, w13, gammas, act, ws, cnt, T, H, F, n, row_step, up_offset, *(x,) * 6, 0, 0, 0, BF=t.bh,
            SPLIT=t.split, **meta)  # the LoRA operands, which HAS_LORA=False drops
        return torch.mm(act, w2t.T, out=out)
    y = torch.mm(x, w13.T)
    z = y  # fills the LoRA operands HAS_LORA=False drops
    act_down_kernel[(triton.cdiv(H, t.bh),)](y, gammas, w2t, out, z, z, z, z, z, T, H, F, n, 0, F, w2t.stride(0), 0,
                                            BH=t.bh, BR=16, HAS_LORA=False, INTERLEAVED=ops.interleaved, **meta)
    return out


def slot_forward(ops, x: torch.Tensor, gammas: torch.Tensor, slot: int, scalings: torch.Tensor, out: torch.Tensor,
                 t: Tiles) -> torch.Tensor:
    """``out [T, H]`` for every token of ``x [T, H]`` on pool slot ``slot`` (shared outer, nothing kept): the
    base forward plus the slot's LoRA at ``scalings[slot]`` (``scalings [S]`` float32 on ``x``'s device, read
    there, so a captured graph follows an in-place change) in two steps, ``y = x @ w13_lin.T`` and
    ``sh = x @ gate_up_A[slot, 0].T [T, 2R]`` (cuBLAS, the shrink on a side stream beside the GEMM as
    ``triton_backend._launch_single`` runs it), then ``act_down_kernel`` with ``HAS_LORA``: the gate/up expand
    added to ``y`` in its K loop, the activation, the down GEMM over the base ``w2 [n, H, F]``, the down
    shrink ``mid = act @ a_cat[slot].T`` summed in each program's registers (each program walks all of
    ``K``), and ``mid @ down_B[slot, 0].T`` added to its rows at the end."""
    T, H = x.shape
    if not ops.shared_outer:
        raise ValueError("act_down: slot_forward takes the shared outer layout (O = 1); per-expert outer "
                         "factors run the backend's own paths")
    meta = _launch_options(T, t)
    n, F = ops.n, ops.intermediate
    ga, gb, _, db = ops.buffers
    R = ga.shape[2] // 2
    if not 0 <= slot < ga.shape[0]:
        raise ValueError(f"act_down: slot {slot} is not in the pool of {ga.shape[0]} slots")
    side = triton_backend._Beside(x)
    sh = torch.empty(T, 2 * R, dtype=x.dtype, device=x.device)
    with side:
        torch.mm(x, ga[slot, 0].T, out=sh)
    y = torch.mm(x, ops.w13_lin.T)
    side.join()
    act_down_kernel[(triton.cdiv(H, t.bh),)](
        y, gammas, ops.w2, out, sh, gb, ops.a_cat, db, scalings, T, H, F, n, R, H * F, F, slot,
        BH=t.bh, BR=max(16, triton.next_power_of_2(R)), HAS_LORA=True, INTERLEAVED=ops.interleaved, **meta)
    return out


@triton.jit
def act_down_kernel(y_ptr, gam_ptr, w2_ptr, out_ptr, sh_ptr, gb_ptr, acat_ptr, db_ptr, scale_ptr,
                    T, H, F, N_EXP, R, W2_E, W2_H, SLOT,
                    BT: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr, BR: tl.constexpr, STAGES: tl.constexpr,
                    HAS_LORA: tl.constexpr, INTERLEAVED: tl.constexpr):
    """The down GEMM with the activation in its K loop, grid ``(cdiv(H, BH),)``: program ``p`` owns rows
    ``p*BH ...`` of the down weight, read as ``w2[e, h, f]`` at ``e*W2_E + h*W2_H + f`` (a kept ``w2_s^T
    [H, n*F]``: ``W2_E = F``, ``W2_H = n*F``; the base ``w2 [n, H, F]``: ``H*F`` and ``F``), and computes
    ``out[t, h] = Σ_k act[t, k] w2[k, h]`` for every token (``T <= BT``), the weight rows on the MMA's M side
    and the tokens on N, ``K = n*F`` in ``BK`` steps inside each expert (``STAGES`` in flight).
    ``act[t, e*F + f] = silu(gate) * up * gamma[t, e]`` is made here from cuBLAS's ``y [T, n*2F]`` (gate and
    up columns as ``kernels.up_kernel`` reads them with ``Y_IN``), in float32 and rounded to ``y``'s dtype
    as ``up_kernel`` stores it: the activation's own launch, and its trip through memory, go.

    ``HAS_LORA`` (every token on slot ``SLOT`` of a shared-outer pool, rank ``R``; ``c = scale[SLOT]``):
    each step first adds ``c * sh @ gate_up_B[SLOT, e, rows].T`` to its gate and up columns (``sh [T, 2R]``,
    the gate/up shrink), and sums ``mid += act @ a_cat[SLOT, :, k].T`` (``a_cat [S, R, n*F]``) as it goes;
    after the loop ``out += c * mid @ down_B[SLOT, 0, rows].T`` (``down_B [S, 1, H, R]``, ``mid`` rounded to
    the weights' dtype as the backend's down kernel does). The factors' rows come in with the weight tiles
    (no trip after the stream); every program reads all of ``gate_up_B[SLOT]`` and ``a_cat[SLOT]``."""
    hs = tl.program_id(0) * BH + tl.arange(0, BH)
    h_ok = hs < H
    ts = tl.arange(0, BT)
    t_ok = ts < T
    y_row = y_ptr + ts[:, None] * (N_EXP * 2 * F)
    kb = tl.cdiv(F, BK)
    acc = tl.zeros((BH, BT), dtype=tl.float32)
    if HAS_LORA:
        r = tl.arange(0, BR)
        r_ok = r < R
        scale = tl.load(scale_ptr + SLOT)
        sh_ld = t_ok[:, None] & r_ok[None, :]
        sg = tl.load(sh_ptr + ts[:, None] * (2 * R) + r[None, :], mask=sh_ld, other=0.0)            # [BT, BR]
        su = tl.load(sh_ptr + ts[:, None] * (2 * R) + R + r[None, :], mask=sh_ld, other=0.0)
        mid = tl.zeros((BT, BR), dtype=tl.float32)
    for i in tl.range(0, N_EXP * kb, num_stages=STAGES):
        e = i // kb
        f0 = (i - e * kb) * BK
        fs = f0 + tl.arange(0, BK)
        f_ok = fs < F
        w = tl.load(w2_ptr + e * W2_E + hs[:, None] * W2_H + fs[None, :], mask=h_ok[:, None] & f_ok[None, :],
                    other=0.0)                                                                   # [BH, BK]
        if INTERLEAVED:
            jj = tl.arange(0, 2 * BK)
            gu = tl.load(y_row + e * 2 * F + 2 * f0 + jj[None, :], mask=t_ok[:, None] & (2 * f0 + jj < 2 * F)[None, :],
                         other=0.0).to(tl.float32)                                               # [BT, 2*BK]
            gate, up = tl.split(tl.reshape(gu, (BT, BK, 2)))
        else:
            ld = t_ok[:, None] & f_ok[None, :]
            gate = tl.load(y_row + e * 2 * F + fs[None, :], mask=ld, other=0.0).to(tl.float32)
            up = tl.load(y_row + e * 2 * F + F + fs[None, :], mask=ld, other=0.0).to(tl.float32)
        if HAS_LORA:
            b_rows = gb_ptr + (SLOT * N_EXP + e) * 2 * F * R + fs[:, None] * R + r[None, :]
            b_ok = f_ok[:, None] & r_ok[None, :]
            bg = tl.load(b_rows, mask=b_ok, other=0.0)                                            # [BK, BR]
            bu = tl.load(b_rows + F * R, mask=b_ok, other=0.0)
            gate += scale * tl.dot(sg, tl.trans(bg))
            up += scale * tl.dot(su, tl.trans(bu))
        gam = tl.load(gam_ptr + ts * N_EXP + e, mask=t_ok, other=0.0).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate)) * up * gam[:, None]).to(y_ptr.dtype.element_ty)    # [BT, BK]
        acc = tl.dot(w, tl.trans(act).to(w.dtype), acc)
        if HAS_LORA:
            da = tl.load(acat_ptr + (SLOT * R + r)[None, :] * (N_EXP * F) + (e * F + fs)[:, None],
                         mask=f_ok[:, None] & r_ok[None, :], other=0.0)                          # [BK, BR]
            mid = tl.dot(act.to(da.dtype), da, mid)
    if HAS_LORA:  # down_B's rows after the loop: held through it, they cost registers the stream needs
        db = tl.load(db_ptr + (SLOT * H + hs)[:, None] * R + r[None, :], mask=h_ok[:, None] & r_ok[None, :],
                     other=0.0)                                                                     # [BH, BR]
        acc += scale * tl.dot(db, tl.trans(mid.to(db.dtype)))
    tl.store(out_ptr + ts[None, :] * H + hs[:, None], acc.to(out_ptr.dtype.element_ty),
             mask=h_ok[:, None] & t_ok[None, :])
