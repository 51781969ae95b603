"""The three Triton kernels of the batched shared-sink forward (docs/reference.md#the-base-module, #the-forward).

One forward is three launches, each reading its weights once:

1. ``shrink_kernel``: ``sh[t, o, 0:2R] += x[t, kslice] @ gate_up_A[s(t), o, :, kslice].T``,
   the gate/up LoRA shrink, split over ``H`` into atomically added slices so that a
   few tokens still keep many multiprocessors busy. It also zeroes ``mid``.
2. ``up_kernel``: per tile of tokens and of ``BF`` features of one expert,
   ``gate, up = x @ w13[e, rows].T`` (one dot: the tile's weight rows are read as
   gate/up pairs, whatever the base layout), plus the LoRA expand
   ``shrink @ gate_up_B[s, e].T`` for each slot present in the tile, then
   ``act = silu(gate) * up * gamma`` in float32, stored once in the working dtype,
   and the down shrink ``act @ down_A[s, e].T`` atomically added into ``mid [T, O, R]``
   (for the shared outer, ``O = 1`` and the add over experts *is* the expert sum).
3. ``down_kernel``: ``out = act @ w2_lin + Σ_o mid[:, o] @ down_B[s, o].T`` per slot,
   and ``sh`` zeroed again for the next forward. Where every token is on one slot of small
   weights (v52, ``SHRINK``), it makes ``mid`` itself from the ``act`` it streams and the up
   kernel adds nothing into it.

One token runs the shrink, then ``gemv_up_kernel`` and ``gemv_down_kernel`` in place of 2 and 3: the same
epilogues, but each program streams a few weight rows across all of ``K`` with no
16-token tile (the GEMV path, at the end of this file).

For many tokens the two base GEMMs are cuBLAS's (it runs them near the matmul
ceiling, see KERNEL_NOTES.md): ``up_kernel`` then reads ``y = x @ w13_lin.T``
(``Y_IN``) instead of computing it, or, where the tokens run in long runs of one slot (one slot
always), ``expand_act_kernel`` adds the gate/up expand and takes the activation, each program
keeping one slot's gate-up B and walking that slot's rows (v36); a second ``shrink_kernel`` launch computes the
down shrink from ``act`` (each shrink on a side stream beside the cuBLAS GEMM that reads
the same input, ``triton_backend._Beside``), and ``down_kernel`` adds only the LoRA term
onto cuBLAS's ``out = act @ w2_lin`` (``expand_down_kernel`` where the tokens run in long runs of one slot, each
program keeping one slot's down B and walking its rows: v38), or (several slots, many tokens, low ranks: v37)
``spread_kernel`` puts each token's scaled down shrink in its slot's block of extra ``K`` columns and one cuBLAS GEMM
writes ``out``. Where the tokens per slot are many,
``merge_kernel`` writes each slot's merged weights instead (``w13_lin + W1Δ_s A_s``,
``w2_lin + a_cat_s^T B_s^T``) and cuBLAS runs the base forward's GEMMs on them
(``triton_backend._launch_merged``): ``up_kernel`` is then the activation alone. A few tokens of one
slot whose merge the sink keeps take ``up_act_kernel``, the up GEMM on the copy with the activation in
its epilogue, and cuBLAS's down GEMM: two launches where the base forward takes three. With ``HAS_LORA``
the same kernel is the up launch of the pool's LoRA for one slot at 2-16 tokens on the TP-8 slice
(``triton_backend.lora_ups``, v33): ``up_kernel``'s epilogue transposed, between the shrink and the down kernel.

Each slot's LoRA terms are scaled by ``scalings[s]`` of the batch (1 unless told:
the pool folds ``lora_alpha / r`` into B). No token order is assumed: every tile reads its tokens' slots and loops over the
slots it holds (tokens grouped by slot make that one slot per tile almost always), or, with ``GATHER``
(a few tokens of several slots at a low rank, ``triton_backend.gathers``), reads each token's own slot's
factors as a ``[BM, GATHER, BF]`` register tile, so a tile costs the same whatever slots it holds.
Slot ``-1`` (base only, or a rank-0 slot) skips the LoRA terms. The per-expert outer
layout (``O = n``) runs through the same code: expert ``e`` uses outer index
``o = e * O_STEP`` with ``O_STEP = 1``, the shared outer ``O_STEP = 0``.

Shapes in the reference's symbols (docs/reference.md). Weights: ``w13 [n, 2F, H]``, ``w2 [n, H, F]``; pool:
``gate_up_a [S, O, 2R, H]``, ``gate_up_b [S, n, 2F, R]``, ``down_a [S, n, R, F]``,
``down_b [S, O, H, R]``; all contiguous.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile_slots(slot_ptr, rows, row_ok):
    """The tile's token slots and the range of real slots in it (empty when none)."""
    slot = tl.load(slot_ptr + rows, mask=row_ok, other=-1)
    smin = tl.min(tl.where(slot >= 0, slot, 1 << 30), axis=0)
    smax = tl.max(slot, axis=0)
    return slot, smin, smax


@triton.jit
def _row_slots(slot_ptr, scale_ptr, rows, row_ok):
    """Each token's own slot for the gathered epilogues (``GATHER``): which rows have one, that
    slot (0 where none: an address to mask), and its scaling (0.0 where none)."""
    slot = tl.load(slot_ptr + rows, mask=row_ok, other=-1)
    live = row_ok & (slot >= 0)
    sl = tl.where(live, slot, 0)
    return live, sl, tl.load(scale_ptr + sl, mask=live, other=0.0)


