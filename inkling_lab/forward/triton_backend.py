"""The Triton backend (``forward/kernels.py``): three launches per forward for few
tokens; for many, cuBLAS's two base GEMMs with four launches around them.

``triton_forward(ops, x, gammas, batch)`` is ``launch(ops, x, gammas, plan(...))``:
``plan`` turns the ``SlotBatch`` into device tensors (each token's effective slot,
``-1`` for base only and rank-0 slots, and the per-slot scalings) and picks tile
sizes for the token count; ``launch`` only enqueues kernels, so a CUDA graph can
capture it and replay it against the same plan.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from ..batch import SlotBatch
from ..operands import SinkOperands
from . import kernels


@dataclass(frozen=True)
class Tiles:
    """Tile sizes of the kernels. ``bm`` tokens per tile; ``bf`` features per up tile
    (its dot is ``2*bf`` wide: gate and up); ``bn`` hidden columns per down tile;
    ``bk`` the reduction step; ``k_chunk`` the shrink's slice of ``H``; ``cublas``:
    the two base GEMMs through cuBLAS, the kernels as their prologue and epilogues;
    ``sbm``/``swarps``: the shrink's own token tile and warps (0: ``bm``, 4 warps)."""

    bm: int
    bf: int
    bn: int
    bk: int
    k_chunk: int
    warps: int
    stages: int
    group_m: int = 8
    cublas: bool = False
    sbm: int = 0
    swarps: int = 4


SMALL_WEIGHTS = 4 << 20
"""``n*F*H`` up to which the all-Triton path still beats cuBLAS at 64-128 tokens."""


def pick_tiles(num_tokens: int, weight_elems: int = SMALL_WEIGHTS) -> Tiles:
    """Tiles by token count (and ``weight_elems = n*F*H``): few tokens stream weights
    (narrow tiles, many programs, the shrink split over ``H``, three launches); many
    tokens are a GEMM, run by cuBLAS with the kernels as prologue and epilogues.
    Chosen from the H200 sweep recorded in KERNEL_NOTES.md."""
    if num_tokens <= 16:
        return Tiles(bm=16, bf=16, bn=16, bk=128, k_chunk=128, warps=2, stages=4)
    if num_tokens <= 32 or (num_tokens <= 128 and weight_elems <= SMALL_WEIGHTS):
        return Tiles(bm=16, bf=32, bn=32, bk=128, k_chunk=128, warps=4, stages=4)
    if num_tokens <= 128:
        return Tiles(bm=32, bf=32, bn=32, bk=64, k_chunk=512, warps=4, stages=3, cublas=True, sbm=64)
    # Many tokens: the shrinks split K in 512-wide slices while that keeps more
    # multiprocessors busy than it costs in atomics (up to ~4096 tokens on the H200).
    k_chunk = 512 if num_tokens <= 4096 else 1 << 30
    return Tiles(bm=64, bf=128, bn=128, bk=64, k_chunk=k_chunk, warps=8, stages=2, cublas=True, sbm=64)


@dataclass(frozen=True)
class Plan:
    """What one batch needs on the device: ``slots [T]`` int32 (``-1``: no LoRA),
    ``scalings [S]`` float32, ``sh [T, O*2R]`` the shrink's float32 workspace (zero
    between forwards), ``has_lora`` and the tiles."""

    slots: torch.Tensor
    scalings: torch.Tensor
    sh: torch.Tensor | None
    has_lora: bool
    tiles: Tiles


def plan(ops: SinkOperands, num_tokens: int, batch: SlotBatch | None, device: torch.device,
         tiles: Tiles | None = None) -> Plan:
    """The device-side description of ``batch`` for ``launch`` (host work, not capturable)."""
    tiles = tiles or pick_tiles(num_tokens, ops.n * ops.intermediate * ops.hidden)
    if batch is None or ops.buffers is None or not batch.active_slots():
        empty = torch.full((max(num_tokens, 1),), -1, dtype=torch.int32, device=device)
        return Plan(empty, torch.ones(1, device=device), None, False, tiles)
    slots = batch.token_slots().clone()
    lora = slots >= 0
    slots[lora] = torch.where(batch.lora_ranks[slots[lora]] == 0, -1, slots[lora])
    ga = ops.buffers[0]
    sh = torch.zeros(max(num_tokens, 1), ga.shape[1] * ga.shape[2], dtype=torch.float32, device=device)
    return Plan(slots.to(device=device, dtype=torch.int32), batch.scalings.to(device=device, dtype=torch.float32),
                sh, True, tiles)


