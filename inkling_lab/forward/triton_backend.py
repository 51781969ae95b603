"""The Triton backend (``forward/kernels.py``): for one token, the shrink and two GEMV
launches (``gemv_up_kernel``, ``gemv_down_kernel``); three launches per forward for other
few-token batches (the up and down GEMVs split over ``K`` where rows are long; one slot on the
TP-8 slice's few features takes ``up_act_kernel`` with the LoRA epilogue as its up launch,
``lora_ups``); for many,
cuBLAS's two base GEMMs with the kernels around them. A batch whose tokens all use one
slot runs cuBLAS GEMMs with its shrinks on a side stream beside the base GEMMs from 17
tokens (48 on small weights; ``_launch_single``, ``chain_tokens``; the expand and activation in
``expand_act_kernel``) and the LoRA folded into the base GEMMs from ``FOLD_TOKENS`` (``_launch_folded``).
Several slots on the cuBLAS path take ``expand_act_kernel`` over their runs of one slot where the runs are
long (``expand_runs``, v36c), ``up_kernel``'s epilogue otherwise, and from 2048 tokens at low ranks run the
down expand as more of the down GEMM's ``K``, a block of rows per used slot (``slot_cats``, v37), else, over runs of
256 tokens or more, ``expand_down_kernel`` over the runs (``DOWN_RUN_TOKENS``, v38). Several slots whose tokens run
in slot order
take grouped GEMMs for their LoRA products where ``grouped_mode`` says (``_launch_grouped``: rank 64
from 2048 tokens, any rank from 8192). Where the tokens per slot are many (``merges``), each slot's
adapter is merged into a copy of the base weights for the forward and the base forward's GEMMs run on
those (``_launch_merged``, ``kernels.merge_kernel``).

``launch(ops, x, gammas, plan(...))`` only enqueues kernels, so a CUDA graph can
capture it and replay it against the same plan. ``plan`` turns the ``SlotBatch`` into
device tensors (each token's effective slot, ``-1`` for base only and rank-0 slots,
the per-slot scalings, the workspaces) and picks tiles for the token count; a batch
made by ``SlotBatch.to(device)`` is resolved on the device at every launch instead,
so a captured forward follows in-place updates of its metadata. ``triton_forward``
(the dispatcher's entry) caches the plan per batch object and, for few tokens, replays
a graph of its launches (host time, KERNEL_NOTES.md).
"""
from __future__ import annotations

import itertools
import math
import os
import weakref
from dataclasses import dataclass, field, replace

import torch
import triton

from ..batch import SlotBatch
from ..catalog import message
from ..operands import SinkOperands
from . import kernels
from .launch_cache import run as _run
from .static import StaticIO


TRITON_ON_CUDA = message("ISL-E014")


def interpreting() -> bool:
    """Triton's CPU interpreter is on (``TRITON_INTERPRET`` set and not ``0``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass(frozen=True)
class Tiles:
    """Tile sizes of the kernels. ``bm`` tokens per tile; ``bf`` features per up tile
    (its dot is ``2*bf`` wide: gate and up); ``bn`` hidden columns per down tile;
    ``bk`` the reduction step; ``k_chunk`` the shrink's slice of ``H``; ``cublas``:
    the two base GEMMs through cuBLAS, the kernels as their prologue and epilogues;
    ``sbm``/``swarps``: the shrink's own token tile and warps (0: ``bm``, 4 warps);
    ``pdl`` (the all-Triton path): the up and down launches are programmatic dependents
    of the launch before them, so each starts while that one runs (``use_pdl``); ``pdl_up`` (v50b): only the
    up launch is (it streams ``w13`` while the shrink runs), the down launch waits for the whole up grid;
    ``down_shrink`` (v52): where every token is on one slot of a host batch, the pool's outer is shared and the down
    launch unsplit, ``down_kernel`` makes the down shrink from the ``act`` tiles it streams (``SHRINK``) and the up
    kernel adds nothing into ``mid`` (elsewhere these tiles run as without it);
    ``gemv`` (one token): ``gemv_up_kernel`` / ``gemv_down_kernel`` instead, ``bf``
    features and ``bk`` of ``H`` per up step, ``bn`` rows of ``w2`` and ``dk`` of ``F``
    per down step; ``up_act`` (a few tokens of one kept slot, ``up_acts``): ``up_act_kernel``
    on the copy, ``bf`` features and ``bk`` of ``H`` per step, the tokens in a tile of at
    least ``bm``, then cuBLAS's down GEMM; ``gather``: the LoRA epilogues read each token's own
    slot's factors (``[bm, 16, bf]`` register tiles, no loop over the tile's slots; v28); ``lora_up``
    (v33, the pool's LoRA, few tokens): the up launch is ``up_act_kernel`` on the base ``w13`` with the LoRA
    epilogue, on these tiles (``UP_ACT_TILES`` or ``UP_ACT_SPLIT_TILES``), the shrink and the down kernel
    on the rest of these; ``ksplit``: ``up_act_kernel``'s programs per tile, each a slice of ``H``. With
    ``gemv``, ``stages`` > 1 (v47): both GEMV streams as Triton's pipelined loops, that many steps deep in
    shared memory (``STAGES``); 1: the register double buffer."""

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
    pdl: bool = False
    gemv: bool = False
    dk: int = 0
    up_act: bool = False
    gather: bool = False
    lora_up: "Tiles | None" = None
    ksplit: int = 1
    pdl_up: bool = False
    down_shrink: bool = False


SMALL_WEIGHTS = 4 << 20
"""``n*F*H`` up to which the all-Triton path still beats cuBLAS at 64-128 tokens."""


def pick_tiles(num_tokens: int, weight_elems: int = SMALL_WEIGHTS, hidden: int = 0) -> Tiles:
    """Tiles by token count (and ``weight_elems = n*F*H``, ``hidden = H``): one token is two
    GEMV launches after the shrink (``gemv_for``: by ``H``, the streams pipelined from Inkling's); few
    tokens stream weights (narrow tiles, many programs, the shrink split over ``H``,
    three launches); many tokens are a GEMM, run by cuBLAS with the kernels as prologue
    and epilogues (narrower epilogue tiles where the features are few, ``NARROW_FEATURES``).
    Chosen from the H200 sweeps recorded in KERNEL_NOTES.md."""
    if num_tokens == 1:  # at any weights (v31): Inkling's at 0.95-0.97x the three launches (h100_gemv_v29-31.json)
        return gemv_for(hidden, weight_elems // hidden if hidden else 0)
    if num_tokens <= 16:
        return Tiles(bm=16, bf=16, bn=16, bk=128, k_chunk=128, warps=2, stages=4)
    if num_tokens <= 32 or (num_tokens <= 128 and weight_elems <= SMALL_WEIGHTS):
        return Tiles(bm=16, bf=32, bn=32, bk=128, k_chunk=128, warps=4, stages=4)
    if num_tokens <= 128:
        return Tiles(bm=32, bf=32, bn=32, bk=64, k_chunk=512, warps=4, stages=3, cublas=True, sbm=64)
    # Many tokens: the shrinks split K in 512-wide slices while that keeps more
    # multiprocessors busy than it costs in atomics (up to ~4096 tokens on the H200).
    k_chunk = 512 if num_tokens <= 4096 else 1 << 30
    if 0 < weight_elems <= NARROW_FEATURES * hidden:
        return Tiles(bm=32, bf=64, bn=128, bk=64, k_chunk=k_chunk, warps=4, stages=2, cublas=True, sbm=64,
                     swarps=SHRINK_WARPS)
    return Tiles(bm=64, bf=128, bn=128, bk=64, k_chunk=k_chunk, warps=8, stages=2, cublas=True, sbm=64,
                 swarps=SHRINK_WARPS)


SHRINK_WARPS = 8
"""The warps of ``shrink_kernel`` on ``pick_tiles``' many-token tiles (more than 128 tokens; 4 below, ``Tiles``'
default). v42 on an H100: alone (``h100_shrinks_v42.json``, R 64, 64 tokens by 512 of ``K``) 8 warps were 0.76-1.08x 4
at 28 of 32 points up to 2048 tokens (median 0.82); in the forward (``h100_grouped_v42.json``, ``kit_w8`` against
``kit``, both flushes) 0.97-0.985x on A where the multi-slot path is routed (R 16, 512 and 2048 tokens), level on B,
Inkling and TP8 (0.98-1.015x, median 0.99), level at 8192 (one slice of ``K``)."""


NARROW_FEATURES = 1024
"""At most this many features in all (``n*F``, e.g. Inkling's TP-8 slice, 768), ``pick_tiles`` gives
the cuBLAS path's activation and down epilogues 32 tokens by 64 features at 4 warps: 64 x 128 tiles
left 6 feature blocks per token tile there (192 programs at 2048 tokens). Measured at 2048 and 8192
tokens, S 4 and 8, R 16 and 64 (``h200_epilogues_v19*.json``): 0.93-0.97x the 64 x 128 tiles at every
one of the 8 TP8 points; on A (1536 features) the same tiles were 0.96-1.02x, on B and Inkling 0.99-1.16x.
The side by side at 4765844 (``history/h200_side_by_side_v19b.json``): TP8 S 4 / 8 at 512-8192 tokens 0.93-0.97x
the record before (v17e)."""


CHAIN_SMALL_TOKENS = 44
"""The token count from which a one-slot batch on A-sized weights (``SMALL_WEIGHTS``) takes the
chain (``chain_tokens``): ``h200_one_slot_a.json`` and ``h200_one_slot_a2.json`` (A, R 16/64, S 1,
both flushes) measured it ahead of the weight-streaming launches from 44 tokens at both ranks (and
of the fused GEMMs, v15, since removed, at 48-128), behind them at 34-36 tokens at R 16 and level at
40 (on ``ONE_SLOT_TILES``, as routed)."""


def chain_tokens(num_tokens: int, weight_elems: int) -> bool:
    """A one-slot host batch of ``num_tokens`` on weights of ``n*F*H = weight_elems`` (shared outer)
    takes ``_launch_single``'s chain (``ONE_SLOT_TILES``) instead of ``pick_tiles``' choice: from 17
    tokens, on A-sized weights (``SMALL_WEIGHTS``) from ``CHAIN_SMALL_TOKENS``, below which the
    weight-streaming launches stay; not where ``folds``. Measured at 2-32 tokens on B, Inkling and
    TP8 (``h200_one_slot_small.json``: v13's launches ahead at 2-16 but for R 64 from 12 tokens on B
    and TP8; ``h200_one_slot_mid.json``: the chain ahead of ``pick_tiles``' launches at 17-32 on
    Inkling and TP8, level at B R 64, 0.3-3 µs behind at B R 16), at 33-128 on A and at 128-8192
    everywhere (``h200_one_slot.json``, ``h200_one_slot_a.json``, ``h200_one_slot_a2.json``)."""
    first = CHAIN_SMALL_TOKENS if weight_elems <= SMALL_WEIGHTS else 17
    return num_tokens >= first and not folds(num_tokens, weight_elems)


def folds(num_tokens: int, weight_elems: int) -> bool:
    """A one-slot batch on the cuBLAS path folds its LoRA into the base GEMMs (``_launch_folded``):
    ``FOLD_TOKENS`` or more tokens on weights over ``SMALL_WEIGHTS`` (on A-sized ones the chain of
    ``_launch_single`` measured faster at 8192 tokens too: 0.89-0.96x sglang against 0.97-0.98x)."""
    return num_tokens >= FOLD_TOKENS and weight_elems > SMALL_WEIGHTS


def gemv_for(hidden: int, features: int = 0) -> Tiles:
    """The GEMV tiles for ``H = hidden`` and ``features = n*F`` (the sweep winners of ``h200_gemv.json`` and its
    successors; 0: not known, the kept copies' stream). From ``PIPELINED_HIDDEN`` (the real model and its TP
    slices) both streams are Triton's pipelined loops, 4 steps deep (v47, ``h100_gemv_v47.json``, ``_v47b.json``):
    with the pool's LoRA 4 features a step of 1024 up and 16 rows of ``w2`` in 256-wide steps down (Inkling
    0.97-0.99x the tiles before at its six T = 1 points; at the TP-8 slice within 0.5 % of the 8 by 512 pipelined
    tile, 0.95x the tiles before at R 64 S 4); the kept copies' bare stream on 8 features by 512 and 8 rows (the one
    pipelined tile timed bare: Inkling 0.97x, the TP-8 slice 0.84x). Below it,
    where ``H > 2048`` and the features are few (``NARROW_FEATURES``), 4 features by 1024 up and 16 rows by 256 down
    (v35, ``h100_gemv_v35.json``); B's 8 by 512 (v47's pipelined tiles 1.04-1.12x them there)."""
    if hidden <= 2048:
        return gemv_tiles()
    if hidden >= PIPELINED_HIDDEN:
        return gemv_tiles(bn=16, dk=256, stages=4) if features else gemv_tiles(bf=8, bk=512, bn=8, dk=512, stages=4)
    if 0 < features <= NARROW_FEATURES:
        return gemv_tiles(bn=16, dk=256)
    return gemv_tiles(bf=8, bk=512, bn=8, dk=512)


PIPELINED_HIDDEN = 6144
"""The ``H`` from which one token's GEMV streams are pipelined (``gemv_for``): Inkling's, where they won on an H100
(v47), and not B's 4096, where they lost (the register double buffer already at 0.95 of the stream ceiling there)."""


def gemv_tiles(bf: int = 4, bk: int = 1024, bn: int = 4, dk: int = 1024, warps: int = 4, pdl: bool = True,
               stages: int = 1) -> Tiles:
    """The GEMV path's tiles (``Tiles.gemv``): ``bf`` features (``2*bf`` weight rows) and
    ``bk`` of ``H`` per up step, ``bn`` rows of ``w2`` and ``dk`` of ``F`` per down step,
    the shrink as the few-token path's (16-token tile, ``H`` in 128-wide slices); ``stages``:
    both streams' depth (1: the register double buffer; more: Triton's pipelined loops, v47)."""
    return Tiles(bm=16, bf=bf, bn=bn, bk=bk, k_chunk=128, warps=warps, stages=stages, gemv=True, dk=dk, pdl=pdl)


