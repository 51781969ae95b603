"""v25 and v26 (issue 26 target 1; KERNEL_NOTES.md v25, v26): a few tokens of one slot in two steps where
the kit and sglang's base run three (cuBLAS, an activation kernel, cuBLAS). ``kept_forward``, on a slot whose
merge is kept (``SharedSinkLoRA.keep_merged``): cuBLAS's ``y = x @ w13_s.T`` on the slot's copy and
``act_down_kernel``, the down GEMM with the activation made inside its K loop, or ``up_act_kernel``, the up
GEMM with the activation in its epilogue (v26: its ``H`` split over ``Tiles.split`` programs a tile), and
cuBLAS's down GEMM. ``slot_forward``, on the pool with nothing kept: cuBLAS's ``y`` with the gate/up shrink
beside it, then ``act_down_kernel`` with the slot's LoRA in the same K loop. ``slot_up_forward`` (v26), on
the pool with nothing kept: ``up_act_kernel`` with the slot's gate/up shrink in its K loop, the expand, the
activation and the down shrink in its epilogue, then one cuBLAS GEMM over ``[act | c * mid]`` and
``[w2_lin; down_B^T]``.

Shapes in the SPEC's symbols: ``x [T, H]``, ``gammas [T, n]``, a kept row's ``w13_s [n*2F, H]`` (rows as
``w13_lin``'s) and ``w2_s^T [H, n*F]`` (``merged.KeptMerges``), ``out [T, H]``. Measured on an H100 (v25,
``data/profiles/h100_act_down.json``): only the up fold was ahead of the kept path's three launches, at A, B
and Inkling; where a fold is faster than the path it would replace, its kernel moves into
``inkling_lab/forward/kernels.py`` and ``plan`` routes to it; if not, this folder keeps the measured attempt.
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
    """``up_act_kernel``'s float32 workspace and int32 counters, zero (the kernel leaves them so): for a split
    up GEMM ``[T, n*2F]`` and a counter per tile, for the slot fold ``[R, T]`` (its down shrink) and one."""
    n, F = ops.n, ops.intermediate
    R = ops.buffers[0].shape[2] // 2 if ops.buffers is not None else 0
    size = max(num_tokens * n * 2 * F if t.split > 1 else 1, num_tokens * R)
    return (torch.zeros(size, dtype=torch.float32, device=device),
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
        up_act_kernel[(n * triton.cdiv(F, t.bh) * t.split,)](
            x, w13, gammas, act, ws, cnt, x, x, x, x, T, H, F, n, row_step, up_offset, n * F, 0, 0,
            BF=t.bh, BR=16, SPLIT=t.split, HAS_LORA=False, **meta)
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


def down_weights(ops) -> torch.Tensor:
    """``[w2_lin; 0] [n*F + R, H]``: the base down weight with ``R`` rows that ``slot_up_forward`` fills with
    its slot's ``down_B[slot, 0].T`` before each down GEMM."""
    R = ops.buffers[0].shape[2] // 2
    w = torch.zeros(ops.n * ops.intermediate + R, ops.hidden, dtype=ops.dtype, device=ops.device)
    w[:ops.n * ops.intermediate] = ops.w2_lin
    return w


DOWNS = ("ext", "addmm")
"""How ``slot_up_forward``'s down side adds the LoRA: one GEMM over the extended K (``down_weights``), or
cuBLAS's base GEMM then ``out += (c * mid) @ down_B^T`` (``addmm``)."""