@triton.jit
def _grouped_tile(pid, n_m, n_cols, GROUP_M: tl.constexpr):
    """Program ``pid`` -> (token tile, column tile) in grouped order: ``GROUP_M`` token
    tiles walk the same weight columns while those sit in L2."""
    group = GROUP_M * n_cols
    first_m = (pid // group) * GROUP_M
    size_m = tl.minimum(n_m - first_m, GROUP_M)
    return first_m + (pid % group) % size_m, (pid % group) // size_m


@triton.jit
def _split_reduce(acc, ws, ok, cnt, SPLIT: tl.constexpr):
    """Add this program's partial ``acc`` into ``ws`` and count it in ``cnt``; returns
    the full sum and how many programs arrived before this one (``SPLIT - 1``: this is
    the last, the sum is whole, and it has zeroed ``ws`` and ``cnt`` for the next launch)."""
    tl.atomic_add(ws, acc, mask=ok)
    tl.debug_barrier()  # every thread's adds are issued before the count (acq_rel) publishes them
    arrived = tl.atomic_add(cnt, 1)
    # the flag as a tensor of the tile's shape (a scalar mask is not accepted everywhere)
    last = (tl.zeros(acc.shape, dtype=tl.int32) + arrived) == SPLIT - 1
    total = tl.load(ws, mask=ok & last, other=0.0, volatile=True)
    # The compiler may hold `total` in another layout than the zeroing store's (v48's 8 x 8 tile on 4 warps did):
    # then one thread zeroes an element another has yet to read. Every read first, then the zeros.
    tl.debug_barrier()
    tl.store(ws, tl.zeros_like(total), mask=ok & last)
    tl.atomic_xchg(cnt, 0, mask=arrived == SPLIT - 1)
    return total, arrived


@triton.jit
def shrink_kernel(x_ptr, slot_ptr, a_ptr, dst_ptr, mid_ptr,
                  T, K, LDX, X_O_OFF, R, O, A_S, A_O, K_CHUNK,
                  HALVES: tl.constexpr, ZERO_MID: tl.constexpr,
                  BM: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr = False):
    """A LoRA shrink per slot: ``dst[t, o, h*R + r] += x[t, o*X_O_OFF + k] · A[s(t), o, h*R + r, k]``
    over ``k < K``, for ``HALVES`` blocks of ``R`` rows; ``A`` rows are ``K`` long, slot
    ``s`` and outer ``o`` start at row ``s*A_S + o*A_O``; ``x`` rows are ``LDX`` long.

    The gate/up shrink: ``x [T, H]``, ``A = gate_up_A [S, O, 2R, H]``, ``HALVES=2``,
    into ``sh [T, O*2R]``. The down shrink of the cuBLAS path: ``x = act [T, n*F]``
    and ``A = a_cat [S, R, n*F]`` (shared outer, one ``o``) or ``down_A [S, n, R, F]``
    (per expert: ``o = e``, ``X_O_OFF = F``), ``HALVES=1``, into ``mid [T, O*R]``.

    Grid ``(cdiv(T, BM), O * S, SPLIT)``: program ``(m, o*S + s, k)`` adds slice ``k``
    of ``K`` for the tokens of slot ``s`` in tile ``m``; ``dst`` is zero on entry
    (``down_kernel`` re-zeroes ``sh``; ``ZERO_MID``, set on the gate/up shrink, zeroes
    ``mid`` for the down shrink that follows). ``PDL``: the up kernel, launched as its
    programmatic dependent, may start at once (it streams ``w13`` while this runs)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    pid_m, pid_os, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    S = tl.num_programs(1) // O
    o, s_prog = pid_os // S, pid_os % S
    rows = pid_m * BM + tl.arange(0, BM)
    row_ok = rows < T
    slot, smin, smax = _tile_slots(slot_ptr, rows, row_ok)
    # HALVES blocks of BR output columns: column j is block j // BR, rank j % BR.
    j = tl.arange(0, HALVES * BR)
    r = j % BR
    col_ok = r < R
    a_row = s_prog * A_S + o * A_O + (j // BR) * R + r
    k0 = pid_k * K_CHUNK
    x_base = x_ptr + rows[:, None] * LDX + o * X_O_OFF
    # 0 or 1 iterations: this program's slot, if the tile holds it.
    for s in range(tl.maximum(smin, s_prog), tl.minimum(smax + 1, s_prog + 1)):
        acc = tl.zeros((BM, HALVES * BR), dtype=tl.float32)
        for k in range(k0, k0 + K_CHUNK, BK):
            kk = k + tl.arange(0, BK)
            k_ok = kk < K
            xt = tl.load(x_base + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            at = tl.load(a_ptr + a_row[:, None] * K + kk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            acc = tl.dot(xt, tl.trans(at), acc)
        dst = dst_ptr + rows[:, None] * (O * HALVES * R) + o * HALVES * R + (j // BR * R + r)[None, :]
        tl.atomic_add(dst, acc, mask=(row_ok & (slot == s))[:, None] & col_ok[None, :])
    if ZERO_MID:
        if (pid_os == 0) & (pid_k == 0):
            rr = tl.arange(0, BR)
            for oo in range(0, O):
                tl.store(mid_ptr + rows[:, None] * (O * R) + oo * R + rr[None, :],
                         tl.zeros((BM, BR), dtype=tl.float32), mask=row_ok[:, None] & (rr < R)[None, :])


@triton.jit
def _y_tile(y_ptr, rows, row_ok, e, f0, F, N_EXP, BM: tl.constexpr, BF: tl.constexpr, INTERLEAVED: tl.constexpr,
            WIDE: tl.constexpr = True):
    """The gate and up ``[BM, BF]`` float32 tiles of features ``f0..f0+BF`` of expert ``e`` from cuBLAS's ``y [T, n*2F]``
    (rows as in ``w13_lin``), read as contiguous row spans (``INTERLEAVED``: one span of ``2*BF`` gate/up pairs; else
    a gate span and an up span of ``BF``), so the loads vectorize; an index computed per column would not. ``WIDE``:
    the pairs' mask is on the element's own column (``2*f0 + jj < 2*F``), else on its feature's (``f0 + jj // 2 < F``,
    the same elements), which the compiler sees constant over only two elements: for sm_90 ``expand_act_kernel`` then
    copies 4 bytes at a time, 16 with the column's, and ``up_kernel``'s plain loads go from ``ld.global.b32`` to
    ``v4.b32``. Measured (v43, ``h200_activation_v43*.json``): the copies 16 bytes wide took the expand to 0.70-0.92x
    its time, the loads took ``up_kernel``'s bare activation to 0.99-1.09x (median 1.03x), so ``up_kernel`` keeps the
    feature's mask."""
    y_row = y_ptr + rows[:, None] * (N_EXP * 2 * F) + e * 2 * F
    if INTERLEAVED:
        jj = tl.arange(0, 2 * BF)
        ok = (2 * f0 + jj < 2 * F) if WIDE else (f0 + jj // 2 < F)
        pair = tl.load(y_row + 2 * f0 + jj[None, :], mask=row_ok[:, None] & ok[None, :], other=0.0).to(tl.float32)
        gate, up = tl.split(tl.reshape(pair, (BM, BF, 2)))
    else:
        fs = f0 + tl.arange(0, BF)
        y_ok = row_ok[:, None] & (fs < F)[None, :]
        gate = tl.load(y_row + fs[None, :], mask=y_ok, other=0.0).to(tl.float32)
        up = tl.load(y_row + F + fs[None, :], mask=y_ok, other=0.0).to(tl.float32)
    return gate, up


@triton.jit
def up_kernel(x_ptr, w13_ptr, y_ptr, gam_ptr, act_ptr,
              slot_ptr, scale_ptr, sh_ptr, gb_ptr, da_ptr, mid_ptr, ws_ptr, cnt_ptr,
              T, H, F, R, O, N_EXP, O_STEP, ROW_STEP, UP_OFFSET, LD_ACT,
              Y_IN: tl.constexpr, HAS_LORA: tl.constexpr, BM: tl.constexpr, BF: tl.constexpr, BK: tl.constexpr,
              BR: tl.constexpr, GROUP_M: tl.constexpr, INTERLEAVED: tl.constexpr, SPLIT: tl.constexpr,
              PDL: tl.constexpr = False, GATHER: tl.constexpr = 0, MID: tl.constexpr = True):
    """Grid ``(cdiv(T, BM) * n * cdiv(F, BF),)``: one tile of ``BM`` tokens by ``BF``
    features of expert ``e``. Gate row of feature ``f`` is ``e*2F + f*ROW_STEP``, its
    up row ``UP_OFFSET`` further (interleaved: 2, 1; contiguous: 1, F). ``act``'s rows are
    ``LD_ACT`` elements apart (``n*F``, or more where ``act`` is the first ``n*F`` columns of
    the down GEMM's operand ``[act | mid]``).

    With ``Y_IN`` the tile of cuBLAS's ``y`` is read (``_y_tile``) instead of computed.

    ``SPLIT > 1`` (few tokens, weight streaming): ``SPLIT`` consecutive programs share
    a tile, each reducing one slice of ``H``; they add their partial sums into the
    float32 workspace ``ws [T, n*2F]`` (gate/up pair order) and count themselves in
    ``cnt[tile]``; the last to arrive reads the whole sum, leaves the workspace and the
    counter zero again (for the next launch or graph replay) and runs the epilogue.

    ``PDL`` (programmatic dependent launch, few tokens): the down kernel may launch at
    once, and this kernel, launched as the shrink's dependent, streams ``w13`` before it
    waits for the shrink (``gdc_wait``: everything the shrink wrote is visible after it;
    ``x`` and the workspaces were complete before the shrink began). ``MID=False`` (v52): no down shrink
    into ``mid`` (``down_kernel`` makes it from ``act`` itself, ``SHRINK``)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    tile = tl.program_id(0) // SPLIT
    pid_m, pid_f = _grouped_tile(tile, tl.cdiv(T, BM), N_EXP * tl.cdiv(F, BF), GROUP_M)
    fb_per_e = tl.cdiv(F, BF)
    e = pid_f // fb_per_e
    f0 = (pid_f % fb_per_e) * BF

    rows = pid_m * BM + tl.arange(0, BM)
    row_ok = rows < T
    jj = tl.arange(0, 2 * BF)  # weight rows as (gate f0, up f0, gate f0+1, up f0+1, ...)
    f_of_j = f0 + jj // 2
    w_row = e * 2 * F + f_of_j * ROW_STEP + (jj % 2) * UP_OFFSET
    w_ok = f_of_j < F
    fs = f0 + tl.arange(0, BF)
    f_ok = fs < F
    if Y_IN:
        gate, up = _y_tile(y_ptr, rows, row_ok, e, f0, F, N_EXP, BM, BF, INTERLEAVED, WIDE=False)  # v43
    else:
        acc = tl.zeros((BM, 2 * BF), dtype=tl.float32)
        k_per = tl.cdiv(tl.cdiv(H, SPLIT), BK) * BK
        k_lo = (tl.program_id(0) % SPLIT) * k_per
        for k in range(k_lo, tl.minimum(H, k_lo + k_per), BK):
            kk = k + tl.arange(0, BK)
            k_ok = kk < H
            xt = tl.load(x_ptr + rows[:, None] * H + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            wt = tl.load(w13_ptr + w_row[:, None] * H + kk[None, :], mask=w_ok[:, None] & k_ok[None, :],
                         other=0.0)
            acc = tl.dot(xt, tl.trans(wt), acc)
        if PDL:
            tl.extra.cuda.gdc_wait()
        if SPLIT > 1:
            acc, arrived = _split_reduce(acc, ws_ptr + rows[:, None] * (N_EXP * 2 * F) + e * 2 * F + 2 * f0 + jj[None, :],
                                      row_ok[:, None] & w_ok[None, :], cnt_ptr + tile, SPLIT)
            row_ok = row_ok & ((rows * 0 + arrived) == SPLIT - 1)  # only the last program writes (every store below is masked by row_ok)
        gate, up = tl.split(tl.reshape(acc, (BM, BF, 2)))

    if HAS_LORA and GATHER > 0:  # each row its own slot's B, GATHER ranks a step: no loop over the tile's slots
        live, sl, row_scale = _row_slots(slot_ptr, scale_ptr, rows, row_ok)
        o = e * O_STEP
        b_row = (sl * N_EXP + e) * 2 * F * R                                              # [BM]
        for r0 in tl.range(0, BR, GATHER, num_stages=1):  # one step's tiles in registers at a time
            rc = r0 + tl.arange(0, GATHER)
            ld = live[:, None] & (rc < R)[None, :]
            src = sh_ptr + rows[:, None] * (O * 2 * R) + o * 2 * R + rc[None, :]
            m3 = ld[:, :, None] & f_ok[None, None, :]
            b3 = gb_ptr + b_row[:, None, None] + fs[None, None, :] * R + rc[None, :, None]      # [BM, GATHER, BF]
            bg = tl.load(b3, mask=m3, other=0.0)
            bu = tl.load(b3 + F * R, mask=m3, other=0.0)
            sg = tl.load(src, mask=ld, other=0.0).to(bg.dtype).to(tl.float32)
            su = tl.load(src + R, mask=ld, other=0.0).to(bu.dtype).to(tl.float32)
            gate += row_scale[:, None] * tl.sum(sg[:, :, None] * bg.to(tl.float32), axis=1)
            up += row_scale[:, None] * tl.sum(su[:, :, None] * bu.to(tl.float32), axis=1)
    elif HAS_LORA:
        slot, smin, smax = _tile_slots(slot_ptr, rows, row_ok)
        o = e * O_STEP
        r = tl.arange(0, BR)
        r_ok = r < R
        for s in range(smin, smax + 1):
            sel = row_ok & (slot == s)
            scale = tl.load(scale_ptr + s)
            src = sh_ptr + rows[:, None] * (O * 2 * R) + o * 2 * R + r[None, :]
            ld = sel[:, None] & r_ok[None, :]
            sg = tl.load(src, mask=ld, other=0.0)
            su = tl.load(src + R, mask=ld, other=0.0)
            b_base = gb_ptr + (s * N_EXP + e) * 2 * F * R
            bmask = r_ok[:, None] & f_ok[None, :]
            bg = tl.load(b_base + fs[None, :] * R + r[:, None], mask=bmask, other=0.0)        # [BR, BF]
            bu = tl.load(b_base + (F + fs)[None, :] * R + r[:, None], mask=bmask, other=0.0)
            gate += scale * tl.dot(sg.to(bg.dtype), bg)
            up += scale * tl.dot(su.to(bu.dtype), bu)

    gam = tl.load(gam_ptr + rows * N_EXP + e, mask=row_ok, other=0.0).to(tl.float32)
    act = gate / (1.0 + tl.exp(-gate)) * up * gam[:, None]
    act_lp = act.to(act_ptr.dtype.element_ty)
    tl.store(act_ptr + rows[:, None] * LD_ACT + e * F + fs[None, :], act_lp,
             mask=row_ok[:, None] & f_ok[None, :])

    if HAS_LORA and GATHER > 0 and not Y_IN:
        for r0 in tl.range(0, BR, GATHER, num_stages=1):  # one step's tiles in registers at a time
            rc = r0 + tl.arange(0, GATHER)
            ld = live[:, None] & (rc < R)[None, :]
            da = tl.load(da_ptr + ((sl * N_EXP + e) * R)[:, None, None] * F + rc[None, :, None] * F + fs[None, None, :],
                         mask=ld[:, :, None] & f_ok[None, None, :], other=0.0)                # [BM, GATHER, BF]
            m = tl.sum(act_lp.to(tl.float32)[:, None, :] * da.to(tl.float32), axis=2)
            tl.atomic_add(mid_ptr + rows[:, None] * (O * R) + o * R + rc[None, :], m, mask=ld)
    elif HAS_LORA and not Y_IN and MID:
        for s in range(smin, smax + 1):
            sel = row_ok & (slot == s)
            a_sel = tl.where(sel[:, None], act_lp, 0.0).to(act_lp.dtype)
            da = tl.load(da_ptr + ((s * N_EXP + e) * R + r)[None, :] * F + fs[:, None],
                         mask=f_ok[:, None] & r_ok[None, :], other=0.0)                    # [BF, BR]
            m = tl.dot(a_sel, da)
            tl.atomic_add(mid_ptr + rows[:, None] * (O * R) + o * R + r[None, :], m,
                          mask=sel[:, None] & r_ok[None, :])


@triton.jit
def expand_act_kernel(y_ptr, gam_ptr, act_ptr, sh_ptr, gb_ptr, T, F, R, O, N_EXP, O_STEP, LD_ACT, SLOT, scale,
                      run_slot_ptr, run_end_ptr, scale_ptr,
                      BM: tl.constexpr, BF: tl.constexpr, BR: tl.constexpr, INTERLEAVED: tl.constexpr,
                      STAGES: tl.constexpr, RUNS: tl.constexpr = False):
    """The cuBLAS path's gate/up expand and activation over cuBLAS's ``y [T, n*2F]``: ``act = silu(gate) * up *
    gamma`` with ``gate, up += scale_s * sh[:, o, 0:R | R:2R] @ gate_up_B[s, e, f | F+f, :].T``, ``sh [T, O*2R]``:
    every token on slot ``SLOT`` at ``scale`` (the one-slot chain, ``triton_backend._launch_single``), or with
    ``RUNS`` the tokens in runs of one slot each, run ``g`` ending at ``run_ends[g]`` on slot ``run_slots[g]``
    (``-1``: no LoRA) at ``scalings[run_slots[g]]``.

    Grid ``(n * cdiv(F, BF), P)``, with ``RUNS`` ``(n * cdiv(F, BF), G, P)``: program ``(e, block), [g,] p`` loads its
    block's ``[BR, BF]`` tiles of ``gate_up_B`` once and walks the row tiles ``p, p + P, ...`` of its rows (``STAGES``
    in flight, ``cp.async``). ``up_kernel``'s epilogue reloads them for every ``BM`` rows, and ``sh`` for every ``BF``
    features: at 2048 tokens and rank 64 more bytes through L2 than ``y`` and ``act`` move through DRAM (v36). A
    slot loop inside the walk keeps Triton from pipelining it, and without that the kept B bought nothing (v36b):
    hence one slot a program."""
    fb = tl.cdiv(F, BF)
    e = tl.program_id(0) // fb
    f0 = (tl.program_id(0) % fb) * BF
    fs = f0 + tl.arange(0, BF)
    f_ok = fs < F
    r = tl.arange(0, BR)
    if RUNS:
        p, P = tl.program_id(2), tl.num_programs(2)
        lo, hi, s, rank = _run_span(run_slot_ptr, run_end_ptr, tl.program_id(1), R)  # no LoRA: nothing loaded or added
        scale = tl.load(scale_ptr + s)
    else:
        p, P = tl.program_id(1), tl.num_programs(1)
        lo, hi, s, rank = 0, T, SLOT, R
    r_ok = r < rank
    bmask = r_ok[:, None] & f_ok[None, :]
    b_base = gb_ptr + (s * N_EXP + e) * 2 * F * R
    bg = tl.load(b_base + fs[None, :] * R + r[:, None], mask=bmask, other=0.0)                # [BR, BF]
    bu = tl.load(b_base + (F + fs)[None, :] * R + r[:, None], mask=bmask, other=0.0)
    o = e * O_STEP
    for m0 in tl.range(lo + p * BM, hi, P * BM, num_stages=STAGES):
        rows = m0 + tl.arange(0, BM)
        row_ok = rows < hi
        gate, up = _y_tile(y_ptr, rows, row_ok, e, f0, F, N_EXP, BM, BF, INTERLEAVED)
        ld = row_ok[:, None] & r_ok[None, :]
        src = sh_ptr + rows[:, None] * (O * 2 * R) + o * 2 * R + r[None, :]
        sg = tl.load(src, mask=ld, other=0.0)
        su = tl.load(src + R, mask=ld, other=0.0)
        gate += scale * tl.dot(sg.to(bg.dtype), bg)
        up += scale * tl.dot(su.to(bu.dtype), bu)
        gam = tl.load(gam_ptr + rows * N_EXP + e, mask=row_ok, other=0.0).to(tl.float32)
        act = gate / (1.0 + tl.exp(-gate)) * up * gam[:, None]
        tl.store(act_ptr + rows[:, None] * LD_ACT + e * F + fs[None, :], act.to(act_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & f_ok[None, :])


@triton.jit
def expand_down_kernel(out_ptr, mid_ptr, db_ptr, sh_ptr, run_slot_ptr, run_end_ptr, scale_ptr, H, R, SH_COLS,
                       BM: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr, BSH: tl.constexpr, STAGES: tl.constexpr,
                       ZERO_SH: tl.constexpr):
    """The several-slot cuBLAS path's down expand over the batch's runs of one slot (v38): ``out[t, h] += scale_s *
    mid[t, :R] @ down_B[s, 0, h, :R]`` onto cuBLAS's ``out = act @ w2_lin`` ``[T, H]``, ``mid [T, R]`` (float32 or the
    working dtype, rounded to ``down_B``'s dtype as ``down_kernel`` does), shared outer; run ``g`` ends at
    ``run_ends[g]`` on slot ``run_slots[g]`` (``-1``: no LoRA, its rows left as they are) at ``scalings[s]``.

    Grid ``(cdiv(H, BN), G, P)``: program ``(block, g, p)`` loads its ``[BR, BN]`` of slot ``s``'s ``down_B`` once and
    walks the row tiles ``p, p + P, ...`` of run ``g`` (``STAGES`` in flight), as ``expand_act_kernel`` walks the up
    side, where ``down_kernel`` reloads ``down_B`` for every ``BM`` rows. With ``ZERO_SH`` the first column of programs
    also zeroes its rows of ``sh [T, SH_COLS]``, the Triton shrinks' workspace, as ``down_kernel`` does."""
    hs = tl.program_id(0) * BN + tl.arange(0, BN)
    h_ok = hs < H
    p, P = tl.program_id(2), tl.num_programs(2)
    lo, hi, s, rank = _run_span(run_slot_ptr, run_end_ptr, tl.program_id(1), R)
    hi = tl.where(rank > 0, hi, lo)  # a run of no LoRA: nothing to add, nothing to zero
    scale = tl.load(scale_ptr + s)
    r = tl.arange(0, BR)
    r_ok = r < rank
    b = tl.load(db_ptr + (s * H + hs)[None, :] * R + r[:, None], mask=r_ok[:, None] & h_ok[None, :], other=0.0)
    for m0 in tl.range(lo + p * BM, hi, P * BM, num_stages=STAGES):
        rows = m0 + tl.arange(0, BM)
        row_ok = rows < hi
        tile = out_ptr + rows[:, None] * H + hs[None, :]
        ok = row_ok[:, None] & h_ok[None, :]
        acc = tl.load(tile, mask=ok, other=0.0).to(tl.float32)
        m = tl.load(mid_ptr + rows[:, None] * R + r[None, :], mask=row_ok[:, None] & r_ok[None, :], other=0.0)
        acc += scale * tl.dot(m.to(b.dtype), b)
        tl.store(tile, acc.to(out_ptr.dtype.element_ty), mask=ok)
        if ZERO_SH:  # a mask, not a branch, inside the pipelined walk
            _zero_rows(sh_ptr, rows, row_ok & (rows * 0 + tl.program_id(0) == 0), SH_COLS, BM, BSH)