UP_ACT_TILES = Tiles(bm=16, bf=64, bn=0, bk=128, k_chunk=0, warps=4, stages=4, up_act=True)
"""``up_act_kernel``'s tiles: 64 features (128 weight rows, a wgmma's M side twice) by 128 of ``H`` a step,
4 steps in flight; the best of the four tried at 34 of the 40 point-flushes of ``h100_act_down.json`` (v25)."""
UP_ACT_PROGRAMS = 24
"""The fewest ``up_act_kernel`` programs (``n * cdiv(F, 64)``) that run unsplit: measured ahead of the kept
three launches with 24 (A), 64 (B) and 96 (Inkling), behind with 12 (the TP-8 slice: 1.19-1.33x the kept
launches, each program streaming 1.6 MB of ``H = 6144`` rows alone), ``h100_act_down.json``; split, 1.02-1.88x
the unsplit kernel on A, B and Inkling (``h100_act_down_v26.log``)."""
UP_ACT_TOKENS, UP_ACT_LARGE_TOKENS = 32, 64
"""The most tokens ``up_acts`` sends to the unsplit ``up_act_kernel``: 32, and 64 on weights over ``SMALL_WEIGHTS``.
Measured on an H100 (``h100_act_down.json``, v25, and ``h100_act_down_v26.log``, both flushes, R 16): ahead of
the kept three launches at every A, B and Inkling point from 2 to 32 tokens in both runs (0.91-0.98x of
their time), under sglang's base there (A 0.89-0.95x, B 0.93-0.99x and 1.01x at 2 tokens in v26, Inkling
0.93-0.97x), and at 64 on B and Inkling (0.95-0.98x the base), not on A (1.00-1.06x: the 64-token tile
doubles each stage's ``x``)."""
UP_ACT_SPLIT, UP_ACT_SPLIT_TOKENS = 4, 16
UP_ACT_SPLIT_TILES = replace(UP_ACT_TILES, bf=32, ksplit=UP_ACT_SPLIT)
"""Below ``UP_ACT_PROGRAMS``: 32 features a tile, ``H`` split over 4 programs, up to 16 tokens. Measured at the
TP-8 slice (``h100_act_down_v26_tp8.json``, v26, 12 tiles of 64 features there): 96 programs, 0.94-0.97x sglang's
base and 0.96-0.97x the kept three launches at 2, 8 and 16 tokens in both flushes; at 32, 1.04-1.05x the base,
behind the kept launches (so not routed). 64 features split 8 ways were 0.91-0.93x the base at 2 and 8 tokens
but level at 16; one tile serves the three."""


def up_acts(num_tokens: int, ops: SinkOperands) -> Tiles | None:
    """The tiles of ``up_act_kernel`` for a one-slot batch of ``num_tokens`` whose slot's merge is kept, or
    ``None`` (the base forward's three launches on the copy): unsplit (``UP_ACT_TILES``) from 2 tokens to
    ``UP_ACT_TOKENS`` (``UP_ACT_LARGE_TOKENS`` on weights over ``SMALL_WEIGHTS``) where the kernel has
    ``UP_ACT_PROGRAMS`` programs or more, else split (``UP_ACT_SPLIT_TILES``) up to ``UP_ACT_SPLIT_TOKENS``."""
    n, F, H = ops.n, ops.intermediate, ops.hidden
    if num_tokens < 2:
        return None
    if n * triton.cdiv(F, UP_ACT_TILES.bf) >= UP_ACT_PROGRAMS:
        most = UP_ACT_LARGE_TOKENS if n * F * H > SMALL_WEIGHTS else UP_ACT_TOKENS
        return UP_ACT_TILES if num_tokens <= most else None
    return UP_ACT_SPLIT_TILES if num_tokens <= UP_ACT_SPLIT_TOKENS else None


def up_act_split(num_tokens: int, ops: SinkOperands, tiles: Tiles, device) -> Split | None:
    """``up_act_kernel``'s split (``Split.up``, its workspace ``[T, n*2F]`` and a counter per tile, zero; the
    down side unsplit) for tiles of ``ksplit`` programs a tile (``UP_ACT_SPLIT_TILES``), else ``None``."""
    if tiles.ksplit < 2:
        return None
    f32, i32 = dict(dtype=torch.float32, device=device), dict(dtype=torch.int32, device=device)
    n, F = ops.n, ops.intermediate
    return Split(tiles.ksplit, 1, torch.zeros(num_tokens, n * 2 * F, **f32),
                 torch.zeros(n * triton.cdiv(F, tiles.bf), **i32), torch.zeros(1, **f32), torch.zeros(1, **i32))


GATHER_TOKENS = 16
GATHER_RANK = 16
GATHER_WIDE_TOKENS, GATHER_WIDE_SLOTS = 32, 8
"""Up to ``GATHER_TOKENS`` tokens (2 or more) and ``GATHER_RANK``, a batch whose LoRA tokens use two slots or
more runs the gathered LoRA epilogues (``gathers``, ``Tiles.gather``, v28), and up to ``GATHER_WIDE_TOKENS``
where they use ``GATHER_WIDE_SLOTS`` or more: ``h100_gather_v28c.json`` (32 tokens, R 16, without PDL against the
slot loop without it) had them 0.93-0.98x at S 8 on every shape, 1.00-1.02x at S 4. ``h100_gather_v28.json`` and
``h100_gather_v28b.json`` (an H100, 8 and 16 tokens, S 1 / 4 / 8, read flush), against what was routed
before (the slot loop, with PDL where ``use_pdl`` had it): at R 16, S 4 0.76-0.97x, S 8 0.75-0.93x on
every shape (A 24.8-33.1 -> 21.3-25.0 µs; TP8 S 8 T 8 38.9 -> 31.1), S 1 within 2 % (so not routed). The
first sweep had PDL on every variant, which costs B, Inkling and TP8 up to 15 % by itself: there the
gathered epilogues were 0.98-1.64x at R 64 (each 16 ranks a step of their own) and 0.98-1.32x at 32 tokens
(32-feature tiles, 8 ranks a step), so neither is routed."""


def gathers(num_tokens: int, ops: SinkOperands, t: Tiles, slots: int) -> bool:
    """The weight-streaming launches of ``num_tokens`` whose LoRA tokens use ``slots`` slots read each
    token's own slot's factors in their epilogues (``Tiles.gather``): ``GATHER_TOKENS``, ``GATHER_RANK`` and
    ``GATHER_WIDE_TOKENS`` / ``GATHER_WIDE_SLOTS``."""
    most = GATHER_WIDE_TOKENS if slots >= GATHER_WIDE_SLOTS else GATHER_TOKENS
    return (slots >= 2 and 2 <= num_tokens <= most and 0 < ops.max_rank <= GATHER_RANK
            and not (t.cublas or t.gemv))


def few_up_programs(ops: SinkOperands) -> bool:
    """``up_act_kernel`` has fewer than ``UP_ACT_PROGRAMS`` programs unsplit on these weights (the TP-8 slice)."""
    return ops.n * triton.cdiv(ops.intermediate, UP_ACT_TILES.bf) < UP_ACT_PROGRAMS


def lora_ups(num_tokens: int, ops: SinkOperands, t: Tiles, slots: int) -> Tiles | None:
    """The up launch of ``num_tokens`` weight-streaming tokens whose LoRA tokens use ``slots`` slots as
    ``up_act_kernel`` with the LoRA epilogue (``Tiles.lora_up``, v33), on these tiles, or ``None``
    (``up_kernel``): one slot, more than ``PDL_UP_SLICE_TOKENS`` (below them ``pdl_up``, v51b) and up to
    ``UP_ACT_SPLIT_TOKENS`` tokens, where ``up_act_kernel`` runs split (``few_up_programs``: the TP-8 slice),
    with PDL. Measured on an H100
    (``h100_up_act_v33.json``, read flush, against what was routed): TP8 R 64 at 2 / 8 / 16 tokens 0.97 / 0.92 /
    0.82x (29.6 / 30.3 / 30.5 µs), R 16 0.99 / 1.01 / 0.94x. Not on A, B or Inkling, where it was level with
    or behind ``up_kernel``'s launches at every point (0.94x only at A R 64 T 16), nor with several slots (TP8 S 4
    and 8 at 8 and 32 tokens 1.16-1.34x: the epilogue's loop over the tile's slots)."""
    if (slots == 1 and PDL_UP_SLICE_TOKENS < num_tokens <= UP_ACT_SPLIT_TOKENS and few_up_programs(ops)
            and not (t.cublas or t.gemv)):
        return UP_ACT_SPLIT_TILES
    return None


def _streaming_tiles(t: Tiles, num_tokens: int, ops: SinkOperands, slots: int) -> Tiles:
    """``pick_tiles``' tiles with v28's gathered epilogues (``gathers``), v33's up launch (``lora_ups``), PDL
    (``use_pdl``, or on the shrink's edge alone, ``use_pdl_up``) and v52's down shrink in the down kernel
    (``down_shrinks``) where measured faster."""
    gather, lora_up = gathers(num_tokens, ops, t, slots), lora_ups(num_tokens, ops, t, slots)
    weight_elems = ops.n * ops.intermediate * ops.hidden
    pdl_up = use_pdl_up(num_tokens, ops, slots)  # one slot: never gathered; never with lora_up (their tokens differ)
    pdl = not pdl_up and use_pdl(num_tokens, weight_elems, slots, gather, lora_up is not None)
    down = down_shrinks(num_tokens, weight_elems, slots) and lora_up is None
    changed = gather or pdl or lora_up or pdl_up or down
    return replace(t, gather=gather, pdl=pdl, lora_up=lora_up, pdl_up=pdl_up, down_shrink=down) if changed else t


def down_shrinks(num_tokens: int, weight_elems: int, slots: int) -> bool:
    """The down kernel makes the down shrink from the ``act`` tiles it streams (``Tiles.down_shrink``, v52) for one slot
    at 2-16 tokens on A-sized weights (``n*F*H <= SMALL_WEIGHTS``); ``launch`` applies it where every token is on that
    slot, the outer is shared and the down launch unsplit. Every down program then reads the slot's whole ``a_cat``
    from L2 beside its ``w2`` rows, which pays where those bytes stay small beside the stream and costs where they do
    not: on an H100 (``h100_fold_v52.json``, then ``h100_fold_v52b.json`` on the same lease; read flush, graphs, against
    full PDL, what ``auto`` runs there) A at R 64 1.1-3.1 µs under at 8-16 tokens and level at 2-4, at R 16 1.1-1.5 under
    at 16 tokens and 0.0-0.3 at 2-12; on B and the real model (33.5 and 75 MB of ``a_cat`` reads at R 16, against A's 4.7)
    0.6-3.9 µs over at R 16 and up to 12 over at R 64; on the TP-8 slice at R 16 0.7-1.0 under in the first run, level in
    the second, so not there."""
    return slots == 1 and 2 <= num_tokens <= 16 and weight_elems <= SMALL_WEIGHTS


PDL_ONE_SLOT_WEIGHTS = 16 << 20
"""``n*F*H`` up to which one slot at 2-16 tokens chains its three launches by PDL (B's 16 M, not Inkling's 36 M): on
an H100 the launches with PDL were 0.95-0.97x those without at B R 16 and 2 / 8 / 16 tokens and 0.89-0.99x at R 64
(``h100_up_act_v33.json``; 0.96x again in ``h100_bare_v33b.json``), on the H200 0.97-0.99x at 8 tokens (v13's
``h200_pdl.json``); at 32 tokens 1.28-1.44x on both cards (32-feature tiles, twice the programs of each grid), and
at Inkling (384 up programs against B's 256) 1.10-1.15x at 2-16 tokens on the H100, 1.22-1.23x at 8 on the H200."""


def use_pdl(num_tokens: int, weight_elems: int, slots: int, gather: bool = False, lora_up: bool = False) -> bool:
    """Chain the three weight-streaming launches by programmatic dependent launch
    (``Tiles.pdl``) for a batch of ``num_tokens`` whose LoRA tokens use ``slots`` slots,
    on weights of ``n*F*H = weight_elems``.

    Measured on the H200 (``data/profiles/h200_pdl.json`` and ``h200_side_by_side.json``,
    v13): for A-sized weights (``n*F*H <= SMALL_WEIGHTS``: up and down grids of ~96
    programs each, resident side by side) it saves 3-5 µs with one slot up to 32 tokens
    and with up to 4 slots up to 8 tokens (A T=1: 24.5 -> 20.6 µs), the shrink's time,
    which the up kernel's stream now covers; with 4 slots at 32 tokens it cost 0-2 µs,
    with 8 slots at 8-32 tokens up to 12 µs, and on B, Inkling and TP8 (256-576 programs
    per grid) up to 30 µs: the waiting down programs take the multiprocessors the up
    kernel's stream needs. Off under Triton's interpreter (no grid dependency control).
    With the gathered epilogues (``gather``, v28) on A-sized weights at any slot count up to
    ``GATHER_TOKENS`` (``h100_gather_v28b.json``: 0.85-0.98x the same launches without it at S 4
    and 8, 8 and 16 tokens; on B, Inkling and TP8 0.99-1.15x, so not there). With ``up_act_kernel`` as the up
    launch (``lora_up``, v33, the TP-8 slice): always (its 96 programs leave room for the waiting down programs;
    ``h100_up_act_v33.json``: TP8 at 2-16 tokens 0.89-0.98x the same launches without it). And with one slot at
    up to 16 tokens on weights up to ``PDL_ONE_SLOT_WEIGHTS`` (v33's runs)."""
    if interpreting() or slots < 1:
        return False
    if lora_up or (slots == 1 and num_tokens <= 16 and weight_elems <= PDL_ONE_SLOT_WEIGHTS):
        return True
    if weight_elems > SMALL_WEIGHTS:
        return False
    if gather:
        return num_tokens <= GATHER_TOKENS
    return (num_tokens <= 32 and slots == 1) or (num_tokens <= 8 and slots <= 4)