def slot_up_forward(ops, x: torch.Tensor, gammas: torch.Tensor, slot: int, scalings: torch.Tensor,
                    out: torch.Tensor, t: Tiles, w2_ext: torch.Tensor,
                    work: tuple[torch.Tensor, torch.Tensor] | None = None, down: str = "ext") -> torch.Tensor:
    """``out [T, H]`` for every token of ``x [T, H]`` on pool slot ``slot`` (shared outer, nothing kept) at
    ``scalings[slot]`` (``scalings [S]`` float32 on ``x``'s device) in two steps: ``up_act_kernel`` with
    ``HAS_LORA`` on the base ``w13_lin`` writes ``[act | c * mid] [T, n*F + R]`` (beside it, on a side stream,
    ``down_B[slot, 0].T`` is copied into the last ``R`` rows of ``w2_ext``, ``down_weights``'), then
    ``down="ext"``: ``out = [act | c*mid] @ w2_ext`` (one cuBLAS GEMM, the down LoRA as ``R`` more steps of
    ``K``); ``"addmm"``: ``out = act @ w2_lin``, then ``out += (c*mid) @ down_B[slot, 0].T``."""
    T, H = x.shape
    if not ops.shared_outer:
        raise ValueError("act_down: slot_up_forward takes the shared outer layout (O = 1); per-expert outer "
                         "factors run the backend's own paths")
    if down not in DOWNS:
        raise ValueError(f"act_down: down {down!r} is not one of {DOWNS}")
    if t.split != 1:
        raise ValueError("act_down: slot_up_forward reduces its shrink in each program's own K loop; split 1")
    meta = _launch_options(T, t)
    n, F = ops.n, ops.intermediate
    ga, gb, _, db = ops.buffers
    R = ga.shape[2] // 2
    if not 0 <= slot < ga.shape[0]:
        raise ValueError(f"act_down: slot {slot} is not in the pool of {ga.shape[0]} slots")
    ws, cnt = work if work is not None else workspace(ops, T, t, x.device)
    act = torch.empty(T, n * F + R, dtype=x.dtype, device=x.device)
    side = triton_backend._Beside(x, down == "ext")  # joined below: a stream never forked must not be
    with side:                                         # waited on inside a graph capture
        if down == "ext":
            w2_ext[n * F:].copy_(db[slot, 0].T)
    row_step, up_offset = (2, 1) if ops.interleaved else (1, F)
    programs = n * triton.cdiv(F, t.bh)
    up_act_kernel[(programs,)](x, ops.w13_lin, gammas, act, ws, cnt, ga, gb, ops.a_cat, scalings,
                               T, H, F, n, row_step, up_offset, n * F + R, R, slot,
                               BF=t.bh, BR=max(16, triton.next_power_of_2(R)), SPLIT=1, HAS_LORA=True,
                               PROGRAMS=programs, **meta)
    side.join()
    if down == "ext":
        return torch.mm(act, w2_ext, out=out)
    torch.mm(act[:, :n * F], ops.w2_lin, out=out)
    return out.addmm_(act[:, n * F:], db[slot, 0].T)


