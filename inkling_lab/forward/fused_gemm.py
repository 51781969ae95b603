"""The many-token forward as two Triton GEMMs with the LoRA folded in (KERNEL_NOTES.md, v15).

On Hopper a ``tl.dot`` between tiles loaded through tensor descriptors (the copy engine,
TMA) compiles to wgmma with the operands staged in shared memory; the kit's
pointer-loaded GEMMs reached ~400 TFLOP/s, cuBLAS ~750 (v1). These two kernels are
GEMMs whose LoRA terms are extra reduction steps of the same accumulator, so neither
``y`` nor a LoRA-only ``out`` ever goes through memory and no epilogue has a launch of
its own:

1. ``fused_up_kernel``: per tile of ``BM`` tokens by ``BF`` features of one expert,
   ``y = x @ w13_lin[rows].T`` over ``H``, then for each slot ``s`` present in the tile
   ``y += (scalings[s] * sh[tokens of s]) @ w1_delta[s, rows].T`` (``K`` extended by
   ``2R``: ``w1_delta`` maps the shrink onto ``y``'s own rows, docs/reference.md#the-forward), then
   ``act = silu(gate) * up * gamma`` in float32, stored once (``act [T, n*F]``).
   Interleaved ``w13``: one ``[2*BF, BK]`` weight tile of gate/up pairs, split after the
   loop; contiguous: a gate tile and an up tile, two accumulators.
2. ``fused_down_kernel``: ``out = act @ w2_lin`` over ``n*F`` plus, per slot present,
   ``(scalings[s] * mid[tokens of s]) @ down_B[s, 0].T`` (``K`` extended by ``R``).

Around them (``triton_backend.launch``): the gate/up shrink ``sh [T, 2R] = x @
gate_up_A[s, 0].T`` and the down shrink ``mid [T, R] = act @ a_cat[s].T``, cuBLAS GEMMs:
``plan`` gives these kernels only batches whose LoRA tokens all use one slot (the
kernels' per-slot loop masks other rows; with several slots the shrink kernel's
float32 workspaces measured slower, KERNEL_NOTES.md v15). Shared outer only
(``w1_delta`` and ``a_cat`` exist only there); ``F`` a multiple of ``BF``.

Both kernels are persistent when ``NUM_PROGS`` is below the tile count: program ``p``
takes tiles ``p, p + NUM_PROGS, ...`` in grouped order (``GROUP_M`` token tiles walk the
same weight columns while those sit in L2). Descriptors are built on the host
(``triton.tools.tensor_descriptor.TensorDescriptor``: no device-side allocator); rows
past ``T`` read as zero and are not stored.

Shapes in the reference's symbols: ``x [T, H]``, ``w13_lin [n*2F, H]``, ``w2_lin [n*F, H]``,
``w1_delta [S, n*2F, 2R]``, ``down_B [S, 1, H, R]``, ``gammas [T, n]``, ``slots [T]``
int32 (``-1``: no LoRA), ``scalings [S]`` float32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .kernels import _grouped_tile, _tile_slots

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # a Triton without host-side tensor descriptors: the path is not offered
    TensorDescriptor = None


@triton.jit
def _lora_k_steps(acc, d_desc, d_slot, d_off, sh_ptr, slot_ptr, scale_ptr, rows, row_ok, R2, SH_LD,
                  BR2: tl.constexpr, DTYPE: tl.constexpr):
    """``acc += Σ_s (scale_s * sh[rows of s, :R2]) @ D[s*d_row0 + ..].T``: the extra ``K``
    steps of one tile, one per slot present (tokens come in segments: one or two
    slots per tile as a rule). Slot ``s``'s tile of ``D`` starts at row ``s*d_slot + d_off``."""
    slot, smin, smax = _tile_slots(slot_ptr, rows, row_ok)
    r = tl.arange(0, BR2)
    for s in range(smin, smax + 1):
        sel = row_ok & (slot == s)
        scale = tl.load(scale_ptr + s)
        sh = tl.load(sh_ptr + rows[:, None] * SH_LD + r[None, :], mask=sel[:, None] & (r < R2)[None, :], other=0.0)
        d = d_desc.load([s * d_slot + d_off, 0])
        acc = tl.dot((sh.to(tl.float32) * scale).to(DTYPE), d.T, acc)
    return acc