PDL_UP_SLICE_TOKENS = 8
"""The most tokens for which one slot on weights of ``few_up_programs`` (the TP-8 slice) takes ``pdl_up`` on
``up_kernel`` (``use_pdl_up``) in place of v33's ``up_act_kernel`` (``lora_ups``). Measured on an H100 in two runs
(``h100_pdl_late_v51.json`` at 8 tokens, ``h100_pdl_late_v51b.json`` at 2, 8 and 16; read flush, graphs): at 2 and 8
tokens 0.8-1.7 µs under what was routed at all six point-runs (R 16 8 tokens 26.9 / 27.2 against 28.6 / 28.7 µs; R 64
28.8 / 29.1 against 30.0 / 29.9; 2 tokens 27.4 / 28.1 against 28.7 / 29.4), at 16 tokens 0.4 under at R 16 and 2.8 over
at R 64, so not there. Full PDL on ``up_kernel`` (what ``use_pdl`` would give these weights) was 0.4-2.1 µs over v33's
kernel (29.1-32.0 µs): the waiting down programs again."""


def use_pdl_up(num_tokens: int, ops: SinkOperands, slots: int) -> bool:
    """Make only the up launch the shrink's programmatic dependent (``Tiles.pdl_up``, v50b) for one slot at 2-16
    tokens on weights over ``PDL_ONE_SLOT_WEIGHTS``, and (v51b) at 2 to ``PDL_UP_SLICE_TOKENS`` on weights of
    ``few_up_programs`` (the TP-8 slice), where ``use_pdl`` would chain all three launches: the up grid
    streams ``w13`` while the shrink runs (2.7-4.9 µs of its own at 8 tokens, ``h100_kernels_v50.json``) and the
    down launch still waits for the whole up grid. ``h100_pdl_up_v50b.json`` (an H100, the real model, read flush):
    one slot at 8 tokens 1.6 / 3.1 µs under the unchained launches at R 16 / 64 (89.8 / 92.5 against 91.4 / 95.6); with
    4 or 8 slots 2-11 µs over them (the shrink's grid is ``S`` times larger), and at 32 tokens level or behind, so
    not there. 2-16 tokens share the 8-token launch's grid (one 16-token tile, 16-feature blocks). The run after
    (``h100_pdl_late_v51b.json``, another lease) had the real model the other way round, ``pdl_up`` 1.9-2.4 µs behind the
    unchained launches at 2 and 8 tokens, R 16 and 64; the side by side at the routing commit
    (``history/h100_side_by_side_v50b.json``) had those points 1.7-4.6 µs under the pair before it, and
    ``h100_pdl_late_v51.json`` had ``pdl_up`` 0.9 / 2.9 µs ahead: kept. Off under the interpreter, as ``use_pdl``."""
    if interpreting() or slots != 1 or num_tokens < 2:
        return False
    if ops.n * ops.intermediate * ops.hidden > PDL_ONE_SLOT_WEIGHTS:
        return num_tokens <= 16
    return num_tokens <= PDL_UP_SLICE_TOKENS and few_up_programs(ops)


@dataclass(frozen=True)
class Plan:
    """What one batch needs on the device: ``slots [T]`` int32 (``-1``: no LoRA),
    ``scalings [S]`` float32, ``sh [T, O*2R]`` the shrink's float32 workspace (zero
    between forwards), ``has_lora``, the tiles; ``single_slot``: the one slot every
    token uses, when the host knows it (``-1`` otherwise; the cuBLAS path then runs
    the shrinks through cuBLAS too); ``batch``: a device-resident batch whose
    metadata ``launch`` turns into ``slots`` on the device at every launch; ``grouped``:
    ``"epi"`` (``grouped_mode``: ``_launch_grouped``) with its ``offs [S]`` (``segment_offsets``), ``""`` where
    the batch takes another path; ``"merge"`` (``_launch_merged``,
    ``merge_operands``): ``merge_slots [G]`` int32, the slots that have tokens, in order, ``offs [G]``
    their runs' ends and ``runs`` the same ``(start, end)`` on the host; ``"kept"`` (``_launch_merged``
    on ``ops.kept``, ``kept_operands``): ``runs``, ``merge_rows`` the kept row of each run and ``offs``
    the runs' ends over the kept rows they span, ``run_streams``: each run's GEMMs one ``torch.mm`` on a
    stream of its own (``RUN_STREAMS``); ``act_runs``: the several-slot cuBLAS path's runs for ``expand_act_kernel``
    (``expand_runs``), ``None`` where ``up_kernel``'s epilogue takes the activation; ``down_runs``: its runs for
    ``expand_down_kernel`` (``DOWN_RUN_TOKENS``), ``None`` where ``down_kernel`` adds the down expand; ``cats``: the
    several-slot cuBLAS path's down expand as more of the down GEMM's ``K`` (``slot_cats``, ``_down_slot_cats``),
    ``None`` where the down epilogue adds it onto ``out``."""

    slots: torch.Tensor
    scalings: torch.Tensor
    sh: torch.Tensor | None
    has_lora: bool
    tiles: Tiles
    single_slot: int = -1
    single_scale: float = 1.0
    batch: SlotBatch | None = None
    split: "Split | None" = None
    offs: torch.Tensor | None = None
    grouped: str = ""
    merge_slots: torch.Tensor | None = None
    runs: tuple[tuple[int, int], ...] = ()
    merge_rows: tuple[int, ...] = ()
    run_streams: bool = False
    act_runs: "Runs | None" = None
    down_runs: "Runs | None" = None
    cats: "SlotCats | None" = None
    fast: dict = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Split:
    """Split-K of the weight-streaming path: ``up`` and ``down`` programs per tile, each
    reducing a slice of ``K``, and their float32 workspaces ``ws_up [T, n*2F]``,
    ``ws_down [T, H]`` and per-tile counters, zero between launches (the last program
    of each tile leaves them so)."""

    up: int
    down: int
    ws_up: torch.Tensor
    cnt_up: torch.Tensor
    ws_down: torch.Tensor
    cnt_down: torch.Tensor


TARGET_PROGRAMS = 3 * 132
"""Programs the weight-streaming launches aim for: ~3 per multiprocessor of an H200."""
MIN_SPLIT_K = 1024
"""No program of a split reduces fewer than this many of ``K``. The split's reduction
(atomics, a counter, a re-read) adds a chain of dependent memory trips: on the H200 it
paid only where each program streams long rows (Inkling-TP8, ``K = 6144``: 33 -> 26 µs at
one token) and cost 2-6 µs where rows are short (A, ``K = 1536``), ``h200_split_sweep.json``."""