@triton.jit
def up_act_kernel(x_ptr, w13_ptr, gam_ptr, act_ptr, ws_ptr, cnt_ptr, ga_ptr, gb_ptr, acat_ptr, scale_ptr,
                  T, H, F, N_EXP, ROW_STEP, UP_OFFSET, LDA, R, SLOT,
                  BT: tl.constexpr, BF: tl.constexpr, BK: tl.constexpr, BR: tl.constexpr, STAGES: tl.constexpr,
                  SPLIT: tl.constexpr, HAS_LORA: tl.constexpr, PROGRAMS: tl.constexpr = 1):
    """The up GEMM with the activation in its epilogue, grid ``(n * cdiv(F, BF) * SPLIT,)``: program ``(e,
    block, k)`` streams the gate rows and the up rows of ``BF`` features of expert ``e`` of ``w13 [n*2F, H]``
    (a kept ``w13_s`` or the base ``w13_lin``; gate row of feature ``f`` ``e*2F + f*ROW_STEP``, its up row
    ``UP_OFFSET`` further, as ``kernels.up_kernel`` reads them) across slice ``k`` of ``H`` in ``BK`` steps
    (``STAGES`` in flight), the weight rows on the MMA's M side and the tokens on N (``T <= BT``); then
    ``act[t, e*F + f] = silu(gate) * up * gamma[t, e]`` into ``act`` (rows ``LDA`` long).

    ``SPLIT > 1`` (v26, a kept copy): the ``SPLIT`` programs of a tile add their partial gate and up into the
    float32 workspace ``ws [T, n*2F]`` and count themselves in ``cnt[tile]`` (``kernels._split_reduce``); the
    last to arrive runs the epilogue and leaves both zero. Without ``HAS_LORA`` gate and up are rounded to
    ``x``'s dtype first, as cuBLAS's ``y`` holds them (the kept path's three launches, bit for bit).

    ``HAS_LORA`` (v26, ``SPLIT`` 1; every token on slot ``SLOT`` of a shared-outer pool of rank ``R``, ``c =
    scale[SLOT]``): the K loop also reduces the gate/up shrink ``sh = x @ gate_up_A[SLOT, 0].T`` (``x`` is read
    there anyway; every program reads all of ``gate_up_A[SLOT]``, ``2R`` rows beside its ``2 BF``), the
    epilogue adds ``c * sh @ gate_up_B[SLOT, e, rows].T`` to gate and up before the activation, and sums this
    block's share of the down shrink ``act @ a_cat[SLOT, :, cols].T`` into ``ws [R, T]``, counted in
    ``cnt[0]``; the last of the grid's ``PROGRAMS`` writes ``c * mid`` in ``x``'s dtype into columns ``n*F ...
    n*F + R`` of ``act`` (whose rows are ``LDA = n*F + R`` long), and leaves ``ws`` and ``cnt`` zero. So one
    cuBLAS GEMM of ``act`` with ``[w2_lin; down_B[SLOT, 0].T]`` (``[n*F + R, H]``) is the down side, LoRA and
    all."""
    pid = tl.program_id(0)
    tile = pid // SPLIT
    fb = tl.cdiv(F, BF)
    e = tile // fb
    fs = (tile % fb) * BF + tl.arange(0, BF)
    f_ok = fs < F
    g_row = e * 2 * F + fs * ROW_STEP
    ts = tl.arange(0, BT)
    t_ok = ts < T
    acc_g = tl.zeros((BF, BT), dtype=tl.float32)
    acc_u = tl.zeros((BF, BT), dtype=tl.float32)
    if HAS_LORA:
        r = tl.arange(0, BR)
        r_ok = r < R
        a_row = ga_ptr + (SLOT * 2 * R + r)[:, None] * H
        sh_g = tl.zeros((BR, BT), dtype=tl.float32)
        sh_u = tl.zeros((BR, BT), dtype=tl.float32)
    k_per = tl.cdiv(tl.cdiv(H, SPLIT), BK) * BK
    k_lo = (pid % SPLIT) * k_per
    for k in tl.range(k_lo, tl.minimum(H, k_lo + k_per), BK, num_stages=STAGES):
        kk = k + tl.arange(0, BK)
        k_ok = kk < H
        w_ok = f_ok[:, None] & k_ok[None, :]
        wg = tl.load(w13_ptr + g_row[:, None] * H + kk[None, :], mask=w_ok, other=0.0)                 # [BF, BK]
        wu = tl.load(w13_ptr + (g_row + UP_OFFSET)[:, None] * H + kk[None, :], mask=w_ok, other=0.0)
        xt = tl.load(x_ptr + ts[:, None] * H + kk[None, :], mask=t_ok[:, None] & k_ok[None, :], other=0.0)
        acc_g = tl.dot(wg, tl.trans(xt), acc_g)
        acc_u = tl.dot(wu, tl.trans(xt), acc_u)
        if HAS_LORA:
            a_ok = r_ok[:, None] & k_ok[None, :]
            ag = tl.load(a_row + kk[None, :], mask=a_ok, other=0.0)                                      # [BR, BK]
            au = tl.load(a_row + R * H + kk[None, :], mask=a_ok, other=0.0)
            sh_g = tl.dot(ag, tl.trans(xt), sh_g)
            sh_u = tl.dot(au, tl.trans(xt), sh_u)
    ok = f_ok[:, None] & t_ok[None, :]
    if SPLIT > 1:
        j = tl.arange(0, 2)
        ws = ws_ptr + ts[None, :, None] * (N_EXP * 2 * F) + e * 2 * F + fs[:, None, None] + j[None, None, :] * F
        both, arrived = kernels._split_reduce(tl.join(acc_g, acc_u), ws, ok[:, :, None] & (j < 2)[None, None, :],
                                              cnt_ptr + tile, SPLIT)
        acc_g, acc_u = tl.split(both)
        ok = ok & ((ts * 0 + arrived) == SPLIT - 1)[None, :]  # only the last program of the tile writes
    lp = act_ptr.dtype.element_ty
    if HAS_LORA:
        scale = tl.load(scale_ptr + SLOT)
        b_rows = gb_ptr + (SLOT * N_EXP + e) * 2 * F * R + fs[:, None] * R + r[None, :]
        b_ok = f_ok[:, None] & r_ok[None, :]
        bg = tl.load(b_rows, mask=b_ok, other=0.0)                                                      # [BF, BR]
        bu = tl.load(b_rows + F * R, mask=b_ok, other=0.0)
        gate = acc_g + scale * tl.dot(bg, sh_g.to(bg.dtype))
        up = acc_u + scale * tl.dot(bu, sh_u.to(bu.dtype))
    else:
        gate = acc_g.to(lp).to(tl.float32)
        up = acc_u.to(lp).to(tl.float32)
    gam = tl.load(gam_ptr + ts * N_EXP + e, mask=t_ok, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate)) * up * gam[None, :]).to(lp)                                  # [BF, BT]
    tl.store(act_ptr + ts[None, :] * LDA + e * F + fs[:, None], act, mask=ok)
    if HAS_LORA:
        da = tl.load(acat_ptr + (SLOT * R + r)[:, None] * (N_EXP * F) + (e * F + fs)[None, :],
                     mask=r_ok[:, None] & f_ok[None, :], other=0.0)                                      # [BR, BF]
        m_ok = r_ok[:, None] & t_ok[None, :]
        mid, arrived = kernels._split_reduce(tl.dot(da, tl.where(ok, act, 0.0).to(da.dtype)),
                                             ws_ptr + r[:, None] * T + ts[None, :], m_ok, cnt_ptr, PROGRAMS)  # [BR, BT]
        tl.store(act_ptr + ts[None, :] * LDA + N_EXP * F + r[:, None], (scale * mid).to(lp),
                 mask=m_ok & ((ts * 0 + arrived) == PROGRAMS - 1)[None, :])


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