@triton.jit
def spread_kernel(mid_ptr, slot_ptr, scale_ptr, block_ptr, cat_ptr, sh_ptr, db_ptr, used_ptr, rows_ptr,
                  T, R, G, H, LD_CAT, SH_COLS, DB_SLOT, DB_H, DB_R,
                  BM: tl.constexpr, BR: tl.constexpr, BSH: tl.constexpr, BH: tl.constexpr, ZERO_SH: tl.constexpr):
    """The several-slot down shrink ``mid [T, R]`` (float32 or the working dtype) spread into the down GEMM's extra
    ``K`` (v37, ``triton_backend._down_slot_cats``): ``cat[t, g*R + r] = scale_s * mid[t, r]`` where ``g = block[s]``
    is token ``t``'s slot's block, ``0`` in the other ``G - 1`` blocks and in all of a base-only token's; ``cat``
    is the last ``G*R`` columns of ``act_cat [T, n*F + G*R]`` (rows ``LD_CAT`` apart). With ``ZERO_SH`` it also
    zeroes its rows of ``sh [T, SH_COLS]``, the gate/up shrink's workspace, for the next forward (``down_kernel``
    does it on the other paths).

    The same launch writes the GEMM's extra rows of ``K`` (v55): ``rows [G*R, H]`` (``w2_cat``'s rows after ``n*F``)
    block ``g`` is ``down_B[used[g], 0]^T``, read from the pool's ``down_B [S, O, H, R]`` (element strides
    ``DB_SLOT``, ``DB_H``, ``DB_R``). Grid ``(cdiv(T, BM) + G * cdiv(H, BH),)``: the first ``cdiv(T, BM)`` programs
    spread a row tile each, the rest copy ``[BH, R]`` of one block each."""
    pid = tl.program_id(0)
    tiles = tl.cdiv(T, BM)
    r = tl.arange(0, BR)
    r_ok = r < R
    if pid < tiles:
        rows = pid * BM + tl.arange(0, BM)
        row_ok = rows < T
        live, sl, scale = _row_slots(slot_ptr, scale_ptr, rows, row_ok)
        blk = tl.load(block_ptr + sl, mask=live, other=-1)
        m = tl.load(mid_ptr + rows[:, None] * R + r[None, :], mask=live[:, None] & r_ok[None, :], other=0.0)
        v = (scale[:, None] * m.to(tl.float32)).to(cat_ptr.dtype.element_ty)
        keep = row_ok[:, None] & r_ok[None, :]
        for g in range(0, G):
            tl.store(cat_ptr + rows[:, None] * LD_CAT + g * R + r[None, :], tl.where((blk == g)[:, None], v, 0.0),
                     mask=keep)
        if ZERO_SH:
            _zero_rows(sh_ptr, rows, row_ok, SH_COLS, BM, BSH)
    else:
        hb = tl.cdiv(H, BH)
        g = (pid - tiles) // hb
        hs = ((pid - tiles) % hb) * BH + tl.arange(0, BH)
        ok = (hs < H)[:, None] & r_ok[None, :]
        s = tl.load(used_ptr + g)
        b = tl.load(db_ptr + s * DB_SLOT + hs[:, None] * DB_H + r[None, :] * DB_R, mask=ok, other=0.0)
        tl.store(rows_ptr + (g * R + r[None, :]) * H + hs[:, None], b.to(rows_ptr.dtype.element_ty), mask=ok)