@triton.jit
def fused_up_kernel(x_desc, w_desc, d_desc, act_desc, gam_ptr, slot_ptr, scale_ptr, sh_ptr,
                    T, H, F, N_EXP, R2, NUM_PROGS,
                    HAS_LORA: tl.constexpr, INTERLEAVED: tl.constexpr, BM: tl.constexpr, BF: tl.constexpr,
                    BK: tl.constexpr, BR2: tl.constexpr, GROUP_M: tl.constexpr):
    """Tiles of ``BM`` tokens by ``BF`` features of expert ``e`` (``F % BF == 0``):
    ``act[:, e*F + f0 : +BF]``. ``w_desc`` over ``w13_lin`` with ``[2*BF, BK]`` blocks
    (interleaved) or ``[BF, BK]`` (contiguous), ``d_desc`` over ``w1_delta`` viewed
    ``[S*n*2F, 2R]`` with ``[2*BF or BF, BR2]`` blocks; ``sh [T, R2]`` (``R2 = 2R``)."""
    DTYPE: tl.constexpr = act_desc.dtype
    n_m = tl.cdiv(T, BM)
    f_tiles = F // BF
    n_tiles = n_m * N_EXP * f_tiles
    for tile in tl.range(tl.program_id(0), n_tiles, NUM_PROGS):
        pid_m, pid_f = _grouped_tile(tile, n_m, N_EXP * f_tiles, GROUP_M)
        e = pid_f // f_tiles
        f0 = (pid_f % f_tiles) * BF
        m0 = pid_m * BM
        rows = m0 + tl.arange(0, BM)
        row_ok = rows < T
        if INTERLEAVED:
            r0 = e * 2 * F + 2 * f0
            acc = tl.zeros((BM, 2 * BF), dtype=tl.float32)
            for k in range(0, H, BK):
                acc = tl.dot(x_desc.load([m0, k]), w_desc.load([r0, k]).T, acc)
            if HAS_LORA:
                acc = _lora_k_steps(acc, d_desc, N_EXP * 2 * F, r0, sh_ptr, slot_ptr, scale_ptr, rows, row_ok,
                                    R2, R2, BR2, DTYPE)
            gate, up = tl.split(tl.reshape(acc, (BM, BF, 2)))
        else:
            g0, u0 = e * 2 * F + f0, e * 2 * F + F + f0
            gate = tl.zeros((BM, BF), dtype=tl.float32)
            up = tl.zeros((BM, BF), dtype=tl.float32)
            for k in range(0, H, BK):
                xt = x_desc.load([m0, k])
                gate = tl.dot(xt, w_desc.load([g0, k]).T, gate)
                up = tl.dot(xt, w_desc.load([u0, k]).T, up)
            if HAS_LORA:
                gate = _lora_k_steps(gate, d_desc, N_EXP * 2 * F, g0, sh_ptr, slot_ptr, scale_ptr, rows, row_ok,
                                     R2, R2, BR2, DTYPE)
                up = _lora_k_steps(up, d_desc, N_EXP * 2 * F, u0, sh_ptr, slot_ptr, scale_ptr, rows, row_ok,
                                   R2, R2, BR2, DTYPE)
        gam = tl.load(gam_ptr + rows * N_EXP + e, mask=row_ok, other=0.0).to(tl.float32)
        act = gate / (1.0 + tl.exp(-gate)) * up * gam[:, None]
        act_desc.store([m0, e * F + f0], act.to(DTYPE))


@triton.jit
def fused_down_kernel(a_desc, w2_desc, db_desc, out_desc, slot_ptr, scale_ptr, mid_ptr,
                      T, K, H, R, NUM_PROGS,
                      HAS_LORA: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                      BR: tl.constexpr, GROUP_M: tl.constexpr):
    """Tiles of ``BM`` tokens by ``BN`` hidden columns: ``out = act @ w2_lin`` over
    ``K = n*F`` (``a_desc`` ``[BM, BK]``, ``w2_desc`` ``[BK, BN]`` blocks) plus the LoRA
    steps over ``mid [T, R]`` against ``down_B`` viewed ``[S*H, R]`` (``db_desc``,
    ``[BN, BR]`` blocks)."""
    DTYPE: tl.constexpr = out_desc.dtype
    n_m = tl.cdiv(T, BM)
    n_n = tl.cdiv(H, BN)
    for tile in tl.range(tl.program_id(0), n_m * n_n, NUM_PROGS):
        pid_m, pid_n = _grouped_tile(tile, n_m, n_n, GROUP_M)
        m0, n0 = pid_m * BM, pid_n * BN
        rows = m0 + tl.arange(0, BM)
        row_ok = rows < T
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            acc = tl.dot(a_desc.load([m0, k]), w2_desc.load([k, n0]), acc)
        if HAS_LORA:
            acc = _lora_k_steps(acc, db_desc, H, n0, mid_ptr, slot_ptr, scale_ptr, rows, row_ok, R, R, BR, DTYPE)
        out_desc.store([m0, n0], acc.to(DTYPE))


