"""One launch for few tokens (``T <= 64``, tuned for ``T <= 32``): the whole shared-sink
forward with LoRA (docs/reference.md#the-base-module, #the-forward) in a single Triton grid.

Why one launch: at a few tokens the forward streams the weights once (``w13``
``n*2F*H`` and ``w2`` ``n*H*F`` elements, plus the used pool slots) and does almost
no arithmetic, so its cost is bytes / bandwidth plus fixed costs; three dependent
launches pay the fill and drain of the grid three times (KERNEL_NOTES.md). Here one
persistent grid does it all (v11): about as many programs as fit on the GPU at once,
each taking numbered *tasks* from one atomic ticket counter until none is left
(``SingleConfig(persistent=False)``: one program per task, v10's grid).

The down GEMM's reduction axis ``n*F`` is cut into *chunks* of ``KC`` features of one
expert, so the ``w2`` stream need not wait for the whole up phase: the tickets are

1. ``N1`` shrink tasks ``(o, s, k)``: ``sh[t, o, 0:2R] += x[t, kslice] @ gate_up_A[s, o, :, kslice].T``
   for the tokens of slot ``s`` (float32 atomics into the workspace);
2. per chunk ``g``, ``KC/BF * KSPLIT`` up tasks ``(block, ks)``: the base ``x @ w13[e, rows].T``
   for ``BF`` features (gate/up rows read as pairs, whatever the layout) over slice ``ks``
   of ``H``, added into the float32 ``y_acc``. The last slice of a block to arrive runs the
   epilogue: the LoRA expand ``sh @ gate_up_B[s, e].T`` (after phase 1 is complete),
   ``act = silu(gate) * up * gamma`` in float32, stored once in the working dtype, the
   down shrink ``act @ down_A[s, e, :, fblock].T`` atomically added into ``mid [T, O, R]``
   (the shared outer adds over the experts: that *is* the expert sum), and one count
   in the chunk's counter;
3. ``cdiv(H, BN)`` down tasks per chunk ``g`` (``LAG`` chunks after its up tasks in the
   ticket order): ``act[:, chunk] @ w2_lin[chunk, cols]`` for ``BN`` hidden columns,
   its first ``w2`` tile loaded *before* waiting for the chunk's blocks, added into the
   float32 ``out_acc [T, H]``. The last chunk to arrive at a column block adds
   ``scale * mid[:, o] @ down_B[s, o, cols].T`` and writes ``out`` once in the working dtype.

The LoRA terms loop over (slot, rank chunk) pairs of the slots present in the tile as
one flat loop of dots, so that Triton software-pipelines its loads (a loop over slots
around a loop over the rank is not pipelined: v10 paid one memory trip per slot).
Every K loop starts at a multiple of its step, so the compiler can prove 16-byte
alignment and stream through shared memory (v10's slice start was not provably
aligned: scalar 2-byte loads, no pipelining).

Why tickets rather than ``program_id``: a task waits only for tasks with *smaller*
tickets, and a ticket is taken only by a program that is running (and a program runs
the ticket it holds next after its current, smaller one), so every wait ends for any
grid size; Triton's CPU interpreter, which runs the programs one after another, runs
the same code: its first program takes every task in order and never waits. The
finalizer of a column block does not wait at all: it is whoever arrives last.

Graph replays: the last program to leave zeroes ``sh``, ``mid``, the ticket counters and
the chunk counters (every other program has left, so nothing reads them any more);
the last split of each feature block zeroes that block's counter, the finalizer of each
column block its counter and its ``out_acc`` columns; the next launch finds the
workspace as ``make_workspace`` made it, with no memset launch.

Shapes in the reference's symbols (docs/reference.md). Weights ``w13 [n, 2F, H]``, ``w2 [n, H, F]``; pool
``gate_up_a [S, O, 2R, H]``, ``gate_up_b [S, n, 2F, R]``, ``down_a [S, n, R, F]``,
``down_b [S, O, H, R]`` (read directly: the same numbers as ``w1_delta``/``a_cat``, and
one code path for both outer layouts: expert ``e`` uses outer index ``e * O_STEP``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from inkling_lab.batch import SlotBatch
from inkling_lab.operands import SinkOperands

MAX_TOKENS = 64
"""Tokens one launch handles (one tile of ``BT <= 64`` rows): the regime of weight streaming."""

VERSION = "v12"
"""The kernel's design version (KERNEL_NOTES.md), recorded with its measurements."""


# -- the kernel -------------------------------------------------------------------------------