def launch(ops: SinkOperands, x: torch.Tensor, gammas: torch.Tensor, p: Plan,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Enqueue the forward for ``x [T, H]``, ``gammas [T, n]`` -> ``out [T, H]`` (x's dtype)."""
    T, H = x.shape
    n, F = ops.n, ops.intermediate
    out = torch.empty_like(x) if out is None else out
    if T == 0:
        return out
    x, gammas = x.contiguous(), gammas.contiguous()
    w13, w2 = ops.w13.detach(), ops.w2.detach()
    t = p.tiles
    act = torch.empty(T, n * F, dtype=x.dtype, device=x.device)
    if p.has_lora:
        ga, gb, da, db = (b.detach().contiguous() for b in ops.buffers)
        S, O, two_r, _ = ga.shape
        R = two_r // 2
        BR = max(16, triton.next_power_of_2(R))
        sh, mid = p.sh, torch.empty(T, O * R, dtype=torch.float32, device=x.device)
        _shrink(x, p, ga, sh, mid, H, H, 0, R, O, O * 2 * R, 2 * R, 2, BR, True)
        o_step = 0 if O == 1 else 1
    else:
        gb = da = db = sh = mid = x  # never read: HAS_LORA=False drops every use
        O = R = o_step = 0
        BR = 16
    y = torch.mm(x, w13.view(n * 2 * F, H).T) if t.cublas else x
    row_step, up_offset = (2, 1) if ops.interleaved else (1, F)
    grid_up = (triton.cdiv(T, t.bm) * n * triton.cdiv(F, t.bf),)
    kernels.up_kernel[grid_up](
        x, w13, y, gammas, act, p.slots, p.scalings, sh, gb, da, mid,
        T, H, F, R, O, n, o_step, row_step, up_offset,
        Y_IN=t.cublas, HAS_LORA=p.has_lora, BM=t.bm, BF=t.bf, BK=t.bk, BR=BR, GROUP_M=t.group_m,
        num_warps=t.warps, num_stages=t.stages)
    if t.cublas:
        if not p.has_lora:
            return torch.mm(act, ops.w2_lin, out=out)
        if O == 1:  # a_cat [S, R, n*F]: one shrink over all experts' features is the expert sum
            _shrink(act, p, ops.a_cat, mid, mid, n * F, n * F, 0, R, 1, R, 0, 1, BR, False)
        else:       # down_A [S, n, R, F]: expert e reads its own F columns of act
            _shrink(act, p, da, mid, mid, F, n * F, F, R, O, n * R, R, 1, BR, False)
    grid_down = (triton.cdiv(T, t.bm) * triton.cdiv(H, t.bn),)
    kernels.down_kernel[grid_down](
        act, w2, out, p.slots, p.scalings, mid, db, sh,
        T, H, F, R, O, n,
        BASE=not t.cublas, HAS_LORA=p.has_lora, BM=t.bm, BN=t.bn, BK=t.bk, BR=BR, GROUP_M=t.group_m,
        num_warps=t.warps, num_stages=t.stages)
    if t.cublas:
        out.addmm_(act, ops.w2_lin)  # cuBLAS adds the base down GEMM to the LoRA term
    return out


def _shrink(x: torch.Tensor, p: Plan, a: torch.Tensor, dst: torch.Tensor, mid: torch.Tensor, K: int, ldx: int,
            x_o_off: int, R: int, O: int, a_s: int, a_o: int, halves: int, BR: int, zero_mid: bool) -> None:
    """One ``shrink_kernel`` launch (its docstring names the operands)."""
    T = x.shape[0]
    t = p.tiles
    bm = t.sbm or t.bm
    split = triton.cdiv(K, t.k_chunk)
    k_chunk = triton.cdiv(triton.cdiv(K, split), 16) * 16  # a multiple of the step below
    bk = next(b for b in (64, 32, 16) if k_chunk % b == 0)
    S = p.scalings.numel()
    kernels.shrink_kernel[(triton.cdiv(T, bm), O * S, split)](
        x, p.slots, a, dst, mid, T, K, ldx, x_o_off, R, O, a_s, a_o, k_chunk,
        HALVES=halves, ZERO_MID=zero_mid, BM=bm, BR=BR, BK=bk, num_warps=t.swarps, num_stages=3)


def triton_forward(ops: SinkOperands, x: torch.Tensor, gammas: torch.Tensor,
                   batch: SlotBatch | None) -> torch.Tensor:
    """``x [T, H]``, ``gammas [T, n]`` -> ``out [T, H]`` in ``x``'s dtype (base plus LoRA)."""
    return launch(ops, x, gammas, plan(ops, x.shape[0], batch, x.device))