@triton.jit
def down_kernel(act_ptr, w2_ptr, out_ptr,
                slot_ptr, scale_ptr, mid_ptr, db_ptr, sh_ptr, ws_ptr, cnt_ptr, acat_ptr,
                T, H, F, R, O, N_EXP,
                BASE: tl.constexpr, HAS_LORA: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                BR: tl.constexpr, GROUP_M: tl.constexpr, SPLIT: tl.constexpr,
                PDL: tl.constexpr = False, GATHER: tl.constexpr = 0, SHRINK: tl.constexpr = False):
    """Grid ``(cdiv(T, BM) * cdiv(H, BN),)``: ``out [BM, BN]`` over ``K = n*F``, read as
    ``cdiv(F, BK)`` steps inside each expert so every load stays contiguous in ``F``.
    ``BASE=False``: ``out`` holds cuBLAS's ``act @ w2_lin`` already and the LoRA term is added to it.
    The first column of tiles then zeroes ``sh`` for the next forward. ``SPLIT > 1``:
    consecutive programs split the ``K`` steps of a tile and reduce through
    ``ws [T, H]`` and ``cnt`` as ``up_kernel`` does; the last adds the LoRA term.

    ``PDL``: launched as the up kernel's programmatic dependent, it starts while the up
    kernel streams and waits for it (``gdc_wait``) before reading anything it wrote.

    ``SHRINK`` (v52; ``BASE``, unsplit, one slot, shared outer): the down shrink made here, every program from the
    ``act`` tiles its loop reads anyway and ``acat [S, R, n*F]`` (``a_cat``), in place of ``mid``, which the up
    kernel then leaves alone (``MID=False``): no atomics onto ``mid``, no wait on them."""
    tile = tl.program_id(0) // SPLIT
    pid_m, pid_n = _grouped_tile(tile, tl.cdiv(T, BM), tl.cdiv(H, BN), GROUP_M)
    if PDL:
        tl.extra.cuda.gdc_wait()

    rows = pid_m * BM + tl.arange(0, BM)
    row_ok = rows < T
    hs = pid_n * BN + tl.arange(0, BN)
    h_ok = hs < H
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if not BASE:
        acc = tl.load(out_ptr + rows[:, None] * H + hs[None, :], mask=row_ok[:, None] & h_ok[None, :],
                      other=0.0).to(tl.float32)
    if BASE:
        if SHRINK:  # the tile's one slot (its rows' largest: every LoRA row has it; -1: none)
            _, _, s_one = _tile_slots(slot_ptr, rows, row_ok)
            rf = tl.arange(0, BR)
            a_ok = (rf < R) & ((rf * 0 + s_one) >= 0)  # the flag as a tensor (a scalar mask is not accepted everywhere)
            mid_acc = tl.zeros((BM, BR), dtype=tl.float32)
        kb = tl.cdiv(F, BK)
        per = tl.cdiv(N_EXP * kb, SPLIT)
        i_lo = (tl.program_id(0) % SPLIT) * per
        for i in range(i_lo, tl.minimum(N_EXP * kb, i_lo + per)):
            e = i // kb
            fs = (i - e * kb) * BK + tl.arange(0, BK)
            f_ok = fs < F
            at = tl.load(act_ptr + rows[:, None] * (N_EXP * F) + e * F + fs[None, :],
                         mask=row_ok[:, None] & f_ok[None, :], other=0.0)
            wt = tl.load(w2_ptr + e * H * F + hs[None, :] * F + fs[:, None],
                         mask=f_ok[:, None] & h_ok[None, :], other=0.0)                 # [BK, BN]
            acc = tl.dot(at, wt, acc)
            if SHRINK:
                ac = tl.load(acat_ptr + (s_one * R + rf)[:, None] * (N_EXP * F) + e * F + fs[None, :],
                             mask=a_ok[:, None] & f_ok[None, :], other=0.0)                 # [BR, BK]
                mid_acc = tl.dot(at, tl.trans(ac), mid_acc)
        if SPLIT > 1:
            acc, arrived = _split_reduce(acc, ws_ptr + rows[:, None] * H + hs[None, :], row_ok[:, None] & h_ok[None, :],
                                      cnt_ptr + tile, SPLIT)
            row_ok = row_ok & ((rows * 0 + arrived) == SPLIT - 1)  # only the last program writes

    if HAS_LORA and GATHER > 0:
        live, sl, row_scale = _row_slots(slot_ptr, scale_ptr, rows, row_ok)
        for o in range(0, O):
            for r0 in tl.range(0, BR, GATHER, num_stages=1):  # one step's tiles in registers at a time
                rc = r0 + tl.arange(0, GATHER)
                ld = live[:, None] & (rc < R)[None, :]
                b = tl.load(db_ptr + ((sl * O + o) * H)[:, None, None] * R + hs[None, None, :] * R + rc[None, :, None],
                            mask=ld[:, :, None] & h_ok[None, None, :], other=0.0)            # [BM, GATHER, BN]
                m = tl.load(mid_ptr + rows[:, None] * (O * R) + o * R + rc[None, :], mask=ld, other=0.0)
                m = m.to(b.dtype).to(tl.float32)
                acc += row_scale[:, None] * tl.sum(m[:, :, None] * b.to(tl.float32), axis=1)
    elif HAS_LORA:
        slot, smin, smax = _tile_slots(slot_ptr, rows, row_ok)
        r = tl.arange(0, BR)
        r_ok = r < R
        for s in range(smin, smax + 1):
            sel = row_ok & (slot == s)
            scale = tl.load(scale_ptr + s)
            for o in range(0, O):
                if SHRINK:
                    m = tl.where(sel[:, None] & r_ok[None, :], mid_acc, 0.0)
                else:
                    m = tl.load(mid_ptr + rows[:, None] * (O * R) + o * R + r[None, :],
                                mask=sel[:, None] & r_ok[None, :], other=0.0)
                b = tl.load(db_ptr + ((s * O + o) * H + hs)[None, :] * R + r[:, None],
                            mask=r_ok[:, None] & h_ok[None, :], other=0.0)              # [BR, BN]
                acc += scale * tl.dot(m.to(b.dtype), b)
    if HAS_LORA:
        if pid_n == 0:
            j = tl.arange(0, 2 * BR)
            for o in range(0, O):
                tl.store(sh_ptr + rows[:, None] * (O * 2 * R) + o * 2 * R + (j // BR * R + j % BR)[None, :],
                         tl.zeros((BM, 2 * BR), dtype=tl.float32),
                         mask=row_ok[:, None] & (j % BR < R)[None, :])
    tl.store(out_ptr + rows[:, None] * H + hs[None, :], acc, mask=row_ok[:, None] & h_ok[None, :])


@triton.jit
def slots_kernel(indptr_ptr, widx_ptr, rank_ptr, perm_ptr, slot_ptr,
                 HAS_PERM: tl.constexpr, BLOCK: tl.constexpr):
    """Grid ``(G,)``: each token of segment ``g`` gets its effective slot
    ``weight_indices[g]``, or ``-1`` for base only and rank-0 slots, at its original
    position (``permutation[i]`` when the batch is grouped). Reads the segment
    metadata on the device at every launch, so a captured forward follows in-place
    updates of a device-resident batch."""
    g = tl.program_id(0)
    start = tl.load(indptr_ptr + g)
    end = tl.load(indptr_ptr + g + 1)
    w = tl.load(widx_ptr + g)
    rank = tl.load(rank_ptr + tl.maximum(w, 0))
    eff = tl.where((w >= 0) & (rank != 0), w, -1).to(tl.int32)
    for i in range(start, end, BLOCK):
        pos = i + tl.arange(0, BLOCK)
        ok = pos < end
        if HAS_PERM:
            pos = tl.load(perm_ptr + pos, mask=ok, other=0)
        tl.store(slot_ptr + pos, tl.zeros((BLOCK,), dtype=tl.int32) + eff, mask=ok)


@triton.jit
def merge_kernel(w_ptr, p_ptr, q_ptr, out_ptr, slot_ptr, scale_ptr,
                 M, N, K, W_SM, W_SN, P_SS, P_SM, P_SK, Q_SS, Q_SK, Q_SN,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """A slot's LoRA merged into a base weight, read once and written once:
    ``out[g] = W + scalings[s] * P[s] @ Q[s]`` for ``s = slots[g]``, ``W [M, N]``, ``P[s] [M, K]``
    and ``Q[s] [K, N]`` at any strides (one expert's ``w2_lin`` is a transposed view), ``K <= BK``
    (one dot), ``out [G, M, N]`` contiguous in the weight's dtype. The gate/up side: ``W = w13_lin [n*2F, H]``,
    ``P = w1_delta [S, n*2F, 2R]``, ``Q = gate_up_A[:, 0] [S, 2R, H]``; the down side:
    ``W = w2_lin [n*F, H]``, ``P = a_cat^T [S, n*F, R]``, ``Q = down_B[:, 0]^T [S, R, H]``.

    Grid ``(cdiv(M, BM) * cdiv(N, BN), G)``; the sum in float32, rounded once."""
    tile, g = tl.program_id(0), tl.program_id(1)
    n_cols = tl.cdiv(N, BN)
    rows = (tile // n_cols) * BM + tl.arange(0, BM)
    cols = (tile % n_cols) * BN + tl.arange(0, BN)
    kk = tl.arange(0, BK)
    row_ok, col_ok, k_ok = rows < M, cols < N, kk < K
    s = tl.load(slot_ptr + g)
    pt = tl.load(p_ptr + s * P_SS + rows[:, None] * P_SM + kk[None, :] * P_SK, mask=row_ok[:, None] & k_ok[None, :],
                 other=0.0)
    qt = tl.load(q_ptr + s * Q_SS + kk[:, None] * Q_SK + cols[None, :] * Q_SN, mask=k_ok[:, None] & col_ok[None, :],
                 other=0.0)
    ok = row_ok[:, None] & col_ok[None, :]
    w = tl.load(w_ptr + rows[:, None] * W_SM + cols[None, :] * W_SN, mask=ok, other=0.0).to(tl.float32)
    merged = w + tl.load(scale_ptr + s) * tl.dot(pt, qt)
    tl.store(out_ptr + g.to(tl.int64) * M * N + rows[:, None] * N + cols[None, :], merged, mask=ok)


@triton.jit
def up_act_kernel(x_ptr, w13_ptr, gam_ptr, act_ptr, ws_ptr, cnt_ptr, T, H, F, N_EXP, ROW_STEP, UP_OFFSET,
                  slot_ptr, scale_ptr, sh_ptr, gb_ptr, da_ptr, mid_ptr, R, O, O_STEP,
                  BT: tl.constexpr, BF: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, SPLIT: tl.constexpr,
                  HAS_LORA: tl.constexpr = False, BR: tl.constexpr = 16, PDL: tl.constexpr = False):
    """A few tokens (v25, v26, v33): the up GEMM with the activation in its epilogue, grid
    ``(n * cdiv(F, BF) * SPLIT,)``. Program ``(e, block, k)`` streams the gate rows and the up rows of ``BF``
    features of expert ``e`` of ``w13 [n*2F, H]`` (rows as ``w13_lin``'s: gate row of feature ``f``
    ``e*2F + f*ROW_STEP``, its up row ``UP_OFFSET`` further) across slice ``k`` of ``H`` in ``BK`` steps,
    ``STAGES`` in flight, the weight rows on the MMA's M side and the tokens on N (``T <= BT``, swap-AB: 64
    weight rows fill a wgmma where a 16-token tile would not); then ``act[t, e*F + f] = silu(gate) * up *
    gamma[t, e]``.

    Without ``HAS_LORA`` (a kept slot's copy ``w13_s``): gate and up are rounded to ``x``'s dtype first, as
    cuBLAS's ``y`` holds them, so the forward is the kept path's three launches' bit for bit (unsplit; split,
    the float32 sums' order differs). With ``HAS_LORA`` (the base ``w13``, v33): ``up_kernel``'s epilogue
    transposed, for each slot of the tile's tokens the expand ``gate_up_B[s, e] @ sh^T`` added to gate and up
    (``sh [T, O*2R]``, from the shrink launch before it) and the down shrink ``down_A[s, e] @ act`` added into
    ``mid [T, O*R]`` (outer ``o = e * O_STEP``), each scaled by ``scalings[s]``; slot ``-1`` adds nothing.

    ``SPLIT > 1`` (few feature blocks, long rows: the TP-8 slice): the ``SPLIT`` programs of a tile add their
    partial gate and up into the float32 workspace ``ws [T, n*2F]`` and count themselves in ``cnt[tile]``
    (``_split_reduce``); the last to arrive runs the epilogue and leaves both zero for the next launch.

    ``PDL``: the down kernel may launch at once, and this kernel, launched as the shrink's programmatic
    dependent, streams ``w13`` before it waits for the shrink (``gdc_wait``), as ``up_kernel`` does."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
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
    if PDL:
        tl.extra.cuda.gdc_wait()
    live = t_ok
    if SPLIT > 1:
        j = tl.arange(0, 2)
        ws = ws_ptr + ts[None, :, None] * (N_EXP * 2 * F) + e * 2 * F + fs[:, None, None] + j[None, None, :] * F
        both, arrived = _split_reduce(tl.join(acc_g, acc_u), ws, (f_ok[:, None] & t_ok[None, :])[:, :, None]
                                      & (j < 2)[None, None, :], cnt_ptr + tile, SPLIT)
        acc_g, acc_u = tl.split(both)
        live = t_ok & ((ts * 0 + arrived) == SPLIT - 1)  # only the last program of the tile goes on
    lp = act_ptr.dtype.element_ty
    if HAS_LORA:
        slot, smin, smax = _tile_slots(slot_ptr, ts, live)
        o = e * O_STEP
        r = tl.arange(0, BR)
        r_ok = r < R
        b_ok = f_ok[:, None] & r_ok[None, :]
        for s in range(smin, smax + 1):
            ld = r_ok[:, None] & (live & (slot == s))[None, :]
            scale = tl.load(scale_ptr + s)
            src = sh_ptr + ts[None, :] * (O * 2 * R) + o * 2 * R + r[:, None]                           # [BR, BT]
            sg = tl.load(src, mask=ld, other=0.0)
            su = tl.load(src + R, mask=ld, other=0.0)
            b_base = gb_ptr + (s * N_EXP + e) * 2 * F * R
            bg = tl.load(b_base + fs[:, None] * R + r[None, :], mask=b_ok, other=0.0)                   # [BF, BR]
            bu = tl.load(b_base + (F + fs)[:, None] * R + r[None, :], mask=b_ok, other=0.0)
            acc_g += scale * tl.dot(bg, sg.to(bg.dtype))
            acc_u += scale * tl.dot(bu, su.to(bu.dtype))
        gate, up = acc_g, acc_u
    else:
        gate = acc_g.to(lp).to(tl.float32)
        up = acc_u.to(lp).to(tl.float32)
    gam = tl.load(gam_ptr + ts * N_EXP + e, mask=t_ok, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate)) * up * gam[None, :]).to(lp)                                  # [BF, BT]
    tl.store(act_ptr + ts[None, :] * (N_EXP * F) + e * F + fs[:, None], act, mask=f_ok[:, None] & live[None, :])
    if HAS_LORA:
        for s in range(smin, smax + 1):
            sel = live & (slot == s)
            da = tl.load(da_ptr + ((s * N_EXP + e) * R + r)[:, None] * F + fs[None, :], mask=r_ok[:, None] & f_ok[None, :],
                         other=0.0)                                                                     # [BR, BF]
            m = tl.dot(da, tl.where(sel[None, :], act, 0.0).to(lp))                                     # [BR, BT]
            tl.atomic_add(mid_ptr + ts[None, :] * (O * R) + o * R + r[:, None], m, mask=r_ok[:, None] & sel[None, :])


# The GEMV path (issue 26): for one token the forward is a weight stream, so each program
# owns a few weight rows across all of K and keeps big steps of them in flight (the
# stream-ceiling kernel's shape, ``scripts/gpu/h200_stream_ceiling.py``), instead of a
# 16-token tile padded from one token.

@triton.jit
def _token_slot(slot_ptr, R):
    """The token's slot clamped to 0 (an address to load from) and a rank bound: ``R`` for
    a real slot, 0 for base only (masks ``r < bound`` then load nothing)."""
    s = tl.load(slot_ptr)
    return tl.maximum(s, 0), tl.where(s >= 0, R, 0)


@triton.jit
def _run_span(run_slot_ptr, run_end_ptr, g, R):
    """Run ``g`` of a batch's runs of one slot (``triton_backend.Runs``): its rows ``lo..hi``, its slot clamped to 0
    and its rank bound (``_token_slot``: 0 for a run of no LoRA)."""
    lo = tl.where(g > 0, tl.load(run_end_ptr + tl.maximum(g - 1, 0)), 0)
    s, rank = _token_slot(run_slot_ptr + g, R)
    return lo, tl.load(run_end_ptr + g), s, rank


@triton.jit
def _zero_rows(sh_ptr, rows, ok, SH_COLS, BM: tl.constexpr, BSH: tl.constexpr):
    """Zero the rows ``rows`` (where ``ok``) of the Triton shrinks' float32 workspace ``sh [T, SH_COLS]`` for the next
    forward."""
    c = tl.arange(0, BSH)
    tl.store(sh_ptr + rows[:, None] * SH_COLS + c[None, :], tl.zeros((BM, BSH), dtype=tl.float32),
             mask=ok[:, None] & (c < SH_COLS)[None, :])


@triton.jit
def gemv_up_kernel(x_ptr, w13_ptr, gam_ptr, act_ptr, slot_ptr, scale_ptr, sh_ptr, gb_ptr, da_ptr, mid_ptr,
                   H, F, R, O, N_EXP, O_STEP, ROW_STEP, UP_OFFSET,
                   HAS_LORA: tl.constexpr, BF: tl.constexpr, BK: tl.constexpr, BR: tl.constexpr,
                   PDL: tl.constexpr = False, STAGES: tl.constexpr = 1):
    """One token, grid ``(n * cdiv(F, BF),)``: program ``(e, block)`` streams the ``2*BF``
    gate/up rows of ``BF`` features of expert ``e`` (rows as ``up_kernel`` reads them)
    across all of ``H`` in ``[2*BF, BK]`` steps, the next step's loads issued before this
    step's FMAs, which go into an unreduced float32 tile summed once after the loop. Then
    ``up_kernel``'s epilogue: the LoRA expand from ``sh``, SwiGLU x gamma, ``act``, the down
    shrink added into ``mid``. The token's gate-up B, down A, scaling and gamma are loaded
    before the stream, so the epilogue waits for nothing but ``sh`` (in L2). ``PDL``: the
    down kernel may launch at once; this kernel, the shrink's programmatic dependent,
    streams before it waits for the shrink. ``STAGES`` > 1 (v47): the stream is Triton's
    pipelined loop instead, ``STAGES - 1`` steps in flight through shared memory (16-byte
    ``cp.async``), where the register double buffer holds one."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    fb_per_e = tl.cdiv(F, BF)
    e = pid // fb_per_e
    f0 = (pid % fb_per_e) * BF
    fs = f0 + tl.arange(0, BF)
    f_ok = fs < F
    r = tl.arange(0, BR)
    o = e * O_STEP
    gam = tl.load(gam_ptr + e).to(tl.float32)
    if HAS_LORA:
        s, bound = _token_slot(slot_ptr, R)
        rk = r < bound
        b_base = gb_ptr + (s * N_EXP + e) * 2 * F * R
        bmask = rk[:, None] & f_ok[None, :]
        bg = tl.load(b_base + fs[None, :] * R + r[:, None], mask=bmask, other=0.0).to(tl.float32)        # [BR, BF]
        bu = tl.load(b_base + (F + fs)[None, :] * R + r[:, None], mask=bmask, other=0.0).to(tl.float32)
        da = tl.load(da_ptr + ((s * N_EXP + e) * R + r)[None, :] * F + fs[:, None], mask=f_ok[:, None] & rk[None, :],
                     other=0.0).to(tl.float32)                                                         # [BF, BR]
        scale = tl.load(scale_ptr + s)
    jj = tl.arange(0, 2 * BF)  # (gate f0, up f0, gate f0+1, ...)
    f_of_j = f0 + jj // 2
    w_ok = f_of_j < F
    w_base = w13_ptr + (e * 2 * F + f_of_j * ROW_STEP + (jj % 2) * UP_OFFSET)[:, None] * H
    kk = tl.arange(0, BK)
    acc = tl.zeros((2 * BF, BK), dtype=tl.float32)
    if STAGES > 1:  # the compiler's ring of shared-memory buffers: more bytes in flight for fewer registers
        for k in tl.range(0, H, BK, num_stages=STAGES):
            w = tl.load(w_base + (k + kk)[None, :], mask=w_ok[:, None] & (k + kk < H)[None, :], other=0.0,
                        eviction_policy="evict_first")
            acc += w.to(tl.float32) * tl.load(x_ptr + k + kk, mask=k + kk < H, other=0.0).to(tl.float32)[None, :]
    else:
        w = tl.load(w_base + kk[None, :], mask=w_ok[:, None] & (kk < H)[None, :], other=0.0,
                    eviction_policy="evict_first")
        for k in range(0, H, BK):
            kn = k + BK + kk  # the next step's loads go out before this step's arithmetic
            w_next = tl.load(w_base + kn[None, :], mask=w_ok[:, None] & (kn < H)[None, :], other=0.0,
                             eviction_policy="evict_first")
            xt = tl.load(x_ptr + k + kk, mask=k + kk < H, other=0.0).to(tl.float32)
            acc += w.to(tl.float32) * xt[None, :]
            w = w_next
    gate, up = tl.split(tl.reshape(tl.sum(acc, axis=1), (BF, 2)))
    if PDL:
        tl.extra.cuda.gdc_wait()
    if HAS_LORA:
        sg = tl.load(sh_ptr + o * 2 * R + r, mask=rk, other=0.0)
        su = tl.load(sh_ptr + o * 2 * R + R + r, mask=rk, other=0.0)
        gate += scale * tl.sum(sg[:, None] * bg, axis=0)
        up += scale * tl.sum(su[:, None] * bu, axis=0)
    act = (gate / (1.0 + tl.exp(-gate)) * up * gam).to(act_ptr.dtype.element_ty)
    tl.store(act_ptr + e * F + fs, act, mask=f_ok)
    if HAS_LORA:
        tl.atomic_add(mid_ptr + o * R + r, tl.sum(act.to(tl.float32)[:, None] * da, axis=0), mask=rk)


@triton.jit
def _w2_step(i, kb, BK: tl.constexpr):
    """Step ``i`` of ``gemv_down_kernel``'s walk over ``n`` experts of ``kb`` steps each: its expert and the first
    column of ``F`` it reads."""
    e = i // kb
    return e, (i - e * kb) * BK


@triton.jit
def gemv_down_kernel(act_ptr, w2_ptr, out_ptr, slot_ptr, scale_ptr, mid_ptr, db_ptr, sh_ptr,
                     H, F, R, O, N_EXP, W2_E, W2_H,
                     HAS_LORA: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr, BR: tl.constexpr,
                     PDL: tl.constexpr = False, STAGES: tl.constexpr = 1):
    """One token, grid ``(cdiv(H, BH),)``: program ``p`` streams rows ``p*BH ...`` of
    ``w2 [n, H, F]`` at strides ``(W2_E, W2_H, 1)`` (each expert's ``F`` in ``BK`` steps, two in flight, FMAs into an
    unreduced tile) into ``out = act @ w2_lin + Σ_o mid[o] @ down_B[s, o].T``
    (``down_kernel``'s LoRA term), and program 0 zeroes ``sh`` for the next forward. The
    token's down B (outer 0) and scaling are loaded first. ``PDL``: launched as the up
    kernel's programmatic dependent, it issues those and its first two steps of ``w2``
    (which nothing writes) and only then waits for the up kernel. ``STAGES`` > 1 (v47): as
    ``gemv_up_kernel``'s, the wait for the up kernel before the loop (its first steps read ``act``)."""
    pid = tl.program_id(0)
    hs = pid * BH + tl.arange(0, BH)
    h_ok = hs < H
    r = tl.arange(0, BR)
    if HAS_LORA:
        s, bound = _token_slot(slot_ptr, R)
        rk = r < bound
        db0 = tl.load(db_ptr + (s * O * H + hs)[None, :] * R + r[:, None], mask=rk[:, None] & h_ok[None, :],
                      other=0.0).to(tl.float32)                                                        # [BR, BH]
        scale = tl.load(scale_ptr + s)
    kk = tl.arange(0, BK)
    kb = tl.cdiv(F, BK)
    steps = N_EXP * kb
    w_base = w2_ptr + hs[:, None] * W2_H
    acc = tl.zeros((BH, BK), dtype=tl.float32)
    if STAGES > 1:
        if PDL:
            tl.extra.cuda.gdc_wait()
        for i in tl.range(0, steps, num_stages=STAGES):
            e, f = _w2_step(i, kb, BK)
            fc = f + kk
            w = tl.load(w_base + e * W2_E + fc[None, :], mask=h_ok[:, None] & (fc < F)[None, :], other=0.0,
                        eviction_policy="evict_first")
            acc += w.to(tl.float32) * tl.load(act_ptr + e * F + fc, mask=fc < F, other=0.0).to(tl.float32)[None, :]
    else:
        w = tl.load(w_base + kk[None, :], mask=h_ok[:, None] & (kk < F)[None, :], other=0.0,
                    eviction_policy="evict_first")
        e1, f1 = _w2_step(1, kb, BK)
        f1 += kk
        w1 = tl.load(w_base + e1 * W2_E + f1[None, :], mask=h_ok[:, None] & ((f1 < F) & (kk * 0 + 1 < steps))[None, :],
                     other=0.0, eviction_policy="evict_first")
        if PDL:
            tl.extra.cuda.gdc_wait()
        for i in range(0, steps):
            en, fn = _w2_step(i + 2, kb, BK)
            fn += kk
            w_next = tl.load(w_base + en * W2_E + fn[None, :],
                             mask=h_ok[:, None] & ((fn < F) & (kk * 0 + i + 2 < steps))[None, :],
                             other=0.0, eviction_policy="evict_first")
            e, f = _w2_step(i, kb, BK)
            fc = f + kk
            at = tl.load(act_ptr + e * F + fc, mask=fc < F, other=0.0).to(tl.float32)
            acc += w.to(tl.float32) * at[None, :]
            w = w1
            w1 = w_next
    out = tl.sum(acc, axis=1)
    if HAS_LORA:
        for o in range(0, O):
            m = tl.load(mid_ptr + o * R + r, mask=rk, other=0.0)
            rk_o = r < tl.where(o > 0, bound, 0)  # outer 0's rows are in registers already
            b = tl.load(db_ptr + ((s * O + o) * H + hs)[None, :] * R + r[:, None], mask=rk_o[:, None] & h_ok[None, :],
                        other=0.0).to(tl.float32) + tl.where(o == 0, db0, 0.0)
            out += scale * tl.sum(m[:, None] * b, axis=0)
        if pid == 0:
            j = tl.arange(0, 2 * BR)
            for o in range(0, O):
                tl.store(sh_ptr + o * 2 * R + j // BR * R + j % BR, tl.zeros((2 * BR,), dtype=tl.float32),
                         mask=j % BR < R)
    tl.store(out_ptr + hs, out, mask=h_ok)