def available() -> bool:
    """This Triton has host-side tensor descriptors."""
    return TensorDescriptor is not None


def supported(ops, device: torch.device, t) -> bool:
    """The fused GEMMs can run this forward with tiles ``t``: shared outer (or no pool),
    ``F`` a multiple of ``t.bf``, every row stride a multiple of 16 bytes (the copy
    engine's rule: ``H``, ``n*F`` and ``R`` elements), and on CUDA a Hopper or later GPU
    (elsewhere only the interpreter runs them)."""
    device = torch.device(device)
    if not available() or (ops.buffers is not None and not ops.shared_outer):
        return False
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] < 9:
        return False
    per16 = 16 // ops.w13.element_size()
    R = ops.max_rank
    return (ops.intermediate % t.bf == 0 and ops.hidden % per16 == 0 and (ops.n * ops.intermediate) % per16 == 0
            and (ops.buffers is None or R % per16 == 0))


def _programs(tiles: int, t, device: torch.device) -> int:
    """``t.programs``: 0 one program per multiprocessor (persistent), -1 one per tile,
    else that many (the interpreter has no multiprocessors: one per tile there)."""
    if t.programs > 0:
        return min(tiles, t.programs)
    if t.programs < 0 or device.type != "cuda":
        return tiles
    return min(tiles, _sms(device))


_SM_COUNT: dict = {}


def _sms(device: torch.device) -> int:
    if device not in _SM_COUNT:
        _SM_COUNT[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNT[device]


def _desc(t: torch.Tensor, block: list[int]):
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block)


def up(ops, x: torch.Tensor, gammas: torch.Tensor, act: torch.Tensor, slots: torch.Tensor, scalings: torch.Tensor,
       sh: torch.Tensor | None, t) -> None:
    """``act [T, n*F] = swiglu(x @ w13_lin.T + LoRA expand of sh) * gammas`` in one launch
    (``sh [T, 2R]`` of any float dtype, unscaled; ``None``: the base alone); ``t`` a
    ``triton_backend.Tiles`` (``bm``, ``bf``, ``bk``, ``warps``, ``stages``, ``group_m``,
    ``programs``)."""
    T, H = x.shape
    n, F = ops.n, ops.intermediate
    wr = 2 * t.bf if ops.interleaved else t.bf
    on = sh is not None
    R2 = sh.shape[1] if on else 16
    br2 = max(16, triton.next_power_of_2(R2))
    d = _desc(ops.w1_delta.view(-1, R2), [wr, br2]) if on else _desc(ops.w13_lin[:, :16], [wr, 16])
    programs = _programs(triton.cdiv(T, t.bm) * n * (F // t.bf), t, x.device)
    fused_up_kernel[(programs,)](
        _desc(x, [t.bm, t.bk]), _desc(ops.w13_lin, [wr, t.bk]), d, _desc(act, [t.bm, t.bf]),
        gammas, slots, scalings, sh if on else x, T, H, F, n, R2, programs,
        HAS_LORA=on, INTERLEAVED=ops.interleaved, BM=t.bm, BF=t.bf, BK=t.bk, BR2=br2, GROUP_M=t.group_m,
        num_warps=t.warps, num_stages=t.stages)


def down(ops, act: torch.Tensor, out: torch.Tensor, slots: torch.Tensor, scalings: torch.Tensor,
         mid: torch.Tensor | None, db: torch.Tensor | None, t) -> None:
    """``out [T, H] = act @ w2_lin + LoRA expand of mid`` in one launch (``mid [T, R]`` of
    any float dtype, unscaled, ``db = down_B [S, 1, H, R]``; ``None``: the base alone)."""
    T, H = out.shape
    K = act.shape[1]
    on = mid is not None
    R = mid.shape[1] if on else 16
    br = max(16, triton.next_power_of_2(R))
    dbd = _desc(db.view(-1, R), [t.bn, br]) if on else _desc(ops.w2_lin[:, :16], [t.bn, 16])
    programs = _programs(triton.cdiv(T, t.bm) * triton.cdiv(H, t.bn), t, out.device)
    fused_down_kernel[(programs,)](
        _desc(act, [t.bm, t.bk]), _desc(ops.w2_lin, [t.bk, t.bn]), dbd, _desc(out, [t.bm, t.bn]),
        slots, scalings, mid if on else act, T, K, H, R, programs,
        HAS_LORA=on, BM=t.bm, BN=t.bn, BK=t.bk, BR=br, GROUP_M=t.group_m, num_warps=t.warps, num_stages=t.stages)