@triton.jit
def _wait_at_least(ptr, target, SLEEP_NS: tl.constexpr):
    """Spin until ``*ptr >= target`` (one thread polls; Triton broadcasts the value). The
    acquire makes the writes released before each increment visible; only ever called
    for counters of smaller tickets (module docstring). ``SLEEP_NS > 0``: back off between
    polls (``nanosleep``, CUDA only: the interpreter passes 0)."""
    seen = tl.atomic_add(ptr, 0, sem="acquire")
    while seen < target:
        if SLEEP_NS > 0:
            tl.inline_asm_elementwise("nanosleep.u32 $1;\nmov.u32 $0, 0;", "=r,r",
                                      [tl.full([1], SLEEP_NS, tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
        seen = tl.atomic_add(ptr, 0, sem="acquire")


@triton.jit
def _signal(ptr):
    """Count one finished task: the barrier first, so every thread's writes precede the
    (one-thread) release increment."""
    tl.debug_barrier()
    tl.atomic_add(ptr, 1, sem="release")


@triton.jit
def _tile_slots(slot_ptr, scale_ptr, rows, row_ok):
    """The tile's token slots ``[BT]`` (-1: base only), each token's scaling ``[BT]`` and
    the first slot and count of the range of slots it holds (count 0 when none)."""
    slot = tl.load(slot_ptr + rows, mask=row_ok, other=-1)
    scale = tl.load(scale_ptr + slot, mask=slot >= 0, other=0.0)
    smin = tl.min(tl.where(slot >= 0, slot, 1 << 30), axis=0)
    n_s = tl.maximum(tl.max(slot, axis=0) - smin + 1, 0)
    return slot, scale, smin, n_s


@triton.jit
def _locate(m, U, NH, NG, LAG):
    """Ticket ``m`` (counted after the shrink tickets) -> ``(is_up, chunk, index)``. The order:
    the up tasks of chunks ``0..LAG-1``; then per chunk ``g >= LAG`` its ``U`` up tasks
    followed by the ``NH`` down tasks of chunk ``g - LAG``; then the down tasks of the
    last ``LAG`` chunks (``LAG = NG``: every up task before every down task)."""
    head = LAG * U
    body = (NG - LAG) * (U + NH)
    in_head = m < head
    in_tail = m >= head + body
    mb = tl.maximum(m - head, 0)
    j = LAG + mb // (U + NH)
    o = mb % (U + NH)
    mt = tl.maximum(m - head - body, 0)
    is_up = in_head | ((m < head + body) & (o < U))
    g = tl.where(in_head, m // U, tl.where(in_tail, NG - LAG + mt // NH, tl.where(o < U, j, j - LAG)))
    idx = tl.where(in_head, m % U, tl.where(in_tail, mt % NH, tl.where(o < U, o, o - U)))
    return is_up, g, idx


@triton.jit
def _shrink_task(i, x_ptr, slot_ptr, ga_ptr, sh_ptr, cnt_ptr, T, H, R, O, S, KS1,
                 BT: tl.constexpr, BR: tl.constexpr, BKS: tl.constexpr, SK_CHUNK: tl.constexpr):
    """Ticket ``i < N1`` -> ``(o, s, k)``: slice ``k`` of ``H`` of the gate/up shrink of slot
    ``s``, outer ``o``, for the tokens of that slot (skipped when no token uses it)."""
    o = i // (S * KS1)
    s = (i // KS1) % S
    k0 = (i % KS1) * SK_CHUNK           # a multiple of the step: the loads vectorize
    rows = tl.arange(0, BT)
    row_ok = rows < T
    slot = tl.load(slot_ptr + rows, mask=row_ok, other=-1)
    sel = row_ok & (slot == s)
    if tl.sum(sel.to(tl.int32), axis=0) > 0:
        j = tl.arange(0, 2 * BR)        # column j: half j // BR (gate, up), rank j % BR
        r = j % BR
        col_ok = r < R
        a_row = ((s * O + o) * 2 + j // BR) * R + r
        acc = tl.zeros((BT, 2 * BR), dtype=tl.float32)
        for k in range(k0, k0 + SK_CHUNK, BKS):
            kk = k + tl.arange(0, BKS)
            k_ok = kk < H
            xt = tl.load(x_ptr + rows[:, None] * H + kk[None, :], mask=sel[:, None] & k_ok[None, :], other=0.0)
            at = tl.load(ga_ptr + a_row[:, None] * H + kk[None, :], mask=col_ok[:, None] & k_ok[None, :],
                         other=0.0)
            acc = tl.dot(xt, tl.trans(at), acc)
        dst = sh_ptr + rows[:, None] * (O * 2 * R) + o * 2 * R + (j // BR * R + r)[None, :]
        tl.atomic_add(dst, acc, mask=sel[:, None] & col_ok[None, :], sem="relaxed")
    _signal(cnt_ptr + 1)


@triton.jit
def _up_task(g, u, x_ptr, w13_ptr, gam_ptr, act_ptr, slot_ptr, scale_ptr, sh_ptr, gb_ptr, da_ptr, mid_ptr,
             y_acc_ptr, cnt_ptr, T, H, F, R, O, N_EXP, O_STEP, ROW_STEP, UP_OFFSET, N1, KSPLIT, NG,
             HAS_LORA: tl.constexpr, BT: tl.constexpr, BF: tl.constexpr, BK: tl.constexpr, RC: tl.constexpr,
             KC: tl.constexpr, SLEEP_NS: tl.constexpr):
    """Up task ``u`` of chunk ``g`` -> feature block ``u // KSPLIT`` of the chunk (expert ``e``,
    features ``f0..f0+BF-1``; none past ``F`` in an expert's last chunk) and slice
    ``ks = u % KSPLIT`` of ``H``."""
    cpe = tl.cdiv(F, KC)
    fpe = tl.cdiv(F, BF)
    e = g // cpe
    fblk = (g % cpe) * (KC // BF) + u // KSPLIT
    ks = u % KSPLIT
    f0 = fblk * BF
    if f0 < F:
        fb = e * fpe + fblk             # the block's index among all n * cdiv(F, BF)
        rows = tl.arange(0, BT)
        row_ok = rows < T
        jj = tl.arange(0, 2 * BF)       # weight rows as (gate f0, up f0, gate f0+1, up f0+1, ...)
        f_of_j = f0 + jj // 2
        w_row = e * 2 * F + f_of_j * ROW_STEP + (jj % 2) * UP_OFFSET
        w_ok = f_of_j < F
        # The epilogue's small inputs are read before the weight stream, so that their
        # latency hides under it (a few registers per thread, for every slice).
        gam = tl.load(gam_ptr + rows * N_EXP + e, mask=row_ok, other=0.0).to(tl.float32)
        if HAS_LORA:
            slot, scale, smin, n_s = _tile_slots(slot_ptr, scale_ptr, rows, row_ok)
        acc = tl.zeros((BT, 2 * BF), dtype=tl.float32)
        k_steps = tl.cdiv(tl.cdiv(H, KSPLIT), BK)
        k_begin = ks * k_steps * BK     # a multiple of BK, provably: 16-byte loads, pipelined
        for k in range(k_begin, k_begin + k_steps * BK, BK):
            kk = k + tl.arange(0, BK)
            k_ok = kk < H
            xt = tl.load(x_ptr + rows[:, None] * H + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            wt = tl.load(w13_ptr + w_row[:, None] * H + kk[None, :], mask=w_ok[:, None] & k_ok[None, :],
                         other=0.0)
            acc = tl.dot(xt, tl.trans(wt), acc)

        last = KSPLIT == 1
        if KSPLIT > 1:
            # Split-K over H keeps many programs streaming for few features: the slices add
            # into y_acc (fire-and-forget float32 atomics) and the last to arrive reads the
            # sum once (a loop over stored partials would pay one memory trip per slice).
            tile = y_acc_ptr + rows[:, None] * (N_EXP * 2 * F) + e * 2 * F + 2 * f0 + jj[None, :]
            tile_ok = row_ok[:, None] & w_ok[None, :]
            tl.atomic_add(tile, acc, mask=tile_ok, sem="relaxed")
            tl.debug_barrier()
            arrived = tl.atomic_add(cnt_ptr + 3 + NG + fb, 1, sem="acq_rel")
            last = arrived == KSPLIT - 1
            if last:
                acc = tl.load(tile, mask=tile_ok, other=0.0, cache_modifier=".cg")
                tl.store(tile, tl.zeros((BT, 2 * BF), dtype=tl.float32), mask=tile_ok)   # zero for the next launch
                tl.atomic_xchg(cnt_ptr + 3 + NG + fb, 0)
        if last:
            gate, up = tl.split(tl.reshape(acc, (BT, BF, 2)))
            fs = f0 + tl.arange(0, BF)
            f_ok = fs < F
            o = e * O_STEP
            if HAS_LORA:
                nch = tl.cdiv(R, RC)
                _wait_at_least(cnt_ptr + 1, N1, SLEEP_NS)   # the gate/up shrink is complete
                # One flat loop over (slot, rank chunk): Triton pipelines its loads.
                for q in range(0, n_s * nch):
                    s = smin + q // nch
                    r = (q % nch) * RC + tl.arange(0, RC)
                    r_ok = r < R
                    sel = row_ok & (slot == s)
                    # no B bytes for a slot absent from the tile (a comparison, not `& scalar`:
                    # the interpreter rejects a mask broadcast from a 0-d boolean)
                    rb_ok = r < tl.where(tl.sum(sel.to(tl.int32), axis=0) > 0, R, 0)
                    src = sh_ptr + rows[:, None] * (O * 2 * R) + o * 2 * R + r[None, :]
                    ld = sel[:, None] & r_ok[None, :]
                    sg = tl.load(src, mask=ld, other=0.0, cache_modifier=".cg") * scale[:, None]
                    su = tl.load(src + R, mask=ld, other=0.0, cache_modifier=".cg") * scale[:, None]
                    b_base = gb_ptr + (s * N_EXP + e) * 2 * F * R
                    bmask = rb_ok[:, None] & f_ok[None, :]
                    bg = tl.load(b_base + fs[None, :] * R + r[:, None], mask=bmask, other=0.0)    # [RC, BF]
                    bu = tl.load(b_base + (F + fs)[None, :] * R + r[:, None], mask=bmask, other=0.0)
                    gate += tl.dot(sg.to(bg.dtype), bg)
                    up += tl.dot(su.to(bu.dtype), bu)
            act = gate / (1.0 + tl.exp(-gate)) * up * gam[:, None]     # SwiGLU x gamma in float32 (docs/reference.md#the-base-module)
            act_lp = act.to(act_ptr.dtype.element_ty)                  # the one cast to the working dtype
            tl.store(act_ptr + rows[:, None] * (N_EXP * F) + e * F + fs[None, :], act_lp,
                     mask=row_ok[:, None] & f_ok[None, :])
            if HAS_LORA:
                for q in range(0, n_s * nch):
                    s = smin + q // nch
                    r = (q % nch) * RC + tl.arange(0, RC)
                    r_ok = r < R
                    sel = row_ok & (slot == s)
                    rb_ok = r < tl.where(tl.sum(sel.to(tl.int32), axis=0) > 0, R, 0)
                    a_sel = tl.where(sel[:, None], act_lp, 0.0).to(act_lp.dtype)
                    da = tl.load(da_ptr + ((s * N_EXP + e) * R + r)[None, :] * F + fs[:, None],
                                 mask=f_ok[:, None] & rb_ok[None, :], other=0.0)                   # [BF, RC]
                    tl.atomic_add(mid_ptr + rows[:, None] * (O * R) + o * R + r[None, :], tl.dot(a_sel, da),
                                  mask=sel[:, None] & r_ok[None, :], sem="relaxed")
            _signal(cnt_ptr + 3 + g)    # one more block of chunk g has its act and down shrink in


@triton.jit
def _down_task(g, hb, act_ptr, w2_ptr, out_ptr, oacc_ptr, slot_ptr, scale_ptr, mid_ptr, db_ptr, cnt_ptr,
               T, H, F, R, O, N_EXP, NG, NB,
               HAS_LORA: tl.constexpr, BT: tl.constexpr, BF: tl.constexpr, BN: tl.constexpr, BKD: tl.constexpr,
               RC: tl.constexpr, KC: tl.constexpr, SLEEP_NS: tl.constexpr):
    """Down task ``hb`` of chunk ``g`` -> hidden columns ``hb*BN..hb*BN+BN-1`` over the chunk's
    ``KC`` features (expert ``e``), in steps of ``BKD`` (every load contiguous in ``F``)."""
    cpe = tl.cdiv(F, KC)
    e = g // cpe
    c = g % cpe
    f_lo = c * KC
    n_blocks = tl.minimum(KC // BF, tl.cdiv(F, BF) - c * (KC // BF))   # the chunk's feature blocks
    rows = tl.arange(0, BT)
    row_ok = rows < T
    hs = hb * BN + tl.arange(0, BN)
    h_ok = hs < H
    w_cols = w2_ptr + e * H * F + hs[None, :] * F
    fs = f_lo + tl.arange(0, BKD)
    f_ok = fs < F
    # The first w2 tile comes from memory while this task waits for the chunk's act.
    wt = tl.load(w_cols + fs[:, None], mask=f_ok[:, None] & h_ok[None, :], other=0.0)             # [BKD, BN]
    _wait_at_least(cnt_ptr + 3 + g, n_blocks, SLEEP_NS)
    a_rows = act_ptr + rows[:, None] * (N_EXP * F) + e * F
    at = tl.load(a_rows + fs[None, :], mask=row_ok[:, None] & f_ok[None, :], other=0.0, cache_modifier=".cg")
    acc = tl.dot(at, wt)
    for k in range(f_lo + BKD, f_lo + KC, BKD):
        fs = k + tl.arange(0, BKD)
        f_ok = fs < F
        at = tl.load(a_rows + fs[None, :], mask=row_ok[:, None] & f_ok[None, :], other=0.0, cache_modifier=".cg")
        wt = tl.load(w_cols + fs[:, None], mask=f_ok[:, None] & h_ok[None, :], other=0.0)
        acc = tl.dot(at, wt, acc)
    out_ok = row_ok[:, None] & h_ok[None, :]
    acc_ptrs = oacc_ptr + rows[:, None] * H + hs[None, :]
    tl.atomic_add(acc_ptrs, acc, mask=out_ok, sem="relaxed")
    tl.debug_barrier()
    arrived = tl.atomic_add(cnt_ptr + 3 + NG + NB + hb, 1, sem="acq_rel")
    if arrived == NG - 1:
        # Every chunk has added its part of these columns, and (through their counts)
        # every feature block its down shrink into mid: finish the columns here.
        acc = tl.load(acc_ptrs, mask=out_ok, other=0.0, cache_modifier=".cg")
        if HAS_LORA:
            slot, scale, smin, n_s = _tile_slots(slot_ptr, scale_ptr, rows, row_ok)
            nch = tl.cdiv(R, RC)
            for q in range(0, n_s * O * nch):
                s = smin + q // (O * nch)
                o = (q // nch) % O
                r = (q % nch) * RC + tl.arange(0, RC)
                r_ok = r < R
                sel = row_ok & (slot == s)
                rb_ok = r < tl.where(tl.sum(sel.to(tl.int32), axis=0) > 0, R, 0)
                m = tl.load(mid_ptr + rows[:, None] * (O * R) + o * R + r[None, :],
                            mask=sel[:, None] & r_ok[None, :], other=0.0, cache_modifier=".cg") * scale[:, None]
                b = tl.load(db_ptr + ((s * O + o) * H + hs)[None, :] * R + r[:, None],
                            mask=rb_ok[:, None] & h_ok[None, :], other=0.0)                        # [RC, BN]
                acc += tl.dot(m.to(b.dtype), b)
        tl.store(out_ptr + rows[:, None] * H + hs[None, :], acc.to(out_ptr.dtype.element_ty), mask=out_ok)
        tl.store(acc_ptrs, tl.zeros((BT, BN), dtype=tl.float32), mask=out_ok)   # zero for the next launch
        tl.atomic_xchg(cnt_ptr + 3 + NG + NB + hb, 0)


@triton.jit
def _run_ticket(t, N1, NG, NB, NH, U, KS1, LAG, x_ptr, w13_ptr, w2_ptr, gam_ptr, slot_ptr, scale_ptr,
                ga_ptr, gb_ptr, da_ptr, db_ptr, out_ptr, sh_ptr, mid_ptr, act_ptr, y_acc_ptr, oacc_ptr, cnt_ptr,
                T, H, F, R, O, S, N_EXP, O_STEP, ROW_STEP, UP_OFFSET, KSPLIT,
                HAS_LORA: tl.constexpr, BT: tl.constexpr, BF: tl.constexpr, BK: tl.constexpr, BKS: tl.constexpr,
                SK_CHUNK: tl.constexpr, BR: tl.constexpr, RC: tl.constexpr, KC: tl.constexpr, BKD: tl.constexpr,
                BN: tl.constexpr, SLEEP_NS: tl.constexpr):
    """Run the task of ticket ``t < N1 + NG * (U + NH)`` (module docstring)."""
    if t < N1:
        if HAS_LORA:
            _shrink_task(t, x_ptr, slot_ptr, ga_ptr, sh_ptr, cnt_ptr, T, H, R, O, S, KS1, BT, BR, BKS, SK_CHUNK)
    else:
        is_up, g, idx = _locate(t - N1, U, NH, NG, LAG)
        if is_up:
            _up_task(g, idx, x_ptr, w13_ptr, gam_ptr, act_ptr, slot_ptr, scale_ptr, sh_ptr, gb_ptr, da_ptr,
                     mid_ptr, y_acc_ptr, cnt_ptr, T, H, F, R, O, N_EXP, O_STEP, ROW_STEP, UP_OFFSET, N1,
                     KSPLIT, NG, HAS_LORA, BT, BF, BK, RC, KC, SLEEP_NS)
        else:
            _down_task(g, idx, act_ptr, w2_ptr, out_ptr, oacc_ptr, slot_ptr, scale_ptr, mid_ptr, db_ptr,
                       cnt_ptr, T, H, F, R, O, N_EXP, NG, NB, HAS_LORA, BT, BF, BN, BKD, RC, KC, SLEEP_NS)


# Inside the persistent loop the task is a real call: inlined, its index and mask
# tensors (functions of the thread index and the arguments only) would be hoisted out
# of the loop by LLVM, all three kinds at once, and live across every task (255
# registers on sm_90 against 148 for the call; 114 for one task per program, no loop).
_run_ticket_apart = triton.jit(noinline=True)(_run_ticket.fn)


# Arguments that change from call to call (tokens, slots, layout, the split and the lag)
# are not specialized: Triton would otherwise compile anew whenever one of them is 1 or
# turns divisible by 16 (T 1 / 8 / 32, S 1 / 4 / 8 ...), and a sweep would spend its
# time compiling.
@triton.jit(do_not_specialize=["T", "O", "S", "O_STEP", "ROW_STEP", "UP_OFFSET", "KSPLIT", "LAG"])
def single_launch_kernel(x_ptr, w13_ptr, w2_ptr, gam_ptr, slot_ptr, scale_ptr,
                         ga_ptr, gb_ptr, da_ptr, db_ptr, out_ptr,
                         sh_ptr, mid_ptr, act_ptr, y_acc_ptr, oacc_ptr, cnt_ptr,
                         T, H, F, R, O, S, N_EXP, O_STEP, ROW_STEP, UP_OFFSET, KSPLIT, LAG,
                         HAS_LORA: tl.constexpr, BT: tl.constexpr, BF: tl.constexpr, BK: tl.constexpr,
                         BKS: tl.constexpr, SK_CHUNK: tl.constexpr, BR: tl.constexpr, RC: tl.constexpr,
                         KC: tl.constexpr, BKD: tl.constexpr, BN: tl.constexpr, SLEEP_NS: tl.constexpr,
                         PERSISTENT: tl.constexpr):
    """``PERSISTENT``: any grid size, each program taking tickets until all ``N1 + NG * (U + NH)``
    tasks are taken (module docstring; ``NG = n * cdiv(F, KC)`` chunks, ``U = KC/BF * KSPLIT`` up
    and ``NH = cdiv(H, BN)`` down tasks per chunk); else one ticket per program, the grid at
    least the task count (v10's grid, with fewer registers: no loop). ``x [T, H]``, ``gammas
    [T, n]``, ``slots [T]`` int32 (``-1``: base only), ``scalings [S]`` float32 -> ``out [T, H]``;
    workspace ``sh [T, O*2R]``, ``mid [T, O*R]``, ``y_acc [T, n*2F]`` (gate/up pairs), ``out_acc
    [T, H]`` float32 (zero on entry and on exit), ``act [T, n*F]`` working dtype, ``counters
    [3 + NG + NB + NH]`` int32 (zero on entry and exit; ``NB = n * cdiv(F, BF)``)."""
    NG = N_EXP * tl.cdiv(F, KC)
    NB = N_EXP * tl.cdiv(F, BF)
    NH = tl.cdiv(H, BN)
    U = (KC // BF) * KSPLIT
    KS1 = tl.cdiv(H, SK_CHUNK)
    N1 = O * S * KS1 if HAS_LORA else 0   # no shrink tasks without LoRA: compile none (its tile costs registers)
    lag = tl.minimum(LAG, NG)
    total = N1 + NG * (U + NH)
    t = tl.atomic_add(cnt_ptr + 0, 1, sem="relaxed")
    if PERSISTENT:
        while t < total:
            # The next ticket is taken before this task runs, so its latency hides behind the task.
            nxt = tl.atomic_add(cnt_ptr + 0, 1, sem="relaxed")
            _run_ticket_apart(t, N1, NG, NB, NH, U, KS1, lag, x_ptr, w13_ptr, w2_ptr, gam_ptr, slot_ptr, scale_ptr,
                              ga_ptr, gb_ptr, da_ptr, db_ptr, out_ptr, sh_ptr, mid_ptr, act_ptr, y_acc_ptr, oacc_ptr,
                              cnt_ptr, T, H, F, R, O, S, N_EXP, O_STEP, ROW_STEP, UP_OFFSET, KSPLIT,
                              HAS_LORA, BT, BF, BK, BKS, SK_CHUNK, BR, RC, KC, BKD, BN, SLEEP_NS)
            t = nxt
    elif t < total:
        _run_ticket(t, N1, NG, NB, NH, U, KS1, lag, x_ptr, w13_ptr, w2_ptr, gam_ptr, slot_ptr, scale_ptr,
                    ga_ptr, gb_ptr, da_ptr, db_ptr, out_ptr, sh_ptr, mid_ptr, act_ptr, y_acc_ptr, oacc_ptr,
                    cnt_ptr, T, H, F, R, O, S, N_EXP, O_STEP, ROW_STEP, UP_OFFSET, KSPLIT,
                    HAS_LORA, BT, BF, BK, BKS, SK_CHUNK, BR, RC, KC, BKD, BN, SLEEP_NS)

    tl.debug_barrier()
    left = tl.atomic_add(cnt_ptr + 2, 1, sem="acq_rel")
    if left == tl.num_programs(0) - 1:
        # The last program out: nobody reads sh, mid or these counters any more. Zero
        # them for the next launch (a CUDA graph replays against the same workspace).
        rows = tl.arange(0, BT)
        row_ok = rows < T
        if HAS_LORA:
            j = tl.arange(0, 2 * BR)
            r = tl.arange(0, BR)
            for o in range(0, O):
                tl.store(sh_ptr + rows[:, None] * (O * 2 * R) + o * 2 * R + (j // BR * R + j % BR)[None, :],
                         tl.zeros((BT, 2 * BR), dtype=tl.float32), mask=row_ok[:, None] & (j % BR < R)[None, :])
                tl.store(mid_ptr + rows[:, None] * (O * R) + o * R + r[None, :],
                         tl.zeros((BT, BR), dtype=tl.float32), mask=row_ok[:, None] & (r < R)[None, :])
        for c0 in range(0, 3 + NG, 64):   # the ticket, shrink and exit counters, then the chunks'
            c = c0 + tl.arange(0, 64)
            tl.store(cnt_ptr + c, tl.zeros((64,), dtype=tl.int32), mask=c < 3 + NG)


# -- the host side ----------------------------------------------------------------------------

@dataclass(frozen=True)
class SingleConfig:
    """Tiles and schedule of the one-launch kernel (tiles powers of two, ``>= 16``).

    ``bf`` features per up task (its dot is ``2*bf`` wide, gate and up); ``ksplit`` slices
    of ``H`` per feature block (``0``: auto, about two up tasks per multiprocessor and
    slices of at most 1024); ``bk`` the up reduction step; ``sk_chunk`` the shrink's
    slice of ``H`` (a multiple of ``bk``); ``kc`` features per down chunk (a multiple of
    ``bf`` and ``bkd``); ``bn`` hidden columns per down task, ``bkd`` its reduction step
    (its first ``[bkd, bn]`` tile is loaded before it waits); ``rc`` the rank chunk of the
    LoRA dots; ``lag`` chunks between a chunk's up tasks and its down tasks in the ticket
    order (``-1``: about one grid of tickets; ``>=`` the chunk count: all up tasks first,
    v10's order); ``per_sm`` programs per multiprocessor (``0``: as many as the compiled
    kernel's registers and shared memory allow, learnt at its first launch);
    ``programs`` the grid size outright (``0``: ``per_sm`` times the multiprocessors);
    ``sleep_ns`` back-off between polls of a counter (``0``: none); ``persistent``: the grid
    loops over tickets (else one program per task, ``per_sm`` and ``programs`` unused);
    ``maxnreg`` caps the registers per thread (ptxas ``.maxnreg``; ``0``: no cap)."""

    bf: int = 16
    ksplit: int = 0
    bk: int = 128
    sk_chunk: int = 128
    kc: int = 256
    bn: int = 32
    bkd: int = 128
    rc: int = 64
    lag: int = -1
    per_sm: int = 0
    programs: int = 0
    sleep_ns: int = 0
    warps: int = 4
    stages: int = 3
    persistent: bool = True
    maxnreg: int = 0

    def __post_init__(self) -> None:
        for name in ("bf", "bk", "sk_chunk", "kc", "bn", "bkd", "rc"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"SingleConfig.{name} must be a power of two >= 16 (tl.dot's smallest side), got {v}")
        if self.sk_chunk % self.bk:
            raise ValueError(f"SingleConfig.sk_chunk={self.sk_chunk} must be a multiple of bk={self.bk}: "
                             "the shrink walks its slice of H in steps of bk")
        if self.kc % self.bf or self.kc % self.bkd:
            raise ValueError(f"SingleConfig.kc={self.kc} must be a multiple of bf={self.bf} and bkd={self.bkd}: "
                             "a chunk is whole feature blocks, walked in steps of bkd")
        if (self.ksplit < 0 or self.lag < -1 or self.per_sm < 0 or self.programs < 0 or self.sleep_ns < 0
                or self.maxnreg < 0 or self.warps < 1 or self.stages < 1):
            raise ValueError(f"SingleConfig: ksplit, per_sm, programs, sleep_ns, maxnreg must be >= 0, lag >= -1, "
                             f"warps and stages >= 1, got {self}")
        if self.programs and not self.persistent:
            raise ValueError("SingleConfig.programs needs persistent=True: one program per task takes one ticket, "
                             "so a smaller grid would leave tasks undone")


@dataclass(frozen=True, eq=False)
class Workspace:
    """What one launch reads and writes besides its inputs, allocated once so a CUDA graph
    replays against fixed addresses: ``sh [max_tokens, O*2R]``, ``mid [max_tokens, O*R]``,
    ``y_acc [max_tokens, n*2F]`` (gate/up pairs, per expert), ``out_acc [max_tokens, H]`` float32,
    ``act [max_tokens, n*F]`` working dtype, ``counters [3 + NG + NB + NH]`` int32
    (``[0]`` the next ticket, ``[1]`` shrink tasks done, ``[2]`` programs left, ``[3 + g]``
    feature blocks of chunk ``g`` done, ``[3 + NG + fb]`` H slices of feature block ``fb``
    arrived, ``[3 + NG + NB + hb]`` chunks arrived at column block ``hb``; ``NG = n * cdiv(F, kc)``,
    ``NB = n * cdiv(F, bf)``, ``NH = cdiv(H, bn)``).
    The kernel leaves all but ``act`` zero, as it found them."""

    config: SingleConfig
    ksplit: int
    max_tokens: int
    shape: tuple[int, int, int, int, int]   # (n, H, F, O, R) it was made for
    sh: torch.Tensor
    mid: torch.Tensor
    y_acc: torch.Tensor
    out_acc: torch.Tensor
    act: torch.Tensor
    counters: torch.Tensor

    def clean(self) -> bool:
        """Whether the zero-on-exit parts are zero (what a graph replay needs)."""
        return all(int(torch.count_nonzero(t)) == 0 for t in (self.sh, self.mid, self.y_acc, self.out_acc,
                                                                   self.counters))


def _block_tokens(num_tokens: int) -> int:
    return max(16, triton.next_power_of_2(num_tokens))


def _shrink_step(bk: int, br: int) -> int:
    """The shrink's reduction step: its ``[2*BR, step]`` tile of gate-up A kept to 4096
    elements (a ``[128, 128]`` tile at R 64 spilled registers for the whole kernel)."""
    return max(16, min(bk, 4096 // (2 * br)))


def _pool_dims(ops: SinkOperands) -> tuple[int, int]:
    """``(O, R)`` of the pool, ``(1, 0)`` without one."""
    if ops.buffers is None:
        return 1, 0
    return ops.buffers[0].shape[1], ops.max_rank


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter: a few programs, so that the ticket and exit logic is exercised


def _auto_ksplit(config: SingleConfig, n: int, H: int, F: int, sms: int) -> int:
    """Slices of ``H`` per feature block: about two up tasks per multiprocessor and slices
    of at most 1024 (an up task of ``2*bf`` rows then reads at most 64 KB), each slice at
    least two reduction steps long."""
    if config.ksplit:
        return config.ksplit
    blocks = n * triton.cdiv(F, config.bf)
    return max(1, min(max(triton.cdiv(2 * sms, blocks), triton.cdiv(H, 1024)), H // (2 * config.bk)))


_COMPILED: dict[tuple, dict] = {}
"""Per compiled variant (device, config, token tile, rank tile, LoRA, dtype): its registers,
spills and shared memory, and the programs per multiprocessor they allow, read at its
first launch (``compiled_variants``)."""

_GUESS_PER_SM = 2
"""Programs per multiprocessor before a variant's first launch has told its registers."""


def _resident(kernel, warps: int) -> dict:
    """Registers, spills, shared memory of a compiled kernel, and how many of its programs
    fit on one sm_90 multiprocessor (64 K registers, allocated per warp in units of 256;
    228 KB of shared memory, 1 KB of it reserved per program; 64 warps)."""
    regs = int(getattr(kernel, "n_regs", 0) or 0)
    shared = int(getattr(getattr(kernel, "metadata", None), "shared", 0) or 0)
    if not regs:
        return dict(n_regs=0, n_spills=0, shared=shared, per_sm=_GUESS_PER_SM)
    per_warp = -(-regs * 32 // 256) * 256
    fits = min(65536 // (per_warp * warps), (228 * 1024) // (shared + 1024), 64 // warps, 32)
    return dict(n_regs=regs, n_spills=int(getattr(kernel, "n_spills", 0) or 0), shared=shared, per_sm=max(1, fits))


def compiled_variants() -> list[dict]:
    """What the launches so far compiled: one row per variant with its registers, spills,
    shared memory and programs per multiprocessor (the H200 script records them)."""
    return [dict(key=repr(k), **v) for k, v in _COMPILED.items()]


ALL_UP_FIRST = 1 << 20
"""A ``lag`` past any chunk count: every up task takes a ticket before the first down task."""


def pick_config(ops: SinkOperands, num_tokens: int) -> SingleConfig:
    """The tiles for ``num_tokens`` tokens on ``ops``'s shapes. From the v11 sweep on the
    H200 (``data/profiles/history/h200_single_launch_v11.json``, R 64 S 4, every shape, T 1 and 32):
    every up task before any down task (``lag`` past the chunk count) won 7 of 8 cases, one
    program per task beat the persistent grid at B, Inkling and TP8; large weights take
    larger down chunks (``kc`` 512 halves the float32 atomics into ``out_acc``)."""
    big = ops.n * ops.intermediate * ops.hidden > 8 * 1024 * 1024
    return SingleConfig(kc=512 if big else 256, lag=ALL_UP_FIRST, persistent=False)


def make_workspace(ops: SinkOperands, max_tokens: int, config: SingleConfig | None = None,
                   device: torch.device | None = None) -> Workspace:
    """A zeroed workspace for up to ``max_tokens`` tokens of ``ops`` (host allocation: do it
    before capturing a graph)."""
    if not 1 <= max_tokens <= MAX_TOKENS:
        raise ValueError(f"make_workspace: max_tokens must be 1..{MAX_TOKENS} (the one-launch kernel is for "
                         f"few tokens; use the triton backend for more), got {max_tokens}")
    config = config or pick_config(ops, max_tokens)
    device = ops.device if device is None else torch.device(device)
    n, H, F = ops.n, ops.hidden, ops.intermediate
    O, R = _pool_dims(ops)
    ksplit = _auto_ksplit(config, n, H, F, _num_sms(device))
    blocks = n * triton.cdiv(F, config.bf)
    chunks = n * triton.cdiv(F, config.kc)
    f32 = dict(dtype=torch.float32, device=device)
    return Workspace(config, ksplit, max_tokens, (n, H, F, O, R),
                     sh=torch.zeros(max_tokens, max(O * 2 * R, 1), **f32),
                     mid=torch.zeros(max_tokens, max(O * R, 1), **f32),
                     y_acc=torch.zeros(max_tokens, n * 2 * F if ksplit > 1 else 1, **f32),
                     out_acc=torch.zeros(max_tokens, H, **f32),
                     act=torch.empty(max_tokens, n * F, dtype=ops.dtype, device=device),
                     counters=torch.zeros(3 + chunks + blocks + triton.cdiv(H, config.bn), dtype=torch.int32,
                                          device=device))


def device_slots(batch: SlotBatch | None, num_tokens: int, device: torch.device | str
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(slots [T] int32, scalings [S] float32)`` on ``device`` for ``launch_single``: each
    token's slot, ``-1`` for base-only tokens and for slots of rank 0 (docs/reference.md#batches: a no-op).
    Host work: do it before capturing, then update the two tensors in place."""
    if batch is None:
        return (torch.full((num_tokens,), -1, dtype=torch.int32, device=device),
                torch.ones(1, dtype=torch.float32, device=device))
    slots = batch.token_slots().clone()
    lora = slots >= 0
    slots[lora] = torch.where(batch.lora_ranks[slots[lora]] == 0, -1, slots[lora])
    return (slots.to(device=device, dtype=torch.int32),
            batch.scalings.to(device=device, dtype=torch.float32))


def schedule(ops: SinkOperands, workspace: Workspace, num_tokens: int, has_lora: bool, slots: int = 1) -> dict:
    """The launch's task counts, grid and lag (what ``launch_single`` computes): ``tasks``,
    ``programs``, ``lag``, ``chunks`` ``NG``, ``ups`` ``U`` and ``downs`` ``NH`` per chunk."""
    c = workspace.config
    n, H, F, O, R = workspace.shape
    chunks = n * triton.cdiv(F, c.kc)
    ups = c.kc // c.bf * workspace.ksplit
    downs = triton.cdiv(H, c.bn)
    n1 = O * slots * triton.cdiv(H, c.sk_chunk) if has_lora else 0
    tasks = n1 + chunks * (ups + downs)
    device = workspace.counters.device
    known = _COMPILED.get(_variant_key(c, device, num_tokens, R, has_lora, ops.dtype))
    resident = (c.per_sm or (known["per_sm"] if known else _GUESS_PER_SM)) * _num_sms(device)
    programs = tasks if not c.persistent else (c.programs or resident)
    programs = max(1, min(programs, tasks))
    # About one grid of resident programs' worth of tickets between a chunk's up tasks and
    # its down tasks: by the time a down task gets its ticket the chunk's blocks have
    # mostly finished.
    lag = c.lag if c.lag >= 0 else max(1, min(programs, resident) // (ups + downs))
    return dict(tasks=tasks, programs=programs, lag=min(lag, chunks), chunks=chunks, ups=ups, downs=downs)


def _variant_key(c: SingleConfig, device: torch.device, num_tokens: int, R: int, has_lora: bool,
                 dtype: torch.dtype) -> tuple:
    br = max(16, triton.next_power_of_2(max(R, 1)))
    return (str(device), c, _block_tokens(num_tokens), br, has_lora, str(dtype))


def launch_single(ops: SinkOperands, x: torch.Tensor, gammas: torch.Tensor, slots_i32: torch.Tensor,
                  scalings_f32: torch.Tensor, out: torch.Tensor | None = None,
                  workspace: Workspace | None = None) -> torch.Tensor:
    """Enqueue the whole forward as one launch: ``x [T, H]``, ``gammas [T, n]`` (contiguous,
    the working dtype), ``slots_i32 [T]`` (``-1``: base only; rank-0 slots must be ``-1``
    too: ``device_slots`` makes both tensors), ``scalings_f32 [S]`` -> ``out [T, H]``.

    With ``out`` and ``workspace`` given this allocates nothing and never waits for the
    device, so a CUDA graph can capture it and replay it (update ``x``, ``gammas`` and
    the slot tensors in place between replays)."""
    T, H = x.shape
    n, F = ops.n, ops.intermediate
    O, R = _pool_dims(ops)
    if T > MAX_TOKENS:
        raise ValueError(f"launch_single: {T} tokens, more than the one-launch kernel's {MAX_TOKENS}; "
                         "use inkling_lab.forward.triton_backend for many tokens")
    if workspace is None:
        workspace = make_workspace(ops, max(T, 1), device=x.device)
    elif workspace.shape != (n, H, F, O, R) or T > workspace.max_tokens:
        raise ValueError(f"launch_single: the workspace was made for (n, H, F, O, R) = {workspace.shape} and up to "
                         f"{workspace.max_tokens} tokens, called with {(n, H, F, O, R)} and {T} tokens; "
                         "make one with make_workspace(ops, max_tokens)")
    if not (x.is_contiguous() and gammas.is_contiguous()):
        raise ValueError("launch_single: x [T, H] and gammas [T, n] must be contiguous (call .contiguous() "
                         "before capturing)")
    out = torch.empty_like(x) if out is None else out
    if T == 0:
        return out
    c, ws = workspace.config, workspace
    has_lora = ops.buffers is not None and R > 0
    if has_lora:
        ga, gb, da, db = (b.detach() for b in ops.buffers)
        S = ga.shape[0]
    else:
        ga = gb = da = db = x   # never read: HAS_LORA=False drops every use
        S = 1
    plan = schedule(ops, ws, T, has_lora, S)
    row_step, up_offset = (2, 1) if ops.interleaved else (1, F)
    br = max(16, triton.next_power_of_2(max(R, 1)))
    # The interpreter runs no inline assembly: no back-off there (it never waits anyway).
    sleep_ns = 0 if type(single_launch_kernel).__name__ == "InterpretedFunction" else c.sleep_ns
    extra = dict(maxnreg=c.maxnreg) if c.maxnreg else {}
    kernel = single_launch_kernel[(plan["programs"],)](
        x, ops.w13.detach(), ops.w2.detach(), gammas, slots_i32, scalings_f32, ga, gb, da, db, out,
        ws.sh, ws.mid, ws.act, ws.y_acc, ws.out_acc, ws.counters,
        T, H, F, R, O, S, n, 0 if O == 1 else 1, row_step, up_offset, ws.ksplit, plan["lag"],
        HAS_LORA=has_lora, BT=_block_tokens(T), BF=c.bf, BK=c.bk, BKS=_shrink_step(c.bk, br), SK_CHUNK=c.sk_chunk,
        BR=br, RC=min(c.rc, br), KC=c.kc, BKD=c.bkd, BN=c.bn, SLEEP_NS=sleep_ns,
        PERSISTENT=c.persistent, num_warps=c.warps, num_stages=c.stages, **extra)
    key = _variant_key(c, x.device, T, R, has_lora, x.dtype)
    if key not in _COMPILED and kernel is not None and x.is_cuda:
        _COMPILED[key] = _resident(kernel, c.warps)
    return out


def single_launch_forward(ops: SinkOperands, x: torch.Tensor, gammas: torch.Tensor,
                          batch: SlotBatch | None) -> torch.Tensor:
    """The backend signature (``fn(ops, x [T, H], gammas [T, n], batch) -> out [T, H]``): the
    device slots and a workspace made on the spot, then ``launch_single`` (eager use)."""
    slots, scalings = device_slots(batch, x.shape[0], x.device)
    return launch_single(ops, x.contiguous(), gammas.contiguous(), slots, scalings)
