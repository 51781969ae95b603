"""Swap-AB weight streaming for 2-32 tokens (issue 26, v16; docs/reference.md#the-forward).

The few-token forward is a weight stream; ``kernels.up_kernel`` puts the tokens on the
MMA's M side, a 16-row tile padded from 2-32 tokens, with narrow weight tiles. Here the
products are computed transposed, ``y^T = w13_lin @ x^T`` and ``out^T = w2_lin^T @ act^T``:
the weight rows are the M operand (``2*BF`` gate/up rows of ``w13``, ``BH`` rows of ``w2``,
each contiguous in its ``K``) and the few tokens the N side (``BN`` = 16 or 32, padded), so
a program streams wide ``[rows, BK]`` weight tiles that Triton's software pipeline
(``num_stages``) keeps several deep in shared memory, as cuBLAS's GEMV-shaped GEMMs do.

The launches are the three of the weight-streaming path: ``kernels.shrink_kernel`` (the
gate/up LoRA shrink into ``sh``, unchanged), then

1. ``swap_up_kernel``: per block of ``BF`` features of expert ``e`` (gate and up rows read
   as pairs, whatever the base layout) and tile of ``BN`` tokens, the base ``y^T`` over
   ``H`` (optionally split into ``SPLIT`` slices reduced by the last arrival,
   ``kernels._split_reduce``), the LoRA expand ``gate_up_B[s, e] @ sh^T`` per slot present,
   SwiGLU x gamma in float32, ``act`` stored once, and the down shrink
   ``down_A[s, e] @ act^T`` added atomically into ``mid [T, O*R]``;
2. ``swap_down_kernel``: per block of ``BH`` rows of ``w2 [n, H, F]`` (rows contiguous in
   ``F``), ``out^T`` over ``K = n*F`` plus ``down_B[s, o] @ mid^T``; it re-zeroes ``sh``.

Shapes in the reference's symbols (docs/reference.md). Weights: ``w13 [n, 2F, H]``, ``w2 [n, H, F]``;
pool: ``gate_up_b [S, n, 2F, R]``, ``down_a [S, n, R, F]``, ``down_b [S, O, H, R]``;
``x [T, H]``, ``act [T, n*F]``, ``out [T, H]``; all contiguous. Slot ``-1`` skips the LoRA.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .kernels import _split_reduce


@triton.jit
def _slot_rows(slot, scale_ptr, c, R, BR: tl.constexpr, SC: tl.constexpr):
    """Every slot's LoRA rows side by side, ``SC`` at a time from row ``c``, so that one dot
    serves several slots of a tile and the chunks' loads pipeline (a loop over slots was
    one dependent memory trip per slot): row ``j`` is rank ``r = j % BR`` of slot
    ``j // BR``. -> ``rows``, ``r``, which rows are real (``r < R``, the slot used by some
    token of the tile: ``slot [BN]``, ``-1`` for none), ``match [SC, BN]`` (row ``j``
    belongs to token ``t``'s slot) and each row's slot scaling."""
    rows = c + tl.arange(0, SC)
    r = rows % BR
    match = (slot[None, :] == (rows // BR)[:, None]) & (r < R)[:, None]
    rows_ok = tl.max(match.to(tl.int32), axis=1) > 0
    scl = tl.load(scale_ptr + rows // BR, mask=rows_ok, other=0.0)
    return rows, r, rows_ok, match, scl


@triton.jit
def swap_up_kernel(x_ptr, w13_ptr, gam_ptr, act_ptr, slot_ptr, scale_ptr, sh_ptr, gb_ptr, da_ptr, mid_ptr,
                   ws_ptr, cnt_ptr, T, H, F, R, O, N_EXP, O_STEP, ROW_STEP, UP_OFFSET,
                   HAS_LORA: tl.constexpr, BN: tl.constexpr, BF: tl.constexpr, BK: tl.constexpr,
                   BR: tl.constexpr, SB: tl.constexpr, SC: tl.constexpr, SPLIT: tl.constexpr, PDL: tl.constexpr = False):
    """Grid ``(cdiv(T, BN) * n * cdiv(F, BF) * SPLIT,)``: ``SPLIT`` consecutive programs share
    one tile (``BN`` tokens by ``BF`` features of expert ``e``: gate row of feature ``f`` is
    ``e*2F + f*ROW_STEP``, its up row ``UP_OFFSET`` further), each reducing a slice of ``H``;
    the split partials meet in ``ws [T, n*2F]`` (gate/up pair order) and ``cnt[tile]``, left
    zero. ``PDL``: the down kernel may launch at once; this kernel, the shrink's
    programmatic dependent, streams ``w13`` before it waits for the shrink (``sh``)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    tile = tl.program_id(0) // SPLIT
    fb_per_e = tl.cdiv(F, BF)
    n_fb = N_EXP * fb_per_e
    pid_t, pid_f = tile // n_fb, tile % n_fb
    e = pid_f // fb_per_e
    f0 = (pid_f % fb_per_e) * BF
    toks = pid_t * BN + tl.arange(0, BN)
    t_ok = toks < T
    jj = tl.arange(0, 2 * BF)  # weight rows as (gate f0, up f0, gate f0+1, up f0+1, ...)
    f_of_j = f0 + jj // 2
    w_row = e * 2 * F + f_of_j * ROW_STEP + (jj % 2) * UP_OFFSET
    w_ok = f_of_j < F
    fs = f0 + tl.arange(0, BF)
    f_ok = fs < F

    acc = tl.zeros((2 * BF, BN), dtype=tl.float32)
    k_per = tl.cdiv(tl.cdiv(H, SPLIT), BK) * BK
    k_lo = (tl.program_id(0) % SPLIT) * k_per
    for k in range(k_lo, tl.minimum(H, k_lo + k_per), BK):
        kk = k + tl.arange(0, BK)
        k_ok = kk < H
        wt = tl.load(w13_ptr + w_row[:, None] * H + kk[None, :], mask=w_ok[:, None] & k_ok[None, :], other=0.0,
                     eviction_policy="evict_first")                                             # [2BF, BK]
        xt = tl.load(x_ptr + toks[:, None] * H + kk[None, :], mask=t_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(wt, tl.trans(xt), acc)                                                     # [2BF, BN]
    if PDL:
        tl.extra.cuda.gdc_wait()
    if SPLIT > 1:
        acc, arrived = _split_reduce(acc, ws_ptr + toks[None, :] * (N_EXP * 2 * F) + e * 2 * F + 2 * f0 + jj[:, None],
                                     w_ok[:, None] & t_ok[None, :], cnt_ptr + tile, SPLIT)
        t_ok = t_ok & ((toks * 0 + arrived) == SPLIT - 1)  # only the last program writes (every store is masked by t_ok)
    gate, up = tl.split(tl.permute(tl.reshape(acc, (BF, 2, BN)), (0, 2, 1)))                    # [BF, BN] each

    o = e * O_STEP
    if HAS_LORA:
        slot = tl.load(slot_ptr + toks, mask=t_ok, other=-1)
        for c in range(0, SB, SC):
            rows, r, rows_ok, match, scl = _slot_rows(slot, scale_ptr, c, R, BR, SC)
            src = sh_ptr + toks[None, :] * (O * 2 * R) + o * 2 * R + r[:, None]
            sg = tl.load(src, mask=match, other=0.0) * scl[:, None]                            # [SC, BN]
            su = tl.load(src + R, mask=match, other=0.0) * scl[:, None]
            b_row = ((rows // BR * N_EXP + e) * 2 * F + fs[:, None]) * R + r[None, :]          # [BF, SC]
            bmask = f_ok[:, None] & rows_ok[None, :]
            bg = tl.load(gb_ptr + b_row, mask=bmask, other=0.0)
            bu = tl.load(gb_ptr + b_row + F * R, mask=bmask, other=0.0)
            gate += tl.dot(bg, sg.to(bg.dtype))
            up += tl.dot(bu, su.to(bu.dtype))

    gam = tl.load(gam_ptr + toks * N_EXP + e, mask=t_ok, other=0.0).to(tl.float32)
    act = gate / (1.0 + tl.exp(-gate)) * up * gam[None, :]
    act_lp = act.to(act_ptr.dtype.element_ty)
    tl.store(act_ptr + toks[None, :] * (N_EXP * F) + e * F + fs[:, None], act_lp, mask=f_ok[:, None] & t_ok[None, :])

    if HAS_LORA:
        for c in range(0, SB, SC):
            rows, r, rows_ok, match, scl = _slot_rows(slot, scale_ptr, c, R, BR, SC)
            da = tl.load(da_ptr + ((rows // BR * N_EXP + e) * R + r)[:, None] * F + fs[None, :],
                         mask=rows_ok[:, None] & f_ok[None, :], other=0.0)                       # [SC, BF]
            m = tl.dot(da, act_lp)                                                               # [SC, BN]
            tl.atomic_add(mid_ptr + toks[None, :] * (O * R) + o * R + r[:, None], m, mask=match)


@triton.jit
def swap_down_kernel(act_ptr, w2_ptr, out_ptr, slot_ptr, scale_ptr, mid_ptr, db_ptr, sh_ptr, ws_ptr, cnt_ptr,
                     T, H, F, R, O, N_EXP,
                     HAS_LORA: tl.constexpr, BN: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr,
                     BR: tl.constexpr, SB: tl.constexpr, SC: tl.constexpr, SPLIT: tl.constexpr, PDL: tl.constexpr = False):
    """Grid ``(cdiv(T, BN) * cdiv(H, BH) * SPLIT,)``: ``out^T [BH, BN]`` over ``K = n*F`` in
    ``cdiv(F, BK)`` steps inside each expert (every load contiguous in ``F``), split over
    ``SPLIT`` consecutive programs reduced through ``ws [T, H]`` and ``cnt`` as the up kernel
    does; the last adds ``Σ_o down_B[s, o] @ mid[:, o]^T`` per slot, and the tiles of the
    first row block zero ``sh`` for the next forward. ``PDL``: launched as the up kernel's
    programmatic dependent, it waits for it (``gdc_wait``) before reading anything."""
    tile = tl.program_id(0) // SPLIT
    n_hb = tl.cdiv(H, BH)
    pid_t, pid_h = tile // n_hb, tile % n_hb
    if PDL:
        tl.extra.cuda.gdc_wait()
    toks = pid_t * BN + tl.arange(0, BN)
    t_ok = toks < T
    hs = pid_h * BH + tl.arange(0, BH)
    h_ok = hs < H
    acc = tl.zeros((BH, BN), dtype=tl.float32)
    kb = tl.cdiv(F, BK)
    per = tl.cdiv(N_EXP * kb, SPLIT)
    i_lo = (tl.program_id(0) % SPLIT) * per
    for i in range(i_lo, tl.minimum(N_EXP * kb, i_lo + per)):
        e = i // kb
        fs = (i - e * kb) * BK + tl.arange(0, BK)
        f_ok = fs < F
        wt = tl.load(w2_ptr + e * H * F + hs[:, None] * F + fs[None, :], mask=h_ok[:, None] & f_ok[None, :],
                     other=0.0, eviction_policy="evict_first")                                  # [BH, BK]
        at = tl.load(act_ptr + toks[:, None] * (N_EXP * F) + e * F + fs[None, :], mask=t_ok[:, None] & f_ok[None, :],
                     other=0.0)                                                                 # [BN, BK]
        acc = tl.dot(wt, tl.trans(at), acc)
    if SPLIT > 1:
        acc, arrived = _split_reduce(acc, ws_ptr + toks[None, :] * H + hs[:, None], h_ok[:, None] & t_ok[None, :],
                                     cnt_ptr + tile, SPLIT)
        t_ok = t_ok & ((toks * 0 + arrived) == SPLIT - 1)  # only the last program writes

    if HAS_LORA:
        slot = tl.load(slot_ptr + toks, mask=t_ok, other=-1)
        for i in range(0, O * SB, SC):  # (outer, chunk of slot rows) pairs, one loop
            o, c = i // SB, i % SB
            rows, r, rows_ok, match, scl = _slot_rows(slot, scale_ptr, c, R, BR, SC)
            m = tl.load(mid_ptr + toks[None, :] * (O * R) + o * R + r[:, None], mask=match, other=0.0) * scl[:, None]
            b = tl.load(db_ptr + ((rows // BR * O + o) * H + hs[:, None]) * R + r[None, :],
                        mask=h_ok[:, None] & rows_ok[None, :], other=0.0)                       # [BH, SC]
            acc += tl.dot(b, m.to(b.dtype))
        if pid_h == 0:
            j = tl.arange(0, 2 * BR)
            for o in range(0, O):
                tl.store(sh_ptr + toks[None, :] * (O * 2 * R) + o * 2 * R + (j // BR * R + j % BR)[:, None],
                         tl.zeros((2 * BR, BN), dtype=tl.float32), mask=(j % BR < R)[:, None] & t_ok[None, :])
    tl.store(out_ptr + toks[None, :] * H + hs[:, None], acc, mask=h_ok[:, None] & t_ok[None, :])