def _splits(num_tokens: int, n: int, H: int, F: int, t: Tiles, device) -> Split | None:
    """How far to split ``K`` so the up and down launches have ~``TARGET_PROGRAMS``
    programs, each reducing at least ``MIN_SPLIT_K``; ``None`` on the cuBLAS path."""
    if t.cublas or t.gemv:
        return None
    m = triton.cdiv(num_tokens, t.bm)
    up_tiles, down_tiles = m * n * triton.cdiv(F, t.bf), m * triton.cdiv(H, t.bn)
    up = max(1, min(TARGET_PROGRAMS // up_tiles, H // MIN_SPLIT_K))
    if t.lora_up is not None:  # up_act_kernel's own tiles and split (lora_ups)
        up_tiles = n * triton.cdiv(F, t.lora_up.bf)
        up = t.lora_up.ksplit
    down = max(1, min(TARGET_PROGRAMS // down_tiles, n * F // MIN_SPLIT_K))
    f32 = dict(dtype=torch.float32, device=device)
    i32 = dict(dtype=torch.int32, device=device)
    return Split(up, down, torch.zeros(num_tokens, n * 2 * F, **f32) if up > 1 else torch.zeros(1, **f32),
                 torch.zeros(up_tiles, **i32), torch.zeros(num_tokens, H, **f32) if down > 1 else torch.zeros(1, **f32),
                 torch.zeros(down_tiles, **i32))


def _resident(batch: SlotBatch, device: torch.device) -> bool:
    """Made by ``SlotBatch.to(device)``: its tensors live there, its token count on the host."""
    device, have = torch.device(device), batch.seg_indptr.device
    return batch.tokens is not None and have.type == device.type and device.index in (None, have.index)


def plan(ops: SinkOperands, num_tokens: int, batch: SlotBatch | None, device: torch.device,
         tiles: Tiles | None = None) -> Plan:
    """The device-side description of ``batch`` for ``launch``.

    A host batch is resolved here (each token's effective slot, copied once: host
    work, not capturable). A batch already on ``device`` (``SlotBatch.to``) is not
    read on the host at all: ``launch`` resolves its slots with one small kernel,
    so the plan can be made, and the forward captured, inside ``torch.cuda.graph``."""
    weight_elems = ops.n * ops.intermediate * ops.hidden
    explicit, tiles = tiles is not None, tiles or pick_tiles(num_tokens, weight_elems, ops.hidden)
    T = max(num_tokens, 1)

    no_lora = batch is None or ops.buffers is None or (not _resident(batch, device) and not batch.active_slots())
    if no_lora:
        empty = torch.full((T,), -1, dtype=torch.int32, device=device)
        return Plan(empty, torch.ones(1, device=device), None, False, tiles,
                    split=_splits(T, ops.n, ops.hidden, ops.intermediate, tiles, device))
    ga = ops.buffers[0]
    sh = torch.zeros(T, ga.shape[1] * ga.shape[2], dtype=torch.float32, device=device)
    resident = _resident(batch, device)  # its slots are not read on the host: the pool's count bounds them
    if not resident:
        slots = batch.token_slots().clone()
        lora = slots >= 0
        slots[lora] = torch.where(batch.lora_ranks[slots[lora]] == 0, -1, slots[lora])
        active = batch.active_slots()
    if not explicit:
        tiles = _streaming_tiles(tiles, num_tokens, ops, batch.num_slots if resident else len(active))
    split = _splits(T, ops.n, ops.hidden, ops.intermediate, tiles, device)  # after the tiles' last change
    if resident:
        return Plan(torch.empty(T, dtype=torch.int32, device=device), batch.scalings.to(dtype=torch.float32),
                    sh, True, tiles, batch=batch, split=split)
    single = active[0] if len(active) == 1 and bool((slots == active[0]).all()) else -1
    if single >= 0 and not explicit and ops.shared_outer and chain_tokens(num_tokens, weight_elems):
        tiles, split = ONE_SLOT_TILES, None  # _launch_single (launch)
    scalings = batch.scalings.to(device=device, dtype=torch.float32)
    routed, extra = not explicit and tiles.cublas, {}
    rows = None if explicit or ops.kept is None else ops.kept.rows(active, batch.scalings[active].tolist())
    if rows is not None and (single >= 0 or (keeps(num_tokens, ga.shape[2] // 2, len(active))
                                             and segment_offsets(slots, ga.shape[0]) is not None)):
        extra = kept_operands(slots, rows, device)
        if num_tokens == 1:  # the base's GEMV stream on the slot's copies, at any weights' size (v23)
            tiles, split = gemv_for(ops.hidden), None
        elif single >= 0 and (up := up_acts(num_tokens, ops)) is not None:  # two launches on the copy (v25, v26)
            tiles, split = up, up_act_split(num_tokens, ops, up, device)
        elif not tiles.cublas:  # fewer tokens than the cuBLAS path's: its activation tiles
            tiles, split = ONE_SLOT_TILES, None
    elif single >= 0:
        if routed and merges(num_tokens, ops, 1):
            extra = merge_operands(slots, device)
        elif routed and swaps(num_tokens, ops, device) and not folds(num_tokens, weight_elems):
            extra = {"offs": torch.tensor([num_tokens], dtype=torch.int32, device=device)}
    elif routed and (mode := grouped_mode(num_tokens, ops, device, len(active))):
        offs = segment_offsets(slots, ga.shape[0])  # None: not every token in its slot's run, in order
        if offs is not None:
            extra = merge_operands(slots, device) if mode == "merge" else {"offs": offs.to(device), "grouped": mode}
    if routed and single < 0 and extra.get("grouped", "epi") == "epi":  # v36c's runs, v37's cats or v38's runs
        extra["act_runs"] = expand_runs(slots, device)
        extra["cats"] = slot_cat_operands(ops, num_tokens, slots, device)
        if extra["cats"] is None and ops.shared_outer:
            extra["down_runs"] = expand_runs(slots, device, DOWN_RUN_TOKENS)
    return Plan(slots.to(device=device, dtype=torch.int32), scalings, sh, True, tiles, single,
                float(batch.scalings[single]) if single >= 0 else 1.0, split=split, **extra)


def segment_offsets(slots: torch.Tensor, num_slots: int) -> torch.Tensor | None:
    """``offs [S]`` for ``torch._grouped_mm``: how many tokens have slot ``<= s``, where every
    token of ``slots [T]`` (effective, host) has a slot and they never decrease (each slot's tokens
    one contiguous run, in slot order, as sglang's batches of one adapter per request are when
    sorted); ``None`` otherwise (a base-only or rank-0 token, or slots out of order)."""
    if slots.numel() == 0 or bool((slots < 0).any()) or bool((slots[1:] < slots[:-1]).any()):
        return None
    return torch.bincount(slots.long(), minlength=num_slots).cumsum(0).to(torch.int32)


def merges(num_tokens: int, ops: SinkOperands, used: int) -> bool:
    """A batch of ``num_tokens`` in runs of ``used`` slots (shared outer, the cuBLAS path) takes
    ``_launch_merged``: where the tokens reach ``MERGE_RATIO * used * n*F*H / (n*F + H)``. Merging
    moves ``2 * used * n*3F*H`` weight elements whatever the tokens; the per-token LoRA it replaces
    (shrinks, expands, the ``y`` and ``out`` round trips) grows with ``T * (n*F + H)``."""
    nf, H = ops.n * ops.intermediate, ops.hidden
    return ops.shared_outer and used > 0 and num_tokens >= MERGE_RATIO * used * nf * H / (nf + H)


MERGE_RATIO = 2.0
"""``merges``' constant, from ``history/h200_merge_v21c.json`` (v21: one slot at 512-8192 tokens, four and eight at
2048-8192, R 16 / 64, every shape, both flushes): the merged path was ahead of the kit's at every
point the rule routes but one (B R64 S1 T4096, level at 1.007-1.009x) and behind or level at every
point it does not route but A S1 T512 / T1024 and TP8 R16 S1 T1024 (0.91-1.0x: the rule is the
cautious side there). One slot: A from 1536 tokens, TP8 from 1366, B from 4096, Inkling from 6144;
four slots: A from 6144, TP8 from 5462 (on the measured grid: A and TP8 from 2048, B 4096, Inkling
8192; four slots A and TP8 at 8192)."""


def grouped_mode(num_tokens: int, ops: SinkOperands, device, used: int) -> str:
    """How a multi-slot batch of ``num_tokens`` whose tokens run in slot order (``segment_offsets``),
    ``used`` slots with tokens, takes ``_launch_grouped`` or ``_launch_merged``: ``"merge"`` where
    ``merges`` (at any rank; ``H`` and ``n*2F`` multiples of 8 for the merged grouped GEMM's rows)
    and not ``slot_cats`` (v37: ahead of the merge where it routes), else ``"epi"``, or ``""`` (the
    multi-slot path with its Triton shrinks). Grouped where the pool's rank is at least ``GROUPED_MIN_RANK`` from
    ``GROUPED_RANK_TOKENS`` tokens, at any rank from ``GROUPED_TOKENS``; shared outer, ranks a multiple of 8 (16-byte rows for
    the grouped GEMM), on CUDA in bfloat16 only (torch's CUTLASS grouped GEMM; other dtypes fall back
    to a loop that reads the offsets on the host; on the CPU, Triton's interpreter, any dtype).
    Measured (``h200_grouped.json``, v20; the grid below the constants). v20's ``"fold"`` (the gate/up
    expand written first, the base GEMM adding onto it) left in v39: since v36c's runs and v38's down runs,
    ``"epi"`` was 0.95x it on B at rank 64 and level on Inkling, the two shapes it routed on
    (``h100_multi_v38.json``, ``h100_multi_v39_epi.json``)."""
    R, nf = ops.max_rank, ops.n * ops.intermediate
    if not ops.shared_outer or not _grouped_gemm_takes(ops, device):
        return ""
    merged = merges(num_tokens, ops, used) and ops.hidden % 8 == 0 and nf % 4 == 0  # the merged GEMM's 16-byte rows
    if merged and not slot_cats(num_tokens, ops, used):
        return "merge"
    if R % 8:
        return ""
    first = GROUPED_RANK_TOKENS if R >= GROUPED_MIN_RANK else GROUPED_TOKENS
    return "epi" if num_tokens >= first else ""


def _grouped_gemm_takes(ops: SinkOperands, device) -> bool:
    """Whether torch's grouped GEMM (``torch._grouped_mm``, CUTLASS) runs ``ops``' dtype on ``device`` as one launch:
    bfloat16 on CUDA (other dtypes fall back to a loop that reads the offsets on the host), any dtype on the CPU
    (Triton's interpreter)."""
    return torch.device(device).type != "cuda" or ops.dtype == torch.bfloat16


_PLANS: dict[tuple, tuple[weakref.ref, Plan]] = {}
_PLAN_CACHE_SIZE = 64


def cached_plan(ops: SinkOperands, num_tokens: int, batch: SlotBatch | None, device: torch.device) -> Plan:
    """``plan`` made once per (batch object, token count, pool shape, device, kept merges) and reused:
    a decode loop that passes the same batch pays no host work for it again."""
    if batch is None:
        return plan(ops, num_tokens, None, device)
    shape = None if ops.buffers is None else ops.buffers[0].shape
    key = (id(batch), num_tokens, shape, device, ops.n, ops.intermediate, ops.hidden, ops.dtype,
           None if ops.kept is None else ops.kept.version)
    hit = _PLANS.get(key)
    if hit is not None and hit[0]() is batch:
        return hit[1]
    p = plan(ops, num_tokens, batch, device)
    if len(_PLANS) >= _PLAN_CACHE_SIZE:
        _PLANS.pop(next(iter(_PLANS)))
    _PLANS[key] = (weakref.ref(batch), p)
    return p


@dataclass(frozen=True)
class Lora:
    """The LoRA operands of one forward's launches (``kernels``' docstrings name them):
    ``sh [T, O*2R]`` the gate/up shrink and ``mid [T, O*R]`` the down shrink (float32),
    ``gb``/``da``/``db`` the pool's gate-up B, down A and down B, the rank ``R``, the
    outer count ``O``, ``o_step`` (0: shared outer, 1: per expert), ``br``, the rank
    tile, and ``down_shrink``: the down kernel makes the down shrink itself (``Tiles.down_shrink`` where it applies).
    ``Lora.none(x)`` for a base-only launch: ``HAS_LORA=False`` drops every use
    of its tensors (``x`` only fills the arguments)."""

    on: bool
    sh: torch.Tensor
    gb: torch.Tensor
    da: torch.Tensor
    db: torch.Tensor
    mid: torch.Tensor
    R: int = 0
    O: int = 0
    o_step: int = 0
    br: int = 16
    down_shrink: bool = False

    @staticmethod
    def none(x: torch.Tensor) -> "Lora":
        return Lora(False, x, x, x, x, x)


def _launch_key(ops: SinkOperands, x: torch.Tensor, gammas: torch.Tensor, out: torch.Tensor) -> tuple:
    """What may differ between calls on one plan, for the repeat-launch cache (``launch_cache``): the
    inputs' dtypes and 16-byte alignment (Triton specializes on them) and the operands' sizes."""
    return (x.dtype, gammas.dtype, x.data_ptr() % 16 == 0, gammas.data_ptr() % 16 == 0, out.data_ptr() % 16 == 0,
            ops.n, ops.hidden, ops.intermediate, ops.rank, ops.slots, ops.shared_outer, ops.interleaved)


def launch(ops: SinkOperands, x: torch.Tensor, gammas: torch.Tensor, p: Plan,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Enqueue the forward for ``x [T, H]``, ``gammas [T, n]`` -> ``out [T, H]`` (x's dtype)."""
    T, H = x.shape
    n, F = ops.n, ops.intermediate
    out = torch.empty_like(x) if out is None else out
    if T == 0:
        return out
    x, gammas = x.contiguous(), gammas.contiguous()
    t = p.tiles
    single = p.single_slot >= 0 and ops.shared_outer
    if p.grouped in ("merge", "kept"):
        return _launch_merged(ops, x, gammas, p, out)
    if p.grouped:
        return _launch_grouped(ops, x, gammas, p, out)
    if single and t.cublas:
        w2_cat = ops.w2_cat if cats(T, ops) else None
        if folds(T, n * F * H):
            return _launch_folded(ops, x, gammas, p, out, w2_cat)
        return _launch_single(ops, x, gammas, p, out, w2_cat)
    key = _launch_key(ops, x, gammas, out)
    act_cat, act = _act_slot_cat(ops, x, p.cats)
    pdl = _shrink_edge(t)
    if p.batch is not None:  # a device-resident batch: its slots, from its metadata, now
        b = p.batch
        _run(kernels.slots_kernel, (b.num_segments,),
             (b.seg_indptr, b.weight_indices, b.lora_ranks, b.permutation if b.permutation is not None else p.slots,
              p.slots), fast=(p.fast, ("slots", key)), HAS_PERM=b.permutation is not None, BLOCK=128)
    # The cuBLAS path: each shrink beside the cuBLAS GEMM that reads the same input (_Beside;
    # h200_multi_beside.json: 0.89-1.03x the same launches in one stream, faster at 53/60 points).
    side = _Beside(x, t.cublas and p.has_lora)
    if p.has_lora:
        ga, gb, da, db = (b.contiguous() for b in ops.buffers)
        S, O, two_r, _ = ga.shape
        R = two_r // 2
        br = max(16, triton.next_power_of_2(R))
        sh, mid = p.sh, torch.empty(T, O * R, dtype=torch.float32, device=x.device)
        in_down = (t.down_shrink and p.single_slot >= 0 and O == 1 and not (t.cublas or t.gemv or t.gather)
                   and (p.split is None or p.split.down == 1))  # the gathered epilogues read mid themselves
        with side:
            _shrink(x, p, ga, sh, mid, k=H, ldx=H, x_o_off=0, rank=R, outer=O, a_slot=O * 2 * R,
                    a_outer=2 * R, halves=2, br=br, zero_mid=not in_down, key=("shrink_up", key), pdl=pdl)
        lora = Lora(True, sh, gb, da, db, mid, R, O, 0 if O == 1 else 1, br, in_down)
    else:
        lora = Lora.none(x)
    if t.gemv:  # one token (pick_tiles)
        _gemv(ops, x, gammas, act, out, p, lora, key)
        return out
    y = torch.mm(x, ops.w13_lin.T) if t.cublas else x
    side.join()
    if t.lora_up is not None:  # v33: up_act_kernel with the LoRA epilogue
        _up_act(ops, x, gammas, ops.w13, act, p, key, t.lora_up, lora)
    elif p.act_runs is not None and lora.on:
        _expand_act(ops, y, gammas, act, lora.sh, lora.gb, runs=p.act_runs, scalings=p.scalings)
    else:
        _up(ops, x, y, gammas, act, p, lora, key)
    mid = lora.mid
    if t.cublas:
        if not lora.on:
            return torch.mm(act, ops.w2_lin, out=out)
        R, O, br = lora.R, lora.O, lora.br
        if p.cats is not None:  # v37: the down shrink before the down GEMM, whose K its product joins
            _shrink(act, p, ops.a_cat, mid, mid, k=n * F, ldx=act.stride(0), x_o_off=0, rank=R, outer=1, a_slot=R,
                    a_outer=0, halves=1, br=br, zero_mid=False, key=("shrink_down", key))
            return _down_slot_cats(ops, act_cat, mid, p, out, zero_sh=True)
        with side:
            if O == 1:  # a_cat [S, R, n*F]: one shrink over all experts' features is the expert sum
                _shrink(act, p, ops.a_cat, mid, mid, k=n * F, ldx=n * F, x_o_off=0, rank=R, outer=1, a_slot=R,
                        a_outer=0, halves=1, br=br, zero_mid=False, key=("shrink_down", key))
            else:       # down_A [S, n, R, F]: expert e reads its own F columns of act
                _shrink(act, p, lora.da, mid, mid, k=F, ldx=n * F, x_o_off=F, rank=R, outer=O, a_slot=n * R,
                        a_outer=R, halves=1, br=br, zero_mid=False, key=("shrink_down", key))
        torch.mm(act, ops.w2_lin, out=out)
        side.join()
    _down_expand(ops, act, out, p, lora, mid, key, zero_sh=True)  # on the cuBLAS path: adds the LoRA term onto out
    return out


def _shrink_edge(t: Tiles) -> bool:
    """The up launch is the shrink's programmatic dependent (``Tiles.pdl`` or ``pdl_up``, the weight-streaming
    launches; never under the interpreter, which has no grid dependency control)."""
    return (t.pdl or t.pdl_up) and not t.cublas and not interpreting()


def _pdl(on: bool) -> dict:
    """The launch option of a programmatic dependent launch, where wanted (the
    interpreter's launcher takes no such option, and never gets it)."""
    return {"launch_pdl": True} if on else {}


def _gather(t: Tiles) -> int:
    """The gathered epilogues' ranks per step (0: the loop over the tile's slots): 16 on 16-feature
    tiles, 8 on wider ones, where 16 spilled at R 64 (sm_90 compile, 255 registers)."""
    return 0 if not t.gather else 16 if t.bf <= 16 else 8


def _up(ops: SinkOperands, x, y, gammas, act, p: Plan, lora: Lora, key: tuple | None = None) -> None:
    """One ``up_kernel`` launch (its docstring names the operands). With ``pdl`` it is
    the shrink's programmatic dependent only when a shrink launch precedes it (else the
    kernel before it may still be writing ``x``)."""
    T, H = x.shape
    n, F, t = ops.n, ops.intermediate, p.tiles
    row_step, up_offset = (2, 1) if ops.interleaved else (1, F)
    sp = p.split
    split, ws, cnt = (sp.up, sp.ws_up, sp.cnt_up) if sp is not None else (1, x, x)
    pdl = _shrink_edge(t)
    _run(kernels.up_kernel, (triton.cdiv(T, t.bm) * n * triton.cdiv(F, t.bf) * split,),
         (x, ops.w13, y, gammas, act, p.slots, p.scalings, lora.sh, lora.gb, lora.da, lora.mid, ws, cnt,
          T, H, F, lora.R, lora.O, n, lora.o_step, row_step, up_offset, act.stride(0)),
         fast=None if key is None else (p.fast, ("up", key, act.stride(0))),  # the stride specializes too
         Y_IN=t.cublas, HAS_LORA=lora.on, BM=t.bm, BF=t.bf, BK=t.bk, BR=lora.br, GROUP_M=t.group_m,
         INTERLEAVED=ops.interleaved, SPLIT=split, PDL=pdl, GATHER=_gather(t), MID=not lora.down_shrink,
         num_warps=t.warps, num_stages=t.stages, **_pdl(pdl and lora.on))


def _down(ops: SinkOperands, act, out, p: Plan, lora: Lora, mid, key: tuple) -> None:
    """One ``down_kernel`` launch (its docstring names the operands); ``mid`` is the
    down shrink, ``lora.mid`` or the cuBLAS path's own."""
    T, H = out.shape
    t, sp = p.tiles, p.split
    split, ws, cnt = (sp.down, sp.ws_down, sp.cnt_down) if sp is not None else (1, out, out)
    grid = triton.cdiv(T, t.bm) * triton.cdiv(H, t.bn) * split
    pdl = t.pdl and not t.cublas and not interpreting()
    # sh: the plan's workspace, which the down kernel re-zeroes (a cuBLAS shrink's output is not it)
    _run(kernels.down_kernel, (grid,),
         (act, ops.w2, out, p.slots, p.scalings, mid, lora.db, p.sh if lora.on else lora.sh, ws, cnt,
          ops.a_cat if lora.down_shrink else lora.da, T, H, ops.intermediate, lora.R, lora.O, ops.n),
         fast=(p.fast, ("down", key)),
         BASE=not t.cublas, HAS_LORA=lora.on, BM=t.bm, BN=t.bn, BK=t.bk, BR=lora.br, GROUP_M=t.group_m,
         SPLIT=split, PDL=pdl, GATHER=_gather(t), SHRINK=lora.down_shrink, num_warps=t.warps, num_stages=t.stages,
         **_pdl(pdl))


def _gemv(ops: SinkOperands, x, gammas, act, out, p: Plan, lora: Lora, key: tuple,
          weights: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """One token: ``gemv_up_kernel`` then ``gemv_down_kernel`` (their docstrings name the
    operands), each a programmatic dependent of the launch before it where ``pdl``; on
    ``weights = (w13 [n, 2F, H], w2 [n, H, F])`` (a kept slot's copies, ``w2`` at any row strides)
    in place of the base weights."""
    H, (n, F, t) = x.shape[1], (ops.n, ops.intermediate, p.tiles)
    w13, w2 = weights or (ops.w13, ops.w2)
    row_step, up_offset = (2, 1) if ops.interleaved else (1, F)
    pdl = t.pdl and not interpreting()
    _run(kernels.gemv_up_kernel, (n * triton.cdiv(F, t.bf),),
         (x, w13, gammas, act, p.slots, p.scalings, lora.sh, lora.gb, lora.da, lora.mid,
          H, F, lora.R, lora.O, n, lora.o_step, row_step, up_offset),
         fast=(p.fast, ("gemv_up", key)), HAS_LORA=lora.on, BF=t.bf, BK=t.bk, BR=lora.br, PDL=pdl,
         STAGES=t.stages, num_warps=t.warps, num_stages=1, **_pdl(pdl and lora.on))
    _run(kernels.gemv_down_kernel, (triton.cdiv(H, t.bn),),
         (act, w2, out, p.slots, p.scalings, lora.mid, lora.db, p.sh if lora.on else lora.sh, H, F, lora.R, lora.O, n,
          w2.stride(0), w2.stride(1)),
         fast=(p.fast, ("gemv_down", key)), HAS_LORA=lora.on, BH=t.bn, BK=t.dk, BR=lora.br, PDL=pdl,
         STAGES=t.stages, num_warps=t.warps, num_stages=1, **_pdl(pdl))


def _up_act(ops: SinkOperands, x, gammas, w13: torch.Tensor, act, p: Plan, key: tuple, t: Tiles,
            lora: Lora | None = None) -> None:
    """One ``up_act_kernel`` launch (its docstring names the operands) on tiles ``t``, split as ``p.split``
    says: on a kept slot's ``w13_s [n*2F, H]``, or (``lora``, v33) on the base ``w13`` with the pool's LoRA,
    the shrink's programmatic dependent where ``p.tiles.pdl``."""
    T, H = x.shape
    n, F = ops.n, ops.intermediate
    row_step, up_offset = (2, 1) if ops.interleaved else (1, F)
    split, ws, cnt = (p.split.up, p.split.ws_up, p.split.cnt_up) if p.split is not None else (1, x, x)
    lora = lora or Lora.none(x)
    pdl = p.tiles.pdl and not interpreting()
    _run(kernels.up_act_kernel, (n * triton.cdiv(F, t.bf) * split,),
         (x, w13, gammas, act, ws, cnt, T, H, F, n, row_step, up_offset,
          p.slots, p.scalings, lora.sh, lora.gb, lora.da, lora.mid, lora.R, lora.O, lora.o_step),
         fast=(p.fast, ("up_act", key)), BT=max(t.bm, triton.next_power_of_2(T)), BF=t.bf, BK=t.bk,
         STAGES=t.stages, SPLIT=split, HAS_LORA=lora.on, BR=lora.br, PDL=pdl, num_warps=t.warps,
         num_stages=t.stages, **_pdl(pdl and lora.on))


_SIDE_STREAMS: dict[tuple[int, int], "torch.cuda.Stream"] = {}


def _side_stream(device: torch.device, i: int = 0) -> "torch.cuda.Stream":
    """Side stream ``i`` of ``device``, made once and reused (a stream per call would cost its creation
    at every forward)."""
    key = (device.index if device.index is not None else torch.cuda.current_device(), i)
    stream = _SIDE_STREAMS.get(key)
    if stream is None:
        stream = _SIDE_STREAMS[key] = torch.cuda.Stream(device)
    return stream


class _Beside:
    """Work enqueued inside ``with beside:`` runs on a side stream of ``x``'s device that
    first waits for the current stream; ``join()`` makes the current stream wait for it. A
    CUDA graph captures the pair as two branches that run at once (sglang 0.5.23 does this for
    its gate/up shrink up to 32 tokens, ``srt/lora/trtllm_lora_temp/inkling_dense.py:
    forward_with_lora``). On the CPU (Triton's interpreter), or ``on=False``, both are no-ops. Tensors the side
    work writes are allocated before it, on the current stream, which joins before it frees them."""

    def __init__(self, x: torch.Tensor, on: bool = True) -> None:
        self.main = torch.cuda.current_stream(x.device) if on and x.is_cuda else None
        if self.main is not None:
            self.side = _side_stream(x.device)

    def __enter__(self) -> None:
        if self.main is not None:
            self.side.wait_stream(self.main)
            self._ctx = torch.cuda.stream(self.side)
            self._ctx.__enter__()

    def __exit__(self, *exc) -> None:
        if self.main is not None:
            self._ctx.__exit__(*exc)

    def join(self) -> None:
        if self.main is not None:
            self.main.wait_stream(self.side)


def _launch_single(ops: SinkOperands, x, gammas, p: Plan, out: torch.Tensor,
                   w2_cat: torch.Tensor | None = None) -> torch.Tensor:
    """Every token on one slot ``s``, the cuBLAS path, shared outer: each shrink a cuBLAS GEMM
    on a side stream beside the base GEMM that reads the same input (``_Beside``), so the chain
    is four steps deep: ``sh = x A_s^T`` beside ``y = x w13_lin^T``; the expand ``scale_s * sh W1Δ_s^T``
    and the activation (``_expand_act`` on ``expand_tiles``); ``mid = act a_cat_s^T`` beside
    ``out = act w2_lin``; ``out += scale_s * mid B_s^T`` (``addmm``). Where ``chain_tokens``:
    ``h200_one_slot.json`` measured it 0.80-0.99x sglang's one-slot chain at 32-2048 tokens (both
    flushes), where the kit's v15 paths were 0.84-1.05x (KERNEL_NOTES.md v17). ``w2_cat``: the
    down side as ``_down_cat`` (v27), its ``B_s^T`` copied beside the up GEMM. With ``p.offs`` (``offs [1]``,
    ``swaps``: v56b) the pair the other way round, as ``_launch_grouped`` has it: the up GEMM enqueued first, on
    the side stream, and the shrink after it on this one, a grouped GEMM of one group."""
    s, scale = p.single_slot, p.single_scale
    ga, _, _, db = ops.buffers
    T, R = x.shape[0], ga.shape[2] // 2
    side = _Beside(x)
    act_cat = _act_cat(ops, x, w2_cat)                 # allocated on this stream: it is used on it
    if p.offs is None:
        sh = torch.empty(T, 2 * R, dtype=x.dtype, device=x.device)
        with side:
            torch.mm(x, ga[s, 0].T, out=sh)            # [T, 2R]
            _cat_rows(ops, s, w2_cat)
        y = torch.mm(x, ops.w13_lin.T)                 # [T, n*2F], rows as in w13_lin
    else:  # v56b: the up GEMM first, on the side stream; the shrink a one-group grouped GEMM after it
        y = torch.empty(T, ops.w13_lin.shape[0], dtype=x.dtype, device=x.device)
        with side:
            torch.mm(x, ops.w13_lin.T, out=y)
        sh = torch._grouped_mm(x, ga[s:s + 1, 0].transpose(1, 2), offs=p.offs)      # [T, 2R]
        _cat_rows(ops, s, w2_cat)
    side.join()
    act = act_cat[:, :ops.n * ops.intermediate]
    _expand_act(ops, y, gammas, act, sh, ops.buffers[1].contiguous(), slot=s, scale=scale)
    if w2_cat is not None:
        return _down_cat(ops, act_cat, s, scale, w2_cat, out)
    mid = torch.empty(T, R, dtype=x.dtype, device=x.device)
    with side:
        torch.mm(act, ops.a_cat[s].T, out=mid)         # [T, R]
    torch.mm(act, ops.w2_lin, out=out)
    side.join()
    out.addmm_(mid, db[s, 0].T, alpha=scale)
    return out


def _launch_folded(ops: SinkOperands, x, gammas, p: Plan, out: torch.Tensor,
                   w2_cat: torch.Tensor | None = None) -> torch.Tensor:
    """Every token on one slot ``s``, many tokens (``folds``), shared outer: the LoRA folded into
    cuBLAS calls around the base GEMMs, each product written once: ``y = (x A_s^T) W1Δ_s^T``
    then cuBLAS adds ``x w13_lin^T`` onto it (``beta = 1``: read in the GEMM's epilogue,
    nearly free while the GEMM is compute-bound), the activation kernel, and the same
    for the down side (``out = (act a_cat_s^T) B_s^T``, then ``+= act w2_lin``), or, with
    ``w2_cat``, ``_down_cat`` (v27)."""
    s, scale = p.single_slot, p.single_scale
    ga, _, _, db = ops.buffers
    act_cat = _act_cat(ops, x, w2_cat)
    _cat_rows(ops, s, w2_cat)
    sh = torch.mm(x, ga[s, 0].T)                      # [T, 2R]
    if scale != 1.0:
        sh.mul_(scale)
    y = torch.mm(sh, ops.w1_delta[s].T)               # [T, n*2F], rows as in w13_lin
    y.addmm_(x, ops.w13_lin.T)
    act = act_cat[:, :ops.n * ops.intermediate]
    _up(ops, x, y, gammas, act, p, Lora.none(x))
    if w2_cat is not None:
        return _down_cat(ops, act_cat, s, scale, w2_cat, out)
    mid = torch.mm(act, ops.a_cat[s].T)               # [T, R]
    if scale != 1.0:
        mid.mul_(scale)
    torch.mm(mid, db[s, 0].T, out=out)
    out.addmm_(act, ops.w2_lin)
    return out


def _walk_grid(cols: int, t: Tiles, rows: int = 0, runs: "Runs | None" = None) -> tuple[int, ...]:
    """The grid of a kernel that walks row tiles of ``t.bm``: ``(cols, P)``, or over ``runs`` ``(cols, G, P)``, ``P``
    programs a column block (and run) sharing the ``rows`` (the longest run's), ~``TARGET_PROGRAMS`` in all."""
    G = 1 if runs is None else runs.slots.numel()
    tiles = triton.cdiv(rows if runs is None else runs.longest, t.bm)
    walkers = max(1, min(tiles, triton.cdiv(TARGET_PROGRAMS, cols * G)))
    return (cols, walkers) if runs is None else (cols, G, walkers)


def _workspace(p: Plan, mid: torch.Tensor, zero_sh: bool) -> tuple[torch.Tensor, int]:
    """The ``sh`` a down-side kernel re-zeroes (``p.sh`` where ``zero_sh``; else ``mid``, never written) and its
    column block."""
    sh = p.sh if zero_sh else mid
    return sh, max(16, triton.next_power_of_2(sh.shape[1]))


def _expand_act(ops: SinkOperands, y: torch.Tensor, gammas: torch.Tensor, act: torch.Tensor, sh: torch.Tensor,
                gb: torch.Tensor, t: Tiles | None = None, slot: int = 0, scale: float = 1.0, runs: "Runs | None" = None,
                scalings: torch.Tensor | None = None) -> None:
    """One ``expand_act_kernel`` launch (its docstring names the operands): ``y [T, n*2F]``, ``sh [T, O*2R]`` and
    ``gb``, the pool's gate-up B (contiguous), into ``act [T, n*F]`` (any row stride), every token on ``slot`` at
    ``scale``, or (``runs``) each run on its own slot at ``scalings[s]``; ``t.bm`` tokens by ``t.bf`` features a tile,
    ``t.warps``, ``t.stages`` row tiles in flight, ~``TARGET_PROGRAMS`` programs (``t`` as routed, ``expand_tiles``,
    unless given)."""
    t = t if t is not None else expand_tiles(ops, runs is not None)
    T, (n, F) = y.shape[0], (ops.n, ops.intermediate)
    O = ops.buffers[0].shape[1]
    R = sh.shape[1] // (2 * O)
    grid = _walk_grid(n * triton.cdiv(F, t.bf), t, T, runs)
    tables = (y, y, y) if runs is None else (runs.slots, runs.ends, scalings)
    _run(kernels.expand_act_kernel, grid,
         (y, gammas, act, sh, gb, T, F, R, O, n, 0 if O == 1 else 1, act.stride(0), slot, float(scale),
          *tables),
         BM=t.bm, BF=t.bf, BR=max(16, triton.next_power_of_2(R)), INTERLEAVED=ops.interleaved, STAGES=t.stages,
         RUNS=runs is not None, num_warps=t.warps)


def _down_expand(ops: SinkOperands, act: torch.Tensor, out: torch.Tensor, p: Plan, lora: "Lora", mid: torch.Tensor,
                 key: tuple, zero_sh: bool = False) -> None:
    """The cuBLAS path's down expand onto ``out``: ``expand_down_kernel`` over ``p.down_runs`` (v38; ``mid [T, R]``,
    shared outer; ``zero_sh``: it also re-zeroes ``p.sh``), else ``_down``."""
    runs = p.down_runs
    if runs is None:
        return _down(ops, act, out, p, lora, mid, key)
    H, R, t = out.shape[1], lora.R, ONE_SLOT_TILES
    sh, bsh = _workspace(p, mid, zero_sh)
    _run(kernels.expand_down_kernel, _walk_grid(triton.cdiv(H, t.bn), t, runs=runs),
         (out, mid, lora.db, sh, runs.slots, runs.ends, p.scalings, H, R, sh.shape[1]),
         fast=(p.fast, ("down_runs", key, zero_sh, mid.dtype)), BM=t.bm, BN=t.bn,
         BR=max(16, triton.next_power_of_2(R)), BSH=bsh, STAGES=t.stages, ZERO_SH=zero_sh, num_warps=t.warps)


@dataclass(frozen=True)
class Runs:
    """A batch's tokens as runs of one slot each (``_runs``), on the device for ``expand_act_kernel`` and
    ``expand_down_kernel``: ``slots [G]``
    int32 (``-1``: no LoRA) and ``ends [G]`` int32, and the longest run's tokens."""

    slots: torch.Tensor
    ends: torch.Tensor
    longest: int


EXPAND_RUN_TOKENS = 64
"""The several-slot cuBLAS path (``launch``, ``_launch_grouped``'s ``"epi"``) takes ``expand_act_kernel`` over the
batch's runs where they average at least this many tokens (``expand_runs``; 0: never), else ``up_kernel``'s epilogue.
``h100_multi_v36c.json`` (S 4 / 8, R 16 / 64, 128-8192 tokens in slot order, every shape, both flushes): 0.94-0.98x
the epilogue at 2048 and 8192 tokens on B and Inkling where the path runs, level at 512 (0.97-1.02x) and on the
TP-8 slice (0.98-1.02x), and level where the batch merges or folds."""


DOWN_RUN_TOKENS = 256
"""The several-slot cuBLAS path's down expand (shared outer, no ``slot_cats``) takes ``expand_down_kernel`` over the
batch's runs where they average at least this many tokens (0: never), else ``down_kernel``'s epilogue (v38).
``h100_multi_v38.json`` (an H100; S 4 / 8, R 16 / 64, 2048 and 8192 tokens in slot order, runs of 256-2048 tokens, on
B, Inkling and the TP-8 slice, both flushes): 0.93-0.99x ``down_kernel`` at all 14 points it ran (TP8 R 64 0.93-0.95x;
in ``_launch_grouped`` and on the Triton shrinks' path); at 512 tokens (runs of 64-128) and on A at 512-8192, forced
on every run, level with the routed plan (0.98-1.02x, ``h100_multi_v38b_*.json``)."""


def expand_runs(slots: torch.Tensor, device, tokens: int | None = None) -> Runs | None:
    """``Runs`` of effective ``slots [T]`` (host) where they average ``tokens`` (``EXPAND_RUN_TOKENS``) or more, else
    ``None``."""
    tokens = EXPAND_RUN_TOKENS if tokens is None else tokens
    active, runs = _runs(slots)
    if not tokens or slots.numel() < tokens * len(runs):
        return None
    return Runs(active.to(device=device, dtype=torch.int32),
                torch.tensor([b for _, b in runs], dtype=torch.int32, device=device), max(b - a for a, b in runs))


def _act_cat(ops: SinkOperands, x: torch.Tensor, w2_cat: torch.Tensor | None) -> torch.Tensor:
    """The down GEMM's left operand: ``act [T, n*F]``, or with ``w2_cat`` ``[T, n*F + R]`` (``_down_cat``)."""
    R = 0 if w2_cat is None else ops.max_rank
    return torch.empty(x.shape[0], ops.n * ops.intermediate + R, dtype=x.dtype, device=x.device)


def _cat_rows(ops: SinkOperands, s: int, w2_cat: torch.Tensor | None) -> None:
    """Slot ``s``'s ``B_s^T [R, H]`` into ``w2_cat``'s rows after ``n*F`` (``_down_cat``), if given."""
    if w2_cat is not None:
        nf, R = ops.n * ops.intermediate, ops.max_rank
        w2_cat[nf:nf + R].copy_(ops.buffers[3][s, 0].T)


def _down_cat(ops: SinkOperands, act_cat: torch.Tensor, s: int, scale: float, w2_cat: torch.Tensor,
              out: torch.Tensor) -> torch.Tensor:
    """The down side of one slot ``s`` as one GEMM (v27): ``act_cat = [act | scale_s * act a_cat_s^T]``
    ``[T, n*F + R]`` times ``w2_cat = [w2_lin ; B_s^T]`` ``[n*F + R, H]``: the down expand is ``R`` more
    steps of the base GEMM's ``K``, so ``out`` is written once, where the chain writes it, reads it and
    writes it again (``addmm``)."""
    nf, R = ops.n * ops.intermediate, ops.max_rank
    act_cat[:, nf:].addmm_(act_cat[:, :nf], ops.a_cat[s].T, beta=0, alpha=scale)   # beta 0: never read
    return torch.mm(act_cat, w2_cat[:nf + R], out=out)


@dataclass(frozen=True)
class SlotCats:
    """The used slots of a several-slot batch as blocks of the down GEMM's ``K`` (``_down_slot_cats``):
    ``slots [G]`` int64, the slots with tokens in order, whose ``B_s^T`` go after ``w2_lin``'s rows in
    ``ops.w2_cat``, and ``block [S]`` int32, each pool slot's block (``-1``: none)."""

    slots: torch.Tensor
    block: torch.Tensor


SLOT_CAT_TOKENS = 2048
SLOT_CAT_RANKS = 64
SLOT_CAT_WIDE_TOKENS = 8192
"""A several-slot batch on the cuBLAS path runs its down expand as more of the down GEMM's ``K`` (``slot_cats``, v37)
from ``SLOT_CAT_TOKENS`` tokens where its used slots' ranks add up to at most ``SLOT_CAT_RANKS`` (the extra ``K``),
from ``SLOT_CAT_WIDE_TOKENS`` where they add up to twice that, never beyond; it then takes no merge (``grouped_mode``).
``h100_multi_v37.json`` (an H100; S 4 / 8, R 16 / 64, 512-8192 tokens in slot order, every shape, both flushes),
``_down_slot_cats`` over the path routed before: ahead at every point this routes (0.93-0.98x at ``G R = 64`` from
2048 tokens, 0.88-0.97x at 128 from 8192, TP8 R 16 S 8 T 8192 0.877x; A and TP8 R 16 S 4 T 8192 0.97-0.98x the merge
routed there); behind at every shape at 512 tokens (1.0-1.4x: the down shrink no longer beside the down GEMM), at
``G R = 128`` on A and TP8 at 2048 (1.02-1.04x), and level or behind at ``G R`` 256-512 (0.99-1.12x, but TP8 R 64 S 4
T 2048 0.94x and S 8 T 8192 0.975x)."""


def slot_cats(num_tokens: int, ops: SinkOperands, used: int) -> bool:
    """A several-slot batch of ``num_tokens``, ``used`` slots with tokens, takes ``_down_slot_cats`` (shared
    outer, ``ops.w2_cat`` with room for ``used * R`` rows)."""
    k = used * ops.max_rank
    first = SLOT_CAT_TOKENS if k <= SLOT_CAT_RANKS else SLOT_CAT_WIDE_TOKENS if k <= 2 * SLOT_CAT_RANKS else 0
    return (first > 0 and num_tokens >= first and ops.shared_outer and ops.w2_cat is not None and used > 1
            and ops.w2_cat.shape[0] >= ops.n * ops.intermediate + k)


def slot_cat_operands(ops: SinkOperands, num_tokens: int, slots: torch.Tensor, device) -> SlotCats | None:
    """``SlotCats`` of effective ``slots [T]`` (host) where ``slot_cats``, else ``None``."""
    used = torch.unique(slots[slots >= 0])
    if not slot_cats(num_tokens, ops, used.numel()):
        return None
    block = torch.full((ops.slots,), -1, dtype=torch.int32)
    block[used] = torch.arange(used.numel(), dtype=torch.int32)
    return SlotCats(used.to(device=device, dtype=torch.int64), block.to(device))


def _act_slot_cat(ops: SinkOperands, x: torch.Tensor, cats: SlotCats | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(act_cat [T, n*F + G*R], act)``, ``act`` its first ``n*F`` columns (without ``cats``, ``act_cat`` is
    ``act``)."""
    nf = ops.n * ops.intermediate
    extra = 0 if cats is None else cats.slots.numel() * ops.max_rank
    act_cat = torch.empty(x.shape[0], nf + extra, dtype=x.dtype, device=x.device)
    return act_cat, act_cat[:, :nf]


def _down_slot_cats(ops: SinkOperands, act_cat: torch.Tensor, mid: torch.Tensor, p: Plan, out: torch.Tensor,
                    zero_sh: bool = False) -> torch.Tensor:
    """The down side of several slots as one GEMM (v37, ``_down_cat`` for each used slot): ``act_cat = [act |
    scale_s * mid in slot s's block]`` ``[T, n*F + G*R]`` (``kernels.spread_kernel``, from the down shrink
    ``mid [T, R]``) times ``w2_cat = [w2_lin ; B_0^T ; ... ; B_{G-1}^T]`` ``[n*F + G*R, H]``: ``out`` is written once,
    where the down epilogue reads it and writes it again, for ``G*R`` more steps of ``K`` (zeros outside a
    token's own block). The same launch copies the used slots' ``B_s^T`` into ``w2_cat`` (v55: where two launches
    of torch's on the up GEMM's side stream did, 7-33 µs of index-select and copy in ``h100_kernels_v39.log``).
    ``zero_sh``: the spread also zeroes ``p.sh`` (the Triton shrinks' workspace)."""
    T, nf, R, H = act_cat.shape[0], ops.n * ops.intermediate, ops.max_rank, ops.hidden
    G = p.cats.slots.numel()
    sh, bsh = _workspace(p, mid, zero_sh)
    db = ops.buffers[3]
    bh = SPREAD_ROWS_H
    _run(kernels.spread_kernel, (triton.cdiv(T, 64) + G * triton.cdiv(H, bh),),
         (mid, p.slots, p.scalings, p.cats.block, act_cat[:, nf:], sh, db, p.cats.slots, ops.w2_cat[nf:], T, R, G, H,
          act_cat.stride(0), sh.shape[1], db.stride(0), db.stride(2), db.stride(3)),
         fast=(p.fast, ("spread", zero_sh, mid.dtype, act_cat.dtype)), BM=64, BR=max(16, triton.next_power_of_2(R)),
         BSH=bsh, BH=bh, ZERO_SH=zero_sh, num_warps=4)
    return torch.mm(act_cat, ops.w2_cat[:nf + G * R], out=out)


SPREAD_ROWS_H = 128
"""``spread_kernel``'s copy of a used slot's ``B_s^T``: ``[SPREAD_ROWS_H, R]`` a program."""


def _launch_grouped(ops: SinkOperands, x, gammas, p: Plan, out: torch.Tensor) -> torch.Tensor:
    """Several slots, their tokens in slot order (``p.offs``, ``segment_offsets``), the cuBLAS path,
    shared outer: each shrink one grouped GEMM over the slots' runs (``torch._grouped_mm``; slot ``s``'s
    tokens against slot ``s``'s factor) beside the base GEMM that reads the same input (``_Beside``; the
    base GEMM on the side stream, into its preallocated output), the expands in the activation (over the
    runs, ``expand_act_kernel``, or ``up_kernel``'s epilogue) and on the down side (more of the down GEMM's
    ``K``, ``expand_down_kernel`` over the runs, or the down kernel's epilogue), each slot's scaling there."""
    ga, gb, da, db = ops.buffers
    T, R = x.shape[0], ga.shape[2] // 2
    n, F = ops.n, ops.intermediate
    offs = p.offs
    br = max(16, triton.next_power_of_2(R))
    act_cat, act = _act_slot_cat(ops, x, p.cats)
    y = torch.empty(T, n * 2 * F, dtype=x.dtype, device=x.device)
    side = _Beside(x)
    with side:
        torch.mm(x, ops.w13_lin.T, out=y)
    sh = torch._grouped_mm(x, ga[:, 0].transpose(1, 2), offs=offs)            # [T, 2R]
    side.join()
    if p.act_runs is not None:
        _expand_act(ops, y, gammas, act, sh, gb.contiguous(), runs=p.act_runs, scalings=p.scalings)
    else:
        _up(ops, x, y, gammas, act, p, Lora(True, sh, gb, da, db, x, R, 1, 0, br))
    if p.cats is not None:  # v37
        return _down_slot_cats(ops, act_cat, torch._grouped_mm(act, ops.a_cat.transpose(1, 2), offs=offs), p, out)
    side = _Beside(x)
    with side:
        torch.mm(act, ops.w2_lin, out=out)
    mid = torch._grouped_mm(act, ops.a_cat.transpose(1, 2), offs=offs)
    side.join()
    key = (x.dtype, "grouped")
    _down_expand(ops, act, out, p, Lora(True, sh, gb, da, db, mid, R, 1, 0, br), mid, key)
    return out


def _launch_merged(ops: SinkOperands, x, gammas, p: Plan, out: torch.Tensor) -> torch.Tensor:
    """Tokens in runs of one slot each (``p.runs``), the cuBLAS path: the base forward's GEMMs on each
    run's merged weights (shared outer shown; ``merged.remerge`` merges either layout), ``w13_s = w13_lin + scale_s W1Δ_s A_s`` ``[n*2F, H]`` and
    ``w2_s = w2_lin + scale_s a_cat_s^T B_s^T`` ``[n*F, H]``: one run ``torch.mm``; several, the
    gate/up side one grouped GEMM over the runs and the down side a ``torch.mm`` per run into its rows
    of ``out`` (the grouped GEMM takes no ``out=``). ``"kept"``: the merges ``ops.kept`` holds (rows
    ``p.merge_rows``; ``w2_s`` kept as ``w2_s^T [H, n*F]``), so the LoRA costs no work here at all; one
    token (``p.tiles.gemv``) streams its slot's copies through the GEMV kernels, a few (``p.tiles.up_act``)
    run ``up_act_kernel`` on its ``w13_s`` and cuBLAS's down GEMM, and ``p.run_streams`` runs
    each run's two GEMMs as ``torch.mm`` on a stream of its own (``RUN_STREAMS``). ``"merge"`` (shared
    outer): the slots ``p.merge_slots`` merged now into new copies (``merge_kernel``: each weight read
    once and written once per slot; the down side's beside the gate/up GEMM, ``_Beside``),
    ``2 G n*3F*H`` weight elements moved, not work per token: ahead where tokens are many and slots few
    (``merges``); nothing is kept, so in-place pool updates are followed."""
    T, H = x.shape
    n, F = ops.n, ops.intermediate
    act = torch.empty(T, n * F, dtype=x.dtype, device=x.device)
    side = _Beside(x, p.grouped == "merge")
    if p.grouped == "kept":
        first, rows = p.merge_rows[0], p.merge_rows
        w13, w2 = ops.kept.w13[first:rows[-1] + 1], ops.kept.w2.transpose(1, 2)  # w2 [K, n*F, H], a view
        if p.tiles.gemv:
            w2_nhf = ops.kept.w2[first].view(H, n, F).transpose(0, 1)             # [n, H, F], rows n*F apart
            _gemv(ops, x, gammas, act, out, p, Lora.none(x), _launch_key(ops, x, gammas, out) + ("kept",),
                  (w13[0].view(n, 2 * F, H), w2_nhf))
            return out
        if p.tiles.up_act:
            _up_act(ops, x, gammas, w13[0], act, p, _launch_key(ops, x, gammas, out) + ("kept",), p.tiles)
            return torch.mm(act, w2[first], out=out)
    else:
        ga, _, _, db = ops.buffers
        G = len(p.runs)
        first, rows = 0, range(G)
        w13 = torch.empty(G, n * 2 * F, H, dtype=x.dtype, device=x.device)
        w2 = torch.empty(G, n * F, H, dtype=x.dtype, device=x.device)
        _merge(ops.w13_lin, ops.w1_delta, ga[:, 0], p.merge_slots, p.scalings, w13)
        with side:
            _merge(ops.w2_lin, ops.a_cat.transpose(1, 2), db[:, 0].transpose(1, 2), p.merge_slots, p.scalings, w2)
    if p.run_streams:
        y = torch.empty(T, n * 2 * F, dtype=x.dtype, device=x.device)
        _on_run_streams(x, p.runs, lambda i, a, b: torch.mm(x[a:b], w13[rows[i] - first].T, out=y[a:b]))
    elif len(p.runs) == 1:
        y = torch.mm(x, w13[rows[0] - first].T)
    else:  # a torch.mm per run in one stream measured level at 8192 tokens and slower at 2048 (v21)
        y = torch._grouped_mm(x, w13.transpose(1, 2), offs=p.offs)          # [T, n*2F]
    _up(ops, x, y, gammas, act, p, Lora.none(x))
    side.join()
    _on_run_streams(x, p.runs, lambda i, a, b: torch.mm(act[a:b], w2[rows[i]], out=out[a:b]), p.run_streams)
    return out


def _on_run_streams(x: torch.Tensor, runs, work, on: bool = True) -> None:
    """``work(i, a, b)`` for each run ``(a, b)``: on CUDA with ``on``, the ``i``-th on a side stream of
    its own (``_side_stream``) that first waits for the current stream, which then waits for them all (a
    CUDA graph captures the runs as branches that run at once); else one after another. The tensors the
    work writes are allocated before it, on the current stream."""
    if not (on and x.is_cuda):
        for i, (a, b) in enumerate(runs):
            work(i, a, b)
        return
    main = torch.cuda.current_stream(x.device)
    streams = [_side_stream(x.device, i) for i in range(len(runs))]
    for stream, (i, (a, b)) in zip(streams, enumerate(runs)):
        stream.wait_stream(main)
        with torch.cuda.stream(stream):
            work(i, a, b)
    for stream in streams:
        main.wait_stream(stream)


MERGE_TILE = (64, 128, 4)
"""``merge_kernel``'s tile (weight rows, columns) and warps: one tile per program."""


def _merge(w: torch.Tensor, p_: torch.Tensor, q: torch.Tensor, slots: torch.Tensor, scalings: torch.Tensor,
           out: torch.Tensor, tile: tuple[int, int, int] | None = None) -> None:
    """``out[g] = w + scalings[s] * p_[s] @ q[s]`` for ``s = slots[g]`` (``merge_kernel``): ``w [M, N]``,
    ``p_ [S, M, K]``, ``q [S, K, N]`` at any strides, ``out [G, M, N]`` contiguous."""
    G, M, N = out.shape
    K = p_.shape[-1]
    bm, bn, warps = tile or MERGE_TILE
    _run(kernels.merge_kernel, (triton.cdiv(M, bm) * triton.cdiv(N, bn), G),
         (w, p_, q, out, slots, scalings, M, N, K, *w.stride(), *p_.stride(), *q.stride()),
         BM=bm, BN=bn, BK=max(16, triton.next_power_of_2(K)), num_warps=warps, num_stages=1)


def kept_operands(slots: torch.Tensor, rows: list[int], device) -> dict:
    """The ``Plan`` fields of ``_launch_merged`` on kept merges (``ops.kept``): effective ``slots [T]``
    (host) in runs of one slot each, in slot order, ``rows`` the kept row of each run's slot
    (ascending). ``offs`` ends the token runs of every kept row from the first run's to the last's
    (a kept row between them with no tokens ends where the previous one does)."""
    _, runs = _runs(slots)
    ends = [0] * (rows[-1] - rows[0] + 1)
    for (_, b), r in zip(runs, rows):
        ends[r - rows[0]] = b
    return {"offs": torch.tensor(list(itertools.accumulate(ends, max)), dtype=torch.int32, device=device),
            "runs": runs, "merge_rows": tuple(rows), "grouped": "kept",
            "run_streams": 1 < len(runs) <= RUN_STREAMS and slots.numel() >= RUN_STREAM_TOKENS * len(runs)}


RUN_STREAMS, RUN_STREAM_TOKENS = 4, 1024
"""Kept runs up to ``RUN_STREAMS`` of them, ``RUN_STREAM_TOKENS`` tokens each on average, take one cuBLAS
``torch.mm`` per run and side, each run on a stream of its own (``_on_run_streams``), in place of the
grouped GEMM: measured (``h200_kept_streams.json``, v24, R 16, both flushes) ahead at every four-slot point
from 4096 tokens (TP8 S4 T4096 1.12x the base against 1.24x, A S4 T8192 1.06x against 1.10x), level or
behind at 2048 (TP8 S4 1.35x against 1.27x), and behind with eight slots at up to 4096 tokens (TP8 S8 T2048
1.59x against 1.41x) and at A and TP8 with eight at 8192."""


def keeps(num_tokens: int, rank: int, used: int) -> bool:
    """A batch of ``num_tokens`` in runs of ``used`` slots whose merges are kept (``ops.kept``), on a
    pool of rank ``R``, takes the kept merges where each used slot has on average
    ``KEEP_TOKENS * sqrt(16 / R)`` tokens; one slot at any count from two tokens (its forward is the base forward's).
    The grouped GEMM on the copies streams ``used`` copies of the weights, so it pays once each slot's
    GEMM has rows enough to keep the tensor cores busy (a machine balance, not a ratio of the shape's
    sizes); the kit's path it replaces costs more with the rank, so the copies pay from fewer rows."""
    return used == 1 or num_tokens >= used * KEEP_TOKENS * math.sqrt(16 / max(rank, 1))


KEEP_TOKENS = 512
"""``keeps``' tokens per used slot at rank 16, from ``h200_merge.json`` (v22: one slot and S 4 / 8 at
512-8192 tokens, R 16 / 64, every shape, both flushes): the copies were ahead of the kit's path from 512
tokens per slot at R 16 in every group (from 256 at Inkling S 8) and from 256 at R 64 in all but A S 8
(from 512; 1.05-1.09x behind at 2048 tokens); the square root of the rank meets both. The rule routes
153 of the 160 multi-slot points within 1 % of the faster (``h200_merge.keep_fit``); v22's prediction,
a ratio of the shape's sizes like ``merges``', routed 117 (0.5) or 98 (0.75, no measured loss)."""


def merge_operands(slots: torch.Tensor, device) -> dict:
    """The ``Plan`` fields of ``_launch_merged`` for effective ``slots [T]`` (host) that run in slot
    order with no base-only token (``segment_offsets`` holds, or one slot throughout): the slots
    that have tokens, their runs' ends on ``device`` and the runs on the host."""
    active, runs = _runs(slots)
    return {"merge_slots": active.to(device=device, dtype=torch.int32),
            "offs": torch.tensor([b for _, b in runs], dtype=torch.int32, device=device), "runs": runs,
            "grouped": "merge"}


def _runs(slots: torch.Tensor) -> tuple[torch.Tensor, tuple[tuple[int, int], ...]]:
    """Effective ``slots [T]`` (host) in runs of one slot each: each run's slot and its ``(start, end)``."""
    active, counts = torch.unique_consecutive(slots.long(), return_counts=True)
    ends = counts.cumsum(0)
    return active, tuple(zip((ends - counts).tolist(), ends.tolist()))


def _shrink(x: torch.Tensor, p: Plan, a: torch.Tensor, dst: torch.Tensor, mid: torch.Tensor, *, k: int, ldx: int,
            x_o_off: int, rank: int, outer: int, a_slot: int, a_outer: int, halves: int, br: int, zero_mid: bool,
            key: tuple, pdl: bool = False) -> None:
    """One ``shrink_kernel`` launch over ``k`` of each row of ``x`` (rows ``ldx`` long,
    outer ``o`` from column ``o * x_o_off``) into ``dst``; ``a``'s rows of slot ``s`` and
    outer ``o`` start at ``s * a_slot + o * a_outer``; ``halves`` blocks of ``rank``
    rows (the kernel's docstring names the rest); ``pdl``: the up launch after it may
    start at once."""
    T = x.shape[0]
    t = p.tiles
    bm = t.sbm or t.bm
    split = triton.cdiv(k, t.k_chunk)
    k_chunk = triton.cdiv(triton.cdiv(k, split), 16) * 16  # a multiple of the step below
    bk = next(b for b in (64, 32, 16) if k_chunk % b == 0)
    S = p.scalings.numel()
    _run(kernels.shrink_kernel, (triton.cdiv(T, bm), outer * S, split),
         (x, p.slots, a, dst, mid, T, k, ldx, x_o_off, rank, outer, a_slot, a_outer, k_chunk),
         fast=(p.fast, key), HALVES=halves, ZERO_MID=zero_mid, BM=bm, BR=br, BK=bk, PDL=pdl,
         num_warps=t.swarps, num_stages=3)


FOLD_TOKENS = 4096
"""From this many tokens a one-slot batch on weights over ``SMALL_WEIGHTS`` folds its LoRA into
the base GEMMs' ``beta = 1``
(``folds``, ``_launch_folded``: no ``y`` or ``out`` round trip, which costs more than the side
streams save once the GEMMs fill the GPU: at 8192 tokens on B, Inkling, TP8 0.95-0.97x sglang's
one-slot chain against 0.96-0.99x for ``_launch_single``, ``h200_one_slot.json``; at 2048 the other way round,
0.98-1.03x against 0.95-0.99x; 4096, between the two, was not measured)."""

CAT_TOKENS = 512
"""From this many tokens (times ``R / 16`` from rank 16 up) a one-slot batch on weights over
``SMALL_WEIGHTS`` runs its down side as one GEMM (``cats``, ``_down_cat``, v27), in the chain and in
the fold. ``h100_one_slot_v27.json`` (an H100, one slot, 32-8192 tokens, R 16 / 64, both flushes), each
path with ``_down_cat`` over the same path with its ``addmm``: at R 16 from 512 tokens 0.85-0.99x on B,
Inkling and TP8, at R 64 from 2048 0.88-0.99x (at 512, 0.96-1.01x); at 32 and 128 tokens 0.97-1.12x (the
down shrink no longer runs beside the down GEMM, and costs more with the rank); on A 0.95-1.13x (``H =
n*F``: the pass over ``out`` it saves is small beside the shrink), whose one slot merges from 1536 tokens.
The pass saved is ``T * H`` elements written and read, most where ``H`` is large beside ``n*F`` (TP8:
0.85-0.88x at 8192 tokens, where the merge routed is faster still)."""


def cats(num_tokens: int, ops: SinkOperands) -> bool:
    """A one-slot batch of ``num_tokens`` on the cuBLAS path adds its down expand as more of the down
    GEMM's ``K`` (``_down_cat`` on ``ops.w2_cat``): from ``CAT_TOKENS * max(1, R / 16)`` tokens, on
    weights over ``SMALL_WEIGHTS``."""
    return (ops.w2_cat is not None and ops.n * ops.intermediate * ops.hidden > SMALL_WEIGHTS
            and num_tokens >= CAT_TOKENS * max(1, ops.max_rank // 16))


SWAP_TOKENS, SWAP_FEATURES = 512, 8192
"""From ``SWAP_TOKENS`` tokens, on an up GEMM ``SWAP_FEATURES`` wide or wider (``n * 2F``: B and the real model, not A
or the TP-8 slice), ``_launch_single`` enqueues the up GEMM first, on the side stream, and the shrink after it as a
one-group grouped GEMM (``swaps``). v56b's probe (``h100_up_cat_v56b.json``, an H100, one slot, both flushes) timed that
pair at 0.94-1.00x the kit's pair before (the shrink by ``torch.mm`` on the side stream) on B and Inkling at 512 and
2048 tokens at both ranks (B R 16 T 512 under the write flush 1.024x), 0.5-5.6 µs over the up GEMM alone where the
old pair was 2.6-15.7; at 128 tokens 1.02-1.18x; on A 1.00-1.59x and on the TP-8 slice 0.99-1.56x at every count
(there the grouped GEMM on this stream waits for its share of an up GEMM too narrow to fill the GPU)."""


SWAP_SHRINK_ELEMS = 3 << 16
"""``swaps`` only where the slot's gate/up ``A_s`` ``[2R, H]`` has at least this many elements: v56c
(``h100_swap_v56c_*.json``, the whole one-slot forward both ways in one process, twice on one lease) had the swap 0-4 %
ahead from the real model's R 16 (196 608) up and behind at B R 16 (131 072: 1.2-1.4 % at 2048 tokens in the read flush,
3.3-3.6 % at 512 in the write flush); v56d (``h100_swap_v56d.json``, another lease) had B R 16 behind again, 4.0 % at
2048 tokens read, and the side by side with this routing (``h100_side_by_side.json``, 248e0fb) B R 16 S 1 T 2048 at
1.069-1.070x the base read where the swap had it at 1.092-1.100x (KERNEL_NOTES.md, v56d)."""


def swaps(num_tokens: int, ops: SinkOperands, device) -> bool:
    """A one-slot batch of ``num_tokens`` on ``_launch_single``'s chain takes v56b's arrangement (``SWAP_TOKENS``,
    ``SWAP_FEATURES``, ``SWAP_SHRINK_ELEMS``) where torch's grouped GEMM takes the shrink: bfloat16 on CUDA, any dtype
    on the CPU; 16-byte rows of ``x`` and of the shrink (``H`` and ``R`` multiples of 8)."""
    return (num_tokens >= SWAP_TOKENS and ops.n * 2 * ops.intermediate >= SWAP_FEATURES
            and 2 * ops.max_rank * ops.hidden >= SWAP_SHRINK_ELEMS
            and ops.max_rank % 8 == 0 and ops.hidden % 8 == 0 and _grouped_gemm_takes(ops, device))


GROUPED_TOKENS = 8192
GROUPED_RANK_TOKENS = 512
"""From these many tokens (at any rank; at ranks from ``GROUPED_MIN_RANK``) a multi-slot batch in slot
order takes ``_launch_grouped`` (``grouped_mode``). v20's grid (``h200_grouped.json``, S 4 and 8, 512/2048/8192
tokens on every shape, read flush): R 16 at 8192 0.98-1.00x the multi-slot path with its Triton shrinks, at 512
and 2048 0.99-1.36x (the grouped shrinks, ~20-30 µs each, cost more than the Triton shrinks save); R 64 from 2048
0.88-0.95x, at 512 ahead only on Inkling's weights. v41 on an H100 (``h100_grouped_v40.json``, after v36c's runs,
v38's down runs and v39's ``epi``): R 64 at 512 tokens 0.87-0.97x on A, B and TP8 too (Inkling 0.85-0.95x), so
every shape groups from 512 at R 64; R 16 as before (at 512 and 2048 tokens 0.99-1.25x, ahead only at Inkling S 4
T 512; at 8192 0.97-0.99x)."""

GROUPED_MIN_RANK = 33
"""The rank from which ``grouped_mode`` groups a multi-slot batch from ``GROUPED_RANK_TOKENS``."""

ONE_SLOT_TILES = Tiles(bm=32, bf=64, bn=64, bk=64, k_chunk=512, warps=4, stages=2, cublas=True, sbm=64)
"""``_launch_single``'s activation tiles (``plan``): ``expand_act_kernel`` on 32 tokens by 64 features, 4 warps, 2
row tiles in flight (v36, ``h100_one_slot_v36.json``: the best of five tiles at 22 of the 32 one-slot points in each
flush, within 1 % of the best at 26 read and 28 write, 3 % at all; the chain 0.94-1.01x the epilogue of ``up_kernel`` before it on these tiles and 0.89-1.00x its
``addmm`` fold, routed at R 64 from ``T * n*F`` of 2 M; B R 64 T 2048 350 -> 336 µs, Inkling R 64 T 2048 752 -> 728).
As ``up_kernel``'s tiles (v17): 192 programs at TP8 T = 512, where 64 x 128 gave 48."""

EXPAND_TILES = replace(ONE_SLOT_TILES, stages=3)
"""``expand_act_kernel``'s tiles (``expand_tiles``): ``ONE_SLOT_TILES``' 32 x 64 on 4 warps with a second buffer of
``y`` and ``sh``, the next row tile's copy in flight while a program computes (v54, ``h100_activation_v54*.json``, an
H100, the activation alone at 2048 and 8192 tokens, every shape, R 16 / 64, S 1 / 4, both flushes): 0.85-0.97x two
stages at 29 of 32 points read (B R 64 S 1 T 2048 28.9 -> 26.4 µs, Inkling R 64 S 4 T 8192 155 -> 133); four stages
1.3-1.7x. Behind only on the runs of several slots at rank 64 on A's and the TP-8 slice's few features (1.01-1.09x
read), which keep two (``EXPAND_NARROW_FEATURES``). Measured at 2048 and 8192 tokens only: the chain from 17 tokens
and the runs from 64 a run take it untimed (a program there walks few row tiles, so the second buffer is mostly idle)."""

EXPAND_NARROW_FEATURES = 1536
"""``n*F`` up to which several slots' runs at ranks over 16 keep ``ONE_SLOT_TILES``' two stages (A's 1536, the TP-8
slice's 768: v54)."""


def expand_tiles(ops: SinkOperands, runs: bool) -> Tiles:
    """The tiles of an ``expand_act_kernel`` launch on ``ops``' pool: one slot (``runs=False``) or several slots' runs
    (``EXPAND_TILES``, v54)."""
    narrow = runs and ops.max_rank > 16 and ops.n * ops.intermediate <= EXPAND_NARROW_FEATURES
    return ONE_SLOT_TILES if narrow else EXPAND_TILES


GRAPH_TOKENS = 256
"""Up to this many tokens an eager call on CUDA replays a CUDA graph of its launches."""


def triton_forward(ops: SinkOperands, x: torch.Tensor, gammas: torch.Tensor,
                   batch: SlotBatch | None, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x [T, H]``, ``gammas [T, n]`` -> ``out [T, H]`` in ``x``'s dtype (base plus LoRA;
    ``out``: a contiguous tensor of that shape and dtype to write into and return).

    The plan is made once per batch object (``cached_plan``). For few tokens on CUDA
    the host's launch work, not the GPU, sets the pace (120-240 µs a call on the H200
    machine, ``history/h200_graph_v6.json``), so an eager call with a batch replays a graph:
    the first call launches, the second captures the launches against the plan's static
    tensors (``static_io``: copies of the inputs where the caller has not asked for them
    first), every later one copies ``x`` and ``gammas`` in, replays and returns a copy
    of the output; ``x``, ``gammas`` or ``out`` that are those static tensors themselves
    are not copied, and a caller's own tensors that come back at the addresses of an
    earlier call get a graph captured around them (``_own_graph``). The graph reads the
    batch's device tensors and the pool at every replay, so in-place updates of a ``SlotBatch.to(device)`` batch and of the pool
    are followed; new weight or pool storage makes a new graph. Inside a capture of
    the caller's own, the launches are enqueued directly. On the CPU it runs only under
    Triton's interpreter (``TRITON_INTERPRET=1``), else ``ISL-E014``."""
    if not x.is_cuda and not interpreting():
        raise RuntimeError(TRITON_ON_CUDA)
    p = cached_plan(ops, x.shape[0], batch, x.device)
    if not takes_graph(batch, x.device, x.shape[0]) or torch.cuda.is_current_stream_capturing():
        return launch(ops, x, gammas, p, out)
    return _replay(ops, x, gammas, p, out)


def takes_graph(batch: SlotBatch | None, device: torch.device, tokens: int) -> bool:
    """An eager forward of ``tokens`` tokens with ``batch`` on ``device`` replays a graph
    (``_replay``): a batch, CUDA, 1 to ``GRAPH_TOKENS`` tokens (none: nothing to launch)."""
    return batch is not None and device.type == "cuda" and 0 < tokens <= GRAPH_TOKENS


def static_io(ops: SinkOperands, batch: SlotBatch | None, tokens: int) -> StaticIO | None:
    """The static tensors of ``batch``'s graphs (``StaticIO``: ``x [T, H]``,
    ``gammas [T, n]``, ``out [T, H]``), made now where no call has made them (float32
    ``gammas``), so that the caller writes its inputs there and the replays copy nothing;
    ``None`` where a forward of ``tokens`` takes no graph (``takes_graph``). One set per plan: every graph of the plan (a new one after new
    pool storage) is captured around the same tensors."""
    if not takes_graph(batch, ops.device, tokens):
        return None
    p = cached_plan(ops, tokens, batch, ops.device)
    io = p.fast.get("io")
    if io is None:
        io = p.fast["io"] = StaticIO.empty(ops, tokens)
    return io


def _capture(ops: SinkOperands, p: Plan, io: StaticIO, share: "torch.cuda.CUDAGraph | None" = None
             ) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``launch`` on plan ``p``, reading ``io.x`` and ``io.gammas`` and
    writing ``io.out`` (a warm-up launch on a side stream first, as torch's capture wants);
    its workspaces from ``share``'s memory pool where given (the graphs of one plan already
    share its workspaces, ``p.sh`` and the split's, so they are replayed one after another,
    and nothing a replay leaves in its workspaces is read by the next)."""
    side = torch.cuda.Stream(io.x.device)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch(ops, io.x, io.gammas, p, io.out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=None if share is None else share.pool()):
        launch(ops, io.x, io.gammas, p, io.out)
    return graph


def graph_key(ops: SinkOperands, x: torch.Tensor) -> tuple:
    """The key of a plan's graph for ``x [T, H]``: ``x``'s dtype and the address of
    every storage the graph reads, read at each call (the pool's buffers are the
    caller's tensors, whose storage may be swapped under one record). The device is
    the plan's own: ``cached_plan`` keys on it."""
    b, a_cat, kept = ops.buffers, ops.a_cat, ops.kept
    return ("graph", x.dtype, ops.w13.data_ptr(), ops.w2.data_ptr(),
            None if b is None else (b[0].data_ptr(), b[1].data_ptr(), b[2].data_ptr(), b[3].data_ptr()),
            None if a_cat is None else a_cat.data_ptr(),
            None if kept is None else (kept.w13.data_ptr(), kept.w2.data_ptr()))


def _replay(ops: SinkOperands, x: torch.Tensor, gammas: torch.Tensor, p: Plan,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """The graph of ``launch`` on plan ``p`` for ``x [T, H]``, ``gammas [T, n]`` (see
    ``triton_forward``) -> ``out [T, H]``: the caller's, else a new one. The plan's
    static tensors (``p.fast["io"]``, a ``StaticIO``) are the graph's inputs and output;
    the caller's own tensors are, where they come back at the same addresses (``_own_graph``)."""
    key = graph_key(ops, x)
    graph = p.fast.get(key)
    if graph is None:  # first call: launch (compiles, fills the launch cache)
        p.fast[key] = "launched"
        return launch(ops, x, gammas, p, out)
    io = p.fast.get("io")
    if graph == "launched":  # second call: capture against the static tensors
        if io is None:  # copies of this call's inputs (static_io makes them first where asked)
            io = p.fast["io"] = StaticIO(x.contiguous().clone(), gammas.contiguous().clone(), torch.empty_like(x))
        graph = p.fast[key] = _capture(ops, p, io)
    # Identity, not values: the caller's own static tensors are already the graph's inputs.
    static = x is io.x, gammas is io.gammas, out is io.out
    if all(static):
        graph.replay()
        return out
    out = torch.empty_like(x) if out is None else out
    own = _own_graph(ops, x, gammas, out, p, key) if not any(static) else None
    if own is not None:
        own.replay()
        return out
    # Both copies are one dispatcher call (on CUDA one kernel where x and gammas share a dtype).
    if not static[0]:
        if not static[1]:
            torch._foreach_copy_([io.x, io.gammas], [x, gammas])
        else:
            io.x.copy_(x)
    elif not static[1]:
        io.gammas.copy_(gammas)
    graph.replay()
    if not static[2]:
        out.copy_(io.out)  # io.out is the graph's: the next replay overwrites it
    return out


OWN_GRAPHS = 4
"""Graphs a plan captures around a caller's own ``x``, ``gammas`` and ``out`` (``_own_graph``), per pool storage."""


def _own_graph(ops: SinkOperands, x: torch.Tensor, gammas: torch.Tensor, out: torch.Tensor, p: Plan,
               key: tuple) -> "torch.cuda.CUDAGraph | None":
    """A graph of ``launch`` that reads ``x [T, H]`` and ``gammas [T, n]`` and writes ``out [T, H]`` where they
    are: nothing copied in or out (v57, issue 26 target 4). A graph reads addresses, so it serves any later call
    whose tensors sit at the same three addresses with the same dtypes, as a loop's do (the caching allocator
    hands a freed block back to the next request of its size): captured the second time an address set comes,
    up to ``OWN_GRAPHS`` of them, their workspaces in the memory pool of the plan's graph on its static tensors;
    ``None`` (copy in and out) for any other set, for tensors that are not contiguous, and for an ``out`` that
    shares memory with ``x`` or ``gammas`` (nothing orders every read of ``x`` in the launches before their first
    write of ``out``)."""
    if not (x.is_contiguous() and gammas.is_contiguous() and out.is_contiguous()):
        return None
    at = (x.data_ptr(), gammas.data_ptr(), gammas.dtype, out.data_ptr())
    own = p.fast.get(("own", key))
    if own is None:
        own = p.fast[("own", key)] = ({}, set())
    graphs, seen = own
    graph = graphs.get(at)
    if graph is not None or _shares_memory(out, x) or _shares_memory(out, gammas):  # the sizes are the plan's
        return graph
    if at in seen:
        if len(graphs) < OWN_GRAPHS:
            graph = graphs[at] = _capture(ops, p, StaticIO(x, gammas, out), share=p.fast[key])
        return graph
    if len(seen) >= 16 * OWN_GRAPHS:  # bounded: a run of new address sets starts the count again
        seen.clear()
    seen.add(at)
    return None


def own_graphs(ops: SinkOperands, x: torch.Tensor, p: Plan) -> int:
    """How many graphs around a caller's own tensors (``_own_graph``) plan ``p`` holds for ``x``'s graph (its dtype and
    the pool's storages, ``graph_key``): what a GPU run records beside its host times, so a slow window can be told
    apart from one that captured."""
    return len(p.fast.get(("own", graph_key(ops, x)), ({}, ()))[0])


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the bytes of contiguous ``a`` and ``b`` overlap."""
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()
