"""One launch for few tokens (``T <= 64``, tuned for ``T <= 32``): the whole shared-sink
forward with LoRA (docs/reference.md#the-base-module, #the-forward) in a single Triton grid.

Why one launch: at a few tokens the forward streams the weights once (``w13``
``n*2F*H`` and ``w2`` ``n*H*F`` elements, plus the used pool slots) and does almost
no arithmetic, so its cost is bytes / bandwidth plus fixed costs; three dependent
launches pay the fill and drain of the grid three times (KERNEL_NOTES.md: shape A at
5.5-8.3x its roofline). Here one grid does it all, its programs taking numbered
*tasks* from one atomic ticket counter, in three phases:

1. ``N1`` shrink tasks ``(o, s, k)``: ``sh[t, o, 0:2R] += x[t, kslice] @ gate_up_A[s, o, :, kslice].T``
   for the tokens of slot ``s`` (float32 atomics into the workspace);
2. ``NB * KSPLIT`` up tasks ``(fb, ks)``: the base ``x @ w13[e, rows].T`` for ``BF``
   features of expert ``e`` (gate/up rows read as pairs, whatever the layout) over
   slice ``ks`` of ``H``. The last of the ``KSPLIT`` slices to arrive sums the partials
   and runs the epilogue: the LoRA expand ``sh @ gate_up_B[s, e].T`` (after phase 1 is
   complete), ``act = silu(gate) * up * gamma`` in float32, stored once in the working
   dtype, and the down shrink ``act @ down_A[s, e, :, fblock].T`` atomically added into
   ``mid [T, O, R]`` (the shared outer adds over the experts: that *is* the expert sum);
3. ``N3`` down tasks, ``BN`` hidden columns each (after phase 2 is complete):
   ``out = act @ w2_lin[:, cols] + scale * mid[:, o] @ down_B[s, o, cols].T``, written
   once in the working dtype (no float32 output workspace, no atomics on ``out``).

Why tickets rather than ``program_id``: a task waits only for tasks with *smaller*
tickets, and a ticket is taken only by a program that is running, so every wait ends
even when the grid has more programs than fit on the GPU at once, and Triton's CPU
interpreter, which runs the programs one after another, runs the same code: its first
program takes every task in order and never waits. The up tasks stream ``w13`` before
they wait for the shrink, so the shrink hides under the weight stream.

Graph replays: the last program to leave zeroes ``sh``, ``mid`` and the counters
(every other program has left, so nothing reads them any more), and the last split
of each feature block zeroes that block's counter; the next launch finds the workspace
as ``make_workspace`` made it, with no memset launch.

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

from ..batch import SlotBatch
from ..operands import SinkOperands

MAX_TOKENS = 64
"""Tokens one launch handles (one tile of ``BT <= 64`` rows): the regime of weight streaming."""


# -- the kernel -------------------------------------------------------------------------------

@triton.jit
def _wait_at_least(ptr, target):
    """Spin until ``*ptr >= target``. The acquire makes the writes released before each
    increment visible; only ever called for counters of smaller tickets (module docstring)."""
    seen = tl.atomic_add(ptr, 0, sem="acquire")
    while seen < target:
        seen = tl.atomic_add(ptr, 0, sem="acquire")


@triton.jit
def _signal(ptr):
    """Count one finished task: the barrier first, so every thread's writes precede the
    (one-thread) release increment."""
    tl.debug_barrier()
    tl.atomic_add(ptr, 1, sem="release")


@triton.jit
def _shrink_task(i, x_ptr, slot_ptr, ga_ptr, sh_ptr, cnt_ptr, T, H, R, O, S, KS1, SK_CHUNK,
                 BT: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr):
    """Ticket ``i < N1`` -> ``(o, s, k)``: slice ``k`` of ``H`` of the gate/up shrink of slot
    ``s``, outer ``o``, for the tokens of that slot (skipped when no token uses it)."""
    o = i // (S * KS1)
    s = (i // KS1) % S
    k0 = (i % KS1) * SK_CHUNK
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
        for k in range(k0, k0 + SK_CHUNK, BK):
            kk = k + tl.arange(0, BK)
            k_ok = kk < H
            xt = tl.load(x_ptr + rows[:, None] * H + kk[None, :], mask=sel[:, None] & k_ok[None, :], other=0.0)
            at = tl.load(ga_ptr + a_row[:, None] * H + kk[None, :], mask=col_ok[:, None] & k_ok[None, :],
                         other=0.0)
            acc = tl.dot(xt, tl.trans(at), acc)
        dst = sh_ptr + rows[:, None] * (O * 2 * R) + o * 2 * R + (j // BR * R + r)[None, :]
        tl.atomic_add(dst, acc, mask=sel[:, None] & col_ok[None, :], sem="relaxed")
    _signal(cnt_ptr + 1)


@triton.jit
def _up_task(j, x_ptr, w13_ptr, gam_ptr, act_ptr, slot_ptr, scale_ptr, sh_ptr, gb_ptr, da_ptr, mid_ptr,
             part_ptr, cnt_ptr, T, H, F, R, O, N_EXP, O_STEP, ROW_STEP, UP_OFFSET, N1, K_CHUNK,
             HAS_LORA: tl.constexpr, BT: tl.constexpr, BF: tl.constexpr, BK: tl.constexpr, RC: tl.constexpr,
             KSPLIT: tl.constexpr):
    """Up ticket ``j`` (counted from ``N1``) -> feature block ``fb = j // KSPLIT`` (expert
    ``e``, features ``f0..f0+BF-1``) and slice ``ks = j % KSPLIT`` of ``H``."""
    fb = j // KSPLIT
    ks = j % KSPLIT
    fb_per_e = tl.cdiv(F, BF)
    e = fb // fb_per_e
    f0 = (fb % fb_per_e) * BF
    rows = tl.arange(0, BT)
    row_ok = rows < T
    jj = tl.arange(0, 2 * BF)           # weight rows as (gate f0, up f0, gate f0+1, up f0+1, ...)
    f_of_j = f0 + jj // 2
    w_row = e * 2 * F + f_of_j * ROW_STEP + (jj % 2) * UP_OFFSET
    w_ok = f_of_j < F
    acc = tl.zeros((BT, 2 * BF), dtype=tl.float32)
    k_begin = ks * K_CHUNK
    for k in range(k_begin, k_begin + K_CHUNK, BK):
        kk = k + tl.arange(0, BK)
        k_ok = kk < H
        xt = tl.load(x_ptr + rows[:, None] * H + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        wt = tl.load(w13_ptr + w_row[:, None] * H + kk[None, :], mask=w_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(xt, tl.trans(wt), acc)

    if KSPLIT > 1:
        # Split-K over H keeps many programs streaming for few features (shape A has
        # only n*F/BF feature blocks); the last slice to arrive finishes the block.
        cols = tl.arange(0, 2 * BF)
        tile = rows[:, None] * (2 * BF) + cols[None, :]
        tl.store(part_ptr + (fb * KSPLIT + ks) * (BT * 2 * BF) + tile, acc)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + 4 + fb, 1, sem="acq_rel")
        last = arrived == KSPLIT - 1
        if last:
            acc = tl.zeros((BT, 2 * BF), dtype=tl.float32)
            for q in range(0, KSPLIT):
                acc += tl.load(part_ptr + (fb * KSPLIT + q) * (BT * 2 * BF) + tile, cache_modifier=".cg")
            tl.atomic_xchg(cnt_ptr + 4 + fb, 0)   # every split has arrived: ready for the next launch
    else:
        last = True
    if last:
        gate, up = tl.split(tl.reshape(acc, (BT, BF, 2)))
        fs = f0 + tl.arange(0, BF)
        f_ok = fs < F
        o = e * O_STEP
        slot = tl.load(slot_ptr + rows, mask=row_ok, other=-1)
        smin = tl.min(tl.where(slot >= 0, slot, 1 << 30), axis=0)
        smax = tl.max(slot, axis=0)
        if HAS_LORA:
            _wait_at_least(cnt_ptr + 1, N1)   # the gate/up shrink is complete
            for s in range(smin, smax + 1):
                sel = row_ok & (slot == s)
                if tl.sum(sel.to(tl.int32), axis=0) > 0:
                    scale = tl.load(scale_ptr + s)
                    b_base = gb_ptr + (s * N_EXP + e) * 2 * F * R
                    # The rank in chunks of RC: registers independent of R (a [BT, 64] chunk
                    # and its B tiles spilled the kernel at R 64).
                    for r0 in range(0, R, RC):
                        r = r0 + tl.arange(0, RC)
                        r_ok = r < R
                        src = sh_ptr + rows[:, None] * (O * 2 * R) + o * 2 * R + r[None, :]
                        ld = sel[:, None] & r_ok[None, :]
                        sg = tl.load(src, mask=ld, other=0.0, cache_modifier=".cg")
                        su = tl.load(src + R, mask=ld, other=0.0, cache_modifier=".cg")
                        bmask = r_ok[:, None] & f_ok[None, :]
                        bg = tl.load(b_base + fs[None, :] * R + r[:, None], mask=bmask, other=0.0)    # [RC, BF]
                        bu = tl.load(b_base + (F + fs)[None, :] * R + r[:, None], mask=bmask, other=0.0)
                        gate += scale * tl.dot(sg.to(bg.dtype), bg)
                        up += scale * tl.dot(su.to(bu.dtype), bu)
        gam = tl.load(gam_ptr + rows * N_EXP + e, mask=row_ok, other=0.0).to(tl.float32)
        act = gate / (1.0 + tl.exp(-gate)) * up * gam[:, None]     # SwiGLU x gamma in float32 (docs/reference.md#the-base-module)
        act_lp = act.to(act_ptr.dtype.element_ty)                  # the one cast to the working dtype
        tl.store(act_ptr + rows[:, None] * (N_EXP * F) + e * F + fs[None, :], act_lp,
                 mask=row_ok[:, None] & f_ok[None, :])
        if HAS_LORA:
            for s in range(smin, smax + 1):
                sel = row_ok & (slot == s)
                if tl.sum(sel.to(tl.int32), axis=0) > 0:
                    a_sel = tl.where(sel[:, None], act_lp, 0.0).to(act_lp.dtype)
                    for r0 in range(0, R, RC):
                        r = r0 + tl.arange(0, RC)
                        r_ok = r < R
                        da = tl.load(da_ptr + ((s * N_EXP + e) * R + r)[None, :] * F + fs[:, None],
                                     mask=f_ok[:, None] & r_ok[None, :], other=0.0)              # [BF, RC]
                        tl.atomic_add(mid_ptr + rows[:, None] * (O * R) + o * R + r[None, :], tl.dot(a_sel, da),
                                      mask=sel[:, None] & r_ok[None, :], sem="relaxed")
        _signal(cnt_ptr + 2)


@triton.jit
def _down_task(i, act_ptr, w2_ptr, out_ptr, slot_ptr, scale_ptr, mid_ptr, db_ptr, cnt_ptr, seen_ptr,
               T, H, F, R, O, N_EXP, NB,
               HAS_LORA: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr, BKD: tl.constexpr, RC: tl.constexpr,
               PREFETCH: tl.constexpr):
    """Down ticket ``i`` -> hidden columns ``i*BN..i*BN+BN-1`` of ``out``, over ``K = n*F``
    read as ``cdiv(F, BKD)`` steps inside each expert (every load contiguous in ``F``)."""
    rows = tl.arange(0, BT)
    row_ok = rows < T
    hs = i * BN + tl.arange(0, BN)
    h_ok = hs < H
    kb = tl.cdiv(F, BKD)
    if PREFETCH:
        # Read this task's w2 columns once before the wait, so that they come from HBM
        # while the up phase still streams and the product after the wait reads them
        # from L2. Their sum goes to a scratch slot: a load whose value is never used
        # would be dropped as dead code.
        seen = tl.zeros((BN,), dtype=tl.float32)
        for q in range(0, N_EXP * kb):
            e = q // kb
            fs = (q - e * kb) * BKD + tl.arange(0, BKD)
            wt = tl.load(w2_ptr + e * H * F + hs[None, :] * F + fs[:, None],
                         mask=(fs < F)[:, None] & h_ok[None, :], other=0.0, eviction_policy="evict_last")
            seen += tl.sum(wt.to(tl.float32), axis=0)
        tl.store(seen_ptr + hs, seen, mask=h_ok)
    _wait_at_least(cnt_ptr + 2, NB)           # every feature block's act and down shrink is in
    acc = tl.zeros((BT, BN), dtype=tl.float32)
    for q in range(0, N_EXP * kb):
        e = q // kb
        fs = (q - e * kb) * BKD + tl.arange(0, BKD)
        f_ok = fs < F
        at = tl.load(act_ptr + rows[:, None] * (N_EXP * F) + e * F + fs[None, :],
                     mask=row_ok[:, None] & f_ok[None, :], other=0.0, cache_modifier=".cg")
        wt = tl.load(w2_ptr + e * H * F + hs[None, :] * F + fs[:, None],
                     mask=f_ok[:, None] & h_ok[None, :], other=0.0)                             # [BKD, BN]
        acc = tl.dot(at, wt, acc)
    if HAS_LORA:
        slot = tl.load(slot_ptr + rows, mask=row_ok, other=-1)
        smin = tl.min(tl.where(slot >= 0, slot, 1 << 30), axis=0)
        smax = tl.max(slot, axis=0)
        for s in range(smin, smax + 1):
            sel = row_ok & (slot == s)
            if tl.sum(sel.to(tl.int32), axis=0) > 0:
                scale = tl.load(scale_ptr + s)
                for o in range(0, O):
                    for r0 in range(0, R, RC):
                        r = r0 + tl.arange(0, RC)
                        r_ok = r < R
                        m = tl.load(mid_ptr + rows[:, None] * (O * R) + o * R + r[None, :],
                                    mask=sel[:, None] & r_ok[None, :], other=0.0, cache_modifier=".cg")
                        b = tl.load(db_ptr + ((s * O + o) * H + hs)[None, :] * R + r[:, None],
                                    mask=r_ok[:, None] & h_ok[None, :], other=0.0)               # [RC, BN]
                        acc += scale * tl.dot(m.to(b.dtype), b)
    tl.store(out_ptr + rows[:, None] * H + hs[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & h_ok[None, :])


# Arguments that change from call to call (tokens, slots, task counts, layout) are not
# specialized: Triton would otherwise compile anew whenever one of them is 1 or turns
# divisible by 16 (T 1 / 8 / 32, S 1 / 4 / 8 ...), and a sweep would spend its time compiling.
@triton.jit(do_not_specialize=["T", "O", "S", "O_STEP", "ROW_STEP", "UP_OFFSET", "N1", "KS1", "SK_CHUNK", "NB",
                               "K_CHUNK", "N3"])
def single_launch_kernel(x_ptr, w13_ptr, w2_ptr, gam_ptr, slot_ptr, scale_ptr,
                         ga_ptr, gb_ptr, da_ptr, db_ptr, out_ptr,
                         sh_ptr, mid_ptr, act_ptr, part_ptr, cnt_ptr, seen_ptr,
                         T, H, F, R, O, S, N_EXP, O_STEP, ROW_STEP, UP_OFFSET,
                         N1, KS1, SK_CHUNK, NB, K_CHUNK, N3,
                         HAS_LORA: tl.constexpr, BT: tl.constexpr, BF: tl.constexpr, BK: tl.constexpr,
                         BKS: tl.constexpr, BR: tl.constexpr, RC: tl.constexpr, BN: tl.constexpr,
                         BKD: tl.constexpr, KSPLIT: tl.constexpr, PREFETCH: tl.constexpr):
    """Any grid size: each program takes tickets until all ``N1 + NB*KSPLIT + N3`` tasks
    are taken (module docstring). ``x [T, H]``, ``gammas [T, n]``, ``slots [T]`` int32
    (``-1``: base only), ``scalings [S]`` float32 -> ``out [T, H]``; workspace ``sh [T, O*2R]``,
    ``mid [T, O*R]`` float32 (zero on entry and on exit), ``act [T, n*F]`` working dtype,
    ``part [NB, KSPLIT, BT, 2BF]`` float32, ``counters [4 + NB]`` int32 (zero on entry and exit),
    ``seen [H]`` float32 (``PREFETCH``'s scratch, never read)."""
    n_up = NB * KSPLIT
    t = tl.atomic_add(cnt_ptr + 0, 1, sem="relaxed")
    if t < N1:
        if HAS_LORA:  # N1 = 0 without: compile no shrink at all (its tile costs registers)
            _shrink_task(t, x_ptr, slot_ptr, ga_ptr, sh_ptr, cnt_ptr, T, H, R, O, S, KS1, SK_CHUNK, BT, BR, BKS)
    elif t < N1 + n_up:
        _up_task(t - N1, x_ptr, w13_ptr, gam_ptr, act_ptr, slot_ptr, scale_ptr, sh_ptr, gb_ptr, da_ptr,
                 mid_ptr, part_ptr, cnt_ptr, T, H, F, R, O, N_EXP, O_STEP, ROW_STEP, UP_OFFSET, N1, K_CHUNK,
                 HAS_LORA, BT, BF, BK, RC, KSPLIT)
    else:
        _down_task(t - N1 - n_up, act_ptr, w2_ptr, out_ptr, slot_ptr, scale_ptr, mid_ptr, db_ptr, cnt_ptr,
                   seen_ptr, T, H, F, R, O, N_EXP, NB, HAS_LORA, BT, BN, BKD, RC, PREFETCH)

    tl.debug_barrier()
    left = tl.atomic_add(cnt_ptr + 3, 1, sem="acq_rel")
    if left == tl.num_programs(0) - 1:
        # The last program out: nobody reads sh, mid or the counters any more. Zero
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
        c = tl.arange(0, 4)
        tl.store(cnt_ptr + c, tl.zeros((4,), dtype=tl.int32))


# -- the host side ----------------------------------------------------------------------------

@dataclass(frozen=True)
class SingleConfig:
    """Tile sizes of the one-launch kernel (all powers of two, ``>= 16``): ``bf`` features
    per up task (its dot is ``2*bf`` wide, gate and up); ``ksplit`` slices of ``H`` per
    feature block (``0``: enough for about ``2 x`` the multiprocessors); ``bk`` the up and
    shrink reduction step; ``sk_chunk`` the shrink's slice of ``H`` (a multiple of ``bk``);
    ``bn`` hidden columns per down task and ``bkd`` its reduction step; ``programs`` the
    grid is one program per task. ``prefetch``: each down task reads its ``w2`` columns
    into L2 before it waits for the up phase (overlapping the two streams)."""

    bf: int = 16
    ksplit: int = 0
    bk: int = 128
    sk_chunk: int = 128
    bn: int = 16
    bkd: int = 128
    warps: int = 4
    stages: int = 3
    prefetch: bool = False

    def __post_init__(self) -> None:
        for name in ("bf", "bk", "sk_chunk", "bn", "bkd"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"SingleConfig.{name} must be a power of two >= 16 (tl.dot's smallest side), got {v}")
        if self.sk_chunk % self.bk:
            raise ValueError(f"SingleConfig.sk_chunk={self.sk_chunk} must be a multiple of bk={self.bk}: "
                             "the shrink walks its slice of H in steps of bk")
        if self.ksplit < 0 or self.warps < 1 or self.stages < 1:
            raise ValueError(f"SingleConfig: ksplit must be >= 0, warps and stages >= 1, got {self}")


@dataclass(frozen=True, eq=False)
class Workspace:
    """What one launch reads and writes besides its inputs, allocated once so a CUDA graph
    replays against fixed addresses: ``sh [max_tokens, O*2R]``, ``mid [max_tokens, O*R]``
    float32, ``act [max_tokens, n*F]`` working dtype, ``part [NB * ksplit * BT * 2bf]``
    float32, ``counters [4 + NB]`` int32 (``[0]`` the next ticket, ``[1]`` shrink tasks done,
    ``[2]`` feature blocks done, ``[3]`` programs left, ``[4 + fb]`` H slices of feature block
    ``fb`` arrived; ``NB = n * cdiv(F, bf)``) and
    ``seen [H]`` float32 (the prefetch's scratch).
    The kernel leaves ``sh``, ``mid`` and ``counters`` zero, as it found them."""

    config: SingleConfig
    ksplit: int
    max_tokens: int
    shape: tuple[int, int, int, int, int]   # (n, H, F, O, R) it was made for
    sh: torch.Tensor
    mid: torch.Tensor
    act: torch.Tensor
    part: torch.Tensor
    counters: torch.Tensor
    seen: torch.Tensor


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
    """Slices of ``H`` that give about two up tasks per multiprocessor, each slice at
    least two reduction steps long."""
    if config.ksplit:
        return config.ksplit
    blocks = n * triton.cdiv(F, config.bf)
    return max(1, min(triton.cdiv(2 * sms, blocks), H // (2 * config.bk)))


def pick_config(ops: SinkOperands, num_tokens: int) -> SingleConfig:
    """The tiles for ``num_tokens`` tokens on ``ops``'s shapes (defaults; ``scripts/h200_single_launch.py``
    sweeps alternatives on the H200 and records which won)."""
    if num_tokens <= 16:
        return SingleConfig()
    # At 32 tokens the [32, 128] x and w13 tiles of a step take ~245 registers (sm_90,
    # 4 warps: two programs per multiprocessor at most); 64-wide steps take ~205.
    return SingleConfig(bk=64, bkd=64, stages=4)


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
    f32 = dict(dtype=torch.float32, device=device)
    bt = _block_tokens(max_tokens)
    return Workspace(config, ksplit, max_tokens, (n, H, F, O, R),
                     sh=torch.zeros(max_tokens, max(O * 2 * R, 1), **f32),
                     mid=torch.zeros(max_tokens, max(O * R, 1), **f32),
                     act=torch.empty(max_tokens, n * F, dtype=ops.dtype, device=device),
                     part=torch.empty(blocks * ksplit * bt * 2 * config.bf if ksplit > 1 else 1, **f32),
                     counters=torch.zeros(4 + blocks, dtype=torch.int32, device=device),
                     seen=torch.empty(H if config.prefetch else 1, **f32))


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
        sk_chunk = c.sk_chunk
        ks1 = triton.cdiv(H, sk_chunk)
        n1 = O * S * ks1
    else:
        ga = gb = da = db = x   # never read: HAS_LORA=False drops every use
        S, sk_chunk, ks1, n1 = 1, c.bk, 1, 0
    blocks = n * triton.cdiv(F, c.bf)
    k_chunk = triton.cdiv(triton.cdiv(H, ws.ksplit), c.bk) * c.bk   # each slice a whole number of steps
    n3 = triton.cdiv(H, c.bn)
    tasks = n1 + blocks * ws.ksplit + n3
    row_step, up_offset = (2, 1) if ops.interleaved else (1, F)
    br = max(16, triton.next_power_of_2(max(R, 1)))
    single_launch_kernel[(tasks,)](
        x, ops.w13.detach(), ops.w2.detach(), gammas, slots_i32, scalings_f32, ga, gb, da, db, out,
        ws.sh, ws.mid, ws.act, ws.part, ws.counters, ws.seen,
        T, H, F, R, O, S, n, 0 if O == 1 else 1, row_step, up_offset,
        n1, ks1, sk_chunk, blocks, k_chunk, n3,
        HAS_LORA=has_lora, BT=_block_tokens(T), BF=c.bf, BK=c.bk, BKS=_shrink_step(c.bk, br), BR=br, RC=16,
        BN=c.bn, BKD=c.bkd, KSPLIT=ws.ksplit, PREFETCH=c.prefetch, num_warps=c.warps, num_stages=c.stages)
    return out


def single_launch_forward(ops: SinkOperands, x: torch.Tensor, gammas: torch.Tensor,
                          batch: SlotBatch | None) -> torch.Tensor:
    """The backend signature (``fn(ops, x [T, H], gammas [T, n], batch) -> out [T, H]``): the
    device slots and a workspace made on the spot, then ``launch_single`` (eager use)."""
    slots, scalings = device_slots(batch, x.shape[0], x.device)
    return launch_single(ops, x.contiguous(), gammas.contiguous(), slots, scalings)
