"""v17 on a CUDA GPU (issue 26 target 2): the one-slot cuBLAS chain (``triton_backend._launch_single``)
with each shrink on a side stream beside the base GEMM that reads the same input, against what
``auto`` runs (``kit``) and sglang 0.5.23's one-slot cuBLAS path taken from its wheel, at every
S = 1 point from 32 tokens on (both flushes); then each launch of both chains alone, at the
worst points, to say where the time goes. (The recorded run, ``data/profiles/h200_one_slot.json``
at 90edd14, also timed each variant without the side stream and the kit's v15 chains, whose
code was removed after it: see KERNEL_NOTES.md v17.)

1. Correctness first, against the float64 reference on fresh random inputs: bf16 and fp16, both
   gate/up layouts, one slot at scaling 0.7 in a pool with a rank-0 slot, every variant, a graph of
   it replayed twice (NaN-poisoned outputs), at a partial tile (37 tokens) and at 300.
2. The sweep (``VARIANTS``): the chain on ``pick_tiles``' cuBLAS-path tiles and (``_t2``) on
   ``ONE_SLOT_TILES``, with and without ``_down_cat``, and the fold (``_launch_folded``), beside ``kit``
   (``auto``) and ``sglang_one_slot``; medians, read and write flush. (v17's and v27's records also timed
   the expand in ``up_kernel``'s epilogue and as a cuBLAS ``addmm`` onto ``y``, which v36 replaced.)
3. ``--breakdown``: each launch of both chains alone (read flush).

v27 (``h100_one_slot_v27.json``, ``--tokens 32,128,512,2048,8192``): ``*_cat`` runs each chain's down side
as ``_down_cat`` (the down expand as more of the down GEMM's ``K``, on a copy of ``w2_lin`` with ``R`` rows
more), and ``folded`` / ``folded_cat`` the fold (``_launch_folded``) without and with it.

v36 (``--expand``): the chain as ``plan`` routes it (``routed``: ``expand_act_kernel`` on ``ONE_SLOT_TILES``)
against the same chain on each of ``EXPAND_TILES``, at one slot, 128-8192 tokens, R 16 / 64, every shape; the
correctness matrix first over the same variants. ``h100_one_slot_v36.json`` (at 71bcfd9) timed the expand in
``up_kernel``'s epilogue (``epi_as_routed``) and the ``addmm`` fold (``fold_as_routed``) beside the kernel's tiles
(``x32f64w4`` is ``ONE_SLOT_TILES``'s).

``--multi --expand`` (v36c): that path beside the same batch planned with ``EXPAND_RUN_TOKENS = RUN_TOKENS``
(``runs``: ``expand_act_kernel`` over the batch's runs of one slot), its correctness matrix with the runs kernel
on the mixed batch and on the same tokens sorted by slot. (At cf13028 the same flags timed v36b's several-slot
kernel, since taken out: ``h100_multi_v36b.json``.)

``--multi``: the multi-slot cuBLAS path (v17b) with its two shrink launches on the side stream
(``kit``) against sglang's multi-slot kernels, at S 4 and 8 from 128 tokens, both flushes; its
correctness matrix first (mixed slots with base-only and rank-0 tokens, both outer layouts, a
device-resident batch, graph replays). The recorded run (``h200_multi_beside.json`` at 44d80d6)
also timed the same launches in one stream (``kit_seq``, a switch removed after it).

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=. python3 scripts/gpu/h200_one_slot.py --wheel WHEEL --out $OUT/NAME.json
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace

import torch

import h200_pdl  # this folder's (the script's own, first on sys.path): time_point, check_contender
from inkling_lab import profile as pr, records
from inkling_lab.batch import SlotBatch
from inkling_lab.forward import triton_backend as tb
from inkling_lab.forward.reference import reference_forward

VARIANTS = {"chain": dict(), "chain_t2": dict(tiles="t2"), "chain_cat": dict(cat=True),
            "folded": dict(folded=True), "folded_cat": dict(folded=True, cat=True)}
EXPAND_TILES = {"x32f128w8": (32, 128, 8, 2), "x64f128w8": (64, 128, 8, 2), "x16f256w8": (16, 256, 8, 2),
                "x64f64w4s3": (64, 64, 4, 3)}
"""v36's other candidates for ``expand_act_kernel`` (``--expand``): tokens and features a tile, warps, row tiles in
flight (``ONE_SLOT_TILES``: 32, 64, 4, 2)."""
EXPAND_VARIANTS = {"routed": dict(tiles="t2", cat="auto"), **{k: dict(tiles=k, cat="auto") for k in EXPAND_TILES}}
"""``--expand``: the chain as ``plan`` routes it (``ONE_SLOT_TILES``, ``cats``' down side) on each tile."""
EXPAND_POINTS = [(T, pr.SIDE_SHAPES) for T in (128, 512, 2048, 8192)]
POINTS = [(T, shapes) for T, shapes in ((32, ("B", "Inkling", "Inkling-TP8")),
                                         (128, pr.SIDE_SHAPES), (512, pr.SIDE_SHAPES),
                                         (2048, pr.SIDE_SHAPES), (8192, pr.SIDE_SHAPES))]
BREAKDOWN = [("Inkling-TP8", 64, 512), ("Inkling", 64, 512), ("Inkling", 64, 128), ("A", 64, 2048),
             ("Inkling-TP8", 64, 32), ("B", 64, 512)]


def cublas_tiles(T: int, ops, which: str = "auto") -> tb.Tiles:
    """``pick_tiles``' cuBLAS-path tiles at ``T`` (its 33-128-token ones where it streams
    weights there instead); ``"t2"``: ``ONE_SLOT_TILES``; a key of ``EXPAND_TILES``: those with its
    activation tiles."""
    if which == "t2":
        return tb.ONE_SLOT_TILES
    if which in EXPAND_TILES:
        bm, bf, warps, stages = EXPAND_TILES[which]
        return replace(tb.ONE_SLOT_TILES, bm=bm, bf=bf, warps=warps, stages=stages)
    t = tb.pick_tiles(T, ops.n * ops.intermediate * ops.hidden, ops.hidden)
    return t if t.cublas else tb.pick_tiles(128, 1 << 40, ops.hidden)


def chain(ops, x, gammas, batch, out, tiles: str = "auto", cat: bool | str = False, folded: bool = False):
    """``_launch_single`` (``folded``: ``_launch_folded``) on ``cublas_tiles``; ``cat``: with a
    ``w2_cat`` (v27, ``_down_cat``), here a copy of ``w2_lin`` with ``R`` rows more (``"auto"``: the
    operands' own where ``cats`` routes it)."""
    p = tb.plan(ops, x.shape[0], batch, x.device, cublas_tiles(x.shape[0], ops, tiles))
    assert p.single_slot >= 0
    w2_cat = None
    if cat == "auto":
        w2_cat = ops.w2_cat if tb.cats(x.shape[0], ops) else None
    elif cat:
        R = ops.buffers[3].shape[3]
        w2_cat = torch.cat([ops.w2_lin, torch.full((R, ops.hidden), float("nan"), dtype=x.dtype, device=x.device)])
    if folded:
        return lambda: tb._launch_folded(ops, x, gammas, p, out, w2_cat)
    return lambda: tb._launch_single(ops, x, gammas, p, out, w2_cat)


def kit(ops, x, gammas, batch, out):
    """``auto``: ``plan``'s own tiles."""
    p = tb.plan(ops, x.shape[0], batch, x.device)
    return lambda: tb.launch(ops, x, gammas, p, out)


CHECK_TOKENS = (37, 300)
"""The one-slot correctness pass's token counts: a partial tile and a few hundred."""
MULTI_CHECKS = (("A", 200), ("Inkling-TP8", 100))
"""The several-slot correctness pass's shapes and token counts."""


def correctness(variants: dict = VARIANTS) -> list[dict]:
    rows = []
    for shape in ("A", "Inkling-TP8"):
        for interleaved in (True, False):
            for dtype in ("bfloat16", "float16"):
                for T in CHECK_TOKENS:
                    c = pr.Case.of(shape, 16, 3, T, interleaved=interleaved, dtype=dtype)
                    sc = c.scenario("cuda", seed=T + int(interleaved))
                    x, gammas, g = sc.x, sc.gammas, c.geometry
                    one = h200_pdl.one_slot_batch(g, T)
                    ops = sc.sink.operands()
                    ref = reference_forward(ops, x, gammas, one)
                    errs = {}
                    for name, kw in variants.items():
                        out = torch.full_like(x, float("nan"))
                        try:
                            fn = chain(ops, x, gammas, one, out, **kw)
                        except Exception as exc:  # recorded, and the run goes on
                            errs[name] = float("nan")
                            print(f"check {shape} T{T} {name} FAILED: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                            continue
                        h200_pdl.check_contender(name, lambda fn=fn, out=out: (fn(), out)[1], ref, errs, f"{shape} T{T}",
                                                 graph=not name.endswith("_t2"))
                    ok = all(e == e and e < 1e-2 for e in errs.values())
                    rows.append({**c.record(), "rel_err": errs, "ok": ok})
                    print(f"check {shape} T{T} il={interleaved} {dtype}: worst {max(errs.values()):.1e}", flush=True)
    return rows


def sweep(upstream_cls, reps: int, shapes, points=POINTS, variants: dict = VARIANTS) -> list[dict]:
    flushes = {"read": pr.L2Flush("cuda"), "write": pr.L2Flush("cuda", mode="write")}

    def fns_for(sink, ops, x, gammas, batch):
        fns = {"kit": kit(ops, x, gammas, batch, torch.empty_like(x))}
        # pick_tiles' own launches, never the chain: what auto ran at 17-32 tokens before v17 (v17e)
        p = tb.plan(ops, x.shape[0], batch, x.device, tb.pick_tiles(x.shape[0], ops.n * ops.intermediate * ops.hidden,
                                                                      ops.hidden))
        if variants is VARIANTS:
            fns["launches"] = (lambda p=p, out=torch.empty_like(x): tb.launch(ops, x, gammas, p, out))
        for name, kw in variants.items():
            fns[name] = chain(ops, x, gammas, batch, torch.empty_like(x), **kw)
        one = upstream_cls(sink, batch)
        fns["sglang_one_slot"] = lambda: one.forward(x, gammas)
        fns["sglang_base"] = lambda: one.forward(x, gammas, lora=False)  # the no-LoRA forward (target 1)
        return fns

    rows = []
    for shape in shapes:
        base = None
        for R in (16, 64):
            for T, where in points:
                if shape not in where:
                    continue
                base, row = h200_pdl.time_point(pr.Case.of(shape, R, 1, T), fns_for, flushes, reps, base)
                rows.append(row)
                us = row["us"]
                for fl in flushes:
                    up = us.get(f"sglang_one_slot@{fl}", float("nan"))
                    got = {k.split("@")[0]: u for k, u in us.items() if k.endswith("@" + fl)}
                    best = min((k for k in got if not k.startswith("sglang")), key=got.get)
                    print(f"{shape:<11} R{R:<2} T{T:<4} {fl:<5} " + " ".join(f"{k} {u:.1f}" for k, u in got.items())
                          + f"  best {best} {got[best] / up:.3f}x sglang, {got[best] / got['sglang_base']:.3f}x its base",
                          flush=True)
    return rows


def breakdown(upstream_cls, reps: int) -> list[dict]:
    """Each launch of sglang's one-slot chain and of the kit's alone, read flush, at ``BREAKDOWN``."""
    flush, rows = pr.L2Flush("cuda"), []
    for shape, R, T in BREAKDOWN:
        c = pr.Case.of(shape, R, 1, T)
        sc = c.scenario("cuda")
        sink, x, gammas, batch = sc.sink, sc.x, sc.gammas, sc.batch
        ops = sink.operands()
        n, F, H = ops.n, ops.intermediate, ops.hidden
        ga, gb, da, db = ops.buffers
        s = 0
        one = upstream_cls(sink, batch)
        y = torch.mm(x, ops.w13_lin.T)
        sh = torch.mm(x, ga[s, 0].T)
        act = torch.empty(T, n * F, dtype=x.dtype, device="cuda")
        mid = torch.mm(torch.randn_like(act), ops.a_cat[s].T)
        out = torch.empty_like(x)
        lora = tb.Lora(True, sh, gb, da, db, x, R, 1, 0, max(16, R))
        plans = {w: tb.plan(ops, T, batch, x.device, cublas_tiles(T, ops, w)) for w in ("auto", "t2")}
        fns = {"mm_up": lambda: torch.mm(x, ops.w13_lin.T, out=y),
               "mm_shrink_up": lambda: torch.mm(x, ga[s, 0].T, out=sh),
               "addmm_expand": lambda: y.addmm_(sh, ops.w1_delta[s].T),
               "sglang_swiglu": lambda: one.layer._swiglu(y.view(T, n, -1), gammas),
               "mm_down": lambda: torch.mm(act, ops.w2_lin, out=out),
               "addmm_down_base": lambda: out.addmm_(act, ops.w2_lin),
               "mm_shrink_down": lambda: torch.mm(act, ops.a_cat[s].T, out=mid),
               "addmm_down_lora": lambda: out.addmm_(mid, db[s, 0].T),
               "sglang_one_slot": lambda: one.forward(x, gammas),
               "kit": kit(ops, x, gammas, batch, torch.empty_like(x))}
        for w, p in plans.items():  # the activation alone, with the several-slot path's expand, with v36's
            fns[f"up_act_{w}"] = lambda p=p: tb._up(ops, x, y, gammas, act, p, tb.Lora.none(x))
            fns[f"up_act_expand_{w}"] = lambda p=p: tb._up(ops, x, y, gammas, act, p, lora)
            fns[f"expand_act_{w}"] = lambda p=p: tb._expand_act(ops, y, gammas, act, sh, gb, p.tiles, s, 1.0)
        fns["chain"] = chain(ops, x, gammas, batch, torch.empty_like(x), **VARIANTS["chain_t2"])
        graphs = {}
        for k, fn in fns.items():
            try:
                fn()
                graphs[k] = pr.capture(fn)
            except Exception as exc:  # recorded, and the run goes on
                rows.append({"shape": shape, "R": R, "T": T, "launch": k, "failure": f"{type(exc).__name__}: {exc}"[:300]})
                print(f"breakdown {shape} {k} FAILED: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        for k, v in pr.time_interleaved(graphs, flush, reps).items():
            rows.append({"shape": shape, "R": R, "T": T, "launch": k, "us": statistics.median(v)})
            print(f"breakdown {shape:<11} R{R} T{T:<4} {k:<20} {statistics.median(v):7.1f} us", flush=True)
        del graphs, fns
    return rows


MULTI_TOKENS = (128, 512, 2048, 8192)


RUN_TOKENS = 64
"""v36c (``--multi --expand``): the ``EXPAND_RUN_TOKENS`` its ``runs`` contender plans with."""


def forcing(make, **constants):
    """``make()`` (a plan) with ``triton_backend``'s ``constants`` set, then restored."""
    held = {k: getattr(tb, k) for k in constants}
    for k, v in constants.items():
        setattr(tb, k, v)
    try:
        return make()
    finally:
        for k, v in held.items():
            setattr(tb, k, v)


def with_runs(tokens: int, make):
    """``make()`` (a plan) with ``EXPAND_RUN_TOKENS = tokens``."""
    return forcing(make, EXPAND_RUN_TOKENS=tokens)


CATS = dict(SLOT_CAT_TOKENS=1, SLOT_CAT_RANKS=1 << 30, MERGE_RATIO=float("inf"))
"""v37 (``--multi --cats``): the constants its ``cats`` contender plans with (every several-slot batch on the cuBLAS
path takes ``_down_slot_cats``; no merge)."""
NO_MERGE = dict(MERGE_RATIO=float("inf"))
"""v37: ``nomerge``, where the routed plan merges: the same batch on the path it would take without merging."""


DOWN = dict(DOWN_RUN_TOKENS=RUN_TOKENS)
"""v38 (``--multi --down``): the constants its ``down_runs`` contender plans with (``expand_down_kernel`` over the
batch's runs where they average ``RUN_TOKENS``; ``slot_cats`` keeps its points)."""


def path_checks(ops, x, gammas, batch, ref, errs: dict, label: str, name: str, constants: dict, field: str) -> None:
    """A several-slot route planned with ``constants`` (its ``Plan.<field>`` set): on the mixed batch (Triton
    shrinks), and on its tokens in slot order with every token on a slot of rank ``R`` through ``_launch_grouped``,
    each launched twice and replayed from a graph (``<name>_mixed``, ``<name>_epi``, ...)."""
    T = x.shape[0]
    p = forcing(lambda: tb.plan(ops, T, batch, x.device), **constants)
    assert getattr(p, field) is not None and p.tiles.cublas and p.grouped == ""
    h200_pdl.check_contender(f"{name}_mixed", lambda o=torch.empty_like(x): tb.launch(ops, x, gammas, p, o), ref, errs,
                             label)
    if x.is_cuda and ops.dtype != torch.bfloat16:  # the grouped GEMM: bfloat16 on CUDA
        return
    ids = torch.sort(batch.token_slots() % 2).values  # slots 0 and 1, both at rank R, in order
    inorder = SlotBatch.from_token_slots(ids, batch.num_slots, lora_ranks=batch.lora_ranks.tolist(),
                                         scalings=batch.scalings.tolist())
    want = reference_forward(ops, x, gammas, inorder)
    pm = forcing(lambda: tb.plan(ops, T, inorder, x.device), grouped_mode=lambda *a: "epi", **constants)
    assert getattr(pm, field) is not None and pm.grouped == "epi"
    h200_pdl.check_contender(f"{name}_epi", lambda o=torch.empty_like(x): tb.launch(ops, x, gammas, pm, o), want, errs,
                             label)


def runs_checks(ops, x, gammas, batch, ref, errs: dict, label: str) -> None:
    """v36c: the several-slot path with ``expand_act_kernel`` over the batch's runs (``EXPAND_RUN_TOKENS = 1``)
    and over the runs of the same tokens sorted by slot, each launched twice and replayed from a graph."""
    T, S = x.shape[0], ops.buffers[0].shape[0]
    order = torch.argsort(batch.token_slots().long() % (S + 1), stable=True)  # base-only tokens last
    ids = batch.token_slots()[order]
    runs = SlotBatch.from_token_slots(ids, S, lora_ranks=batch.lora_ranks.tolist(),
                                      scalings=batch.scalings.tolist())
    for name, b, xs, gs, want in (("runs_mixed", batch, x, gammas, ref),
                                  ("runs_sorted", runs, x[order.to(x.device)], gammas[order.to(x.device)], None)):
        p = with_runs(1, lambda b=b, xs=xs: tb.plan(ops, T, b, xs.device))
        assert p.act_runs is not None and p.tiles.cublas
        want = reference_forward(ops, xs, gs, b) if want is None else want
        out = torch.empty_like(xs)
        h200_pdl.check_contender(name, lambda p=p, xs=xs, gs=gs, out=out: tb.launch(ops, xs, gs, p, out), want,
                                 errs, label)


def multi_correctness(expand: bool = False, cats: bool = False, down: bool = False) -> list[dict]:
    rows = []
    layouts = [(o, i, d) for o in (1, 2) for i in (True, False) for d in ("bfloat16", "float16")]
    for shape, T in MULTI_CHECKS:
        for o, i, d in layouts:
            c = pr.Case.of(shape, 16, 3, T, outer=o, interleaved=i, dtype=d)
            sc = c.scenario("cuda", seed=T + o)
            x, gammas, g = sc.x, sc.gammas, c.geometry
            ids = torch.randint(-1, g.slots, (T,), generator=torch.Generator().manual_seed(T + o))
            ids[0] = 0
            batch = SlotBatch.from_token_slots(ids, g.slots, lora_ranks=[g.max_rank, g.max_rank, 0],
                                               scalings=[0.7, 1.3, 1.0])
            ops = sc.sink.operands()
            t = tb.plan(ops, T, batch, x.device).tiles
            assert t.cublas
            ref, ref_base = reference_forward(ops, x, gammas, batch), reference_forward(ops, x, gammas, None)
            try:
                errs = h200_pdl.check(ops, x, gammas, batch, t, ref, ref_base, c)
                if expand:
                    runs_checks(ops, x, gammas, batch, ref, errs, f"{shape} T{T} O={o}")
                if cats and o == 1:
                    path_checks(ops, x, gammas, batch, ref, errs, f"{shape} T{T}", "cats", CATS, "cats")
                if down and o == 1:
                    path_checks(ops, x, gammas, batch, ref, errs, f"{shape} T{T}", "down", {"DOWN_RUN_TOKENS": 1},
                                "down_runs")
            except Exception as exc:  # recorded, and the run goes on
                errs = {"failure": float("nan")}
                print(f"check {shape} O={o} FAILED: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            ok = all(e == e and e < 1e-2 for e in errs.values())
            rows.append({**c.record(), "rel_err": errs, "ok": ok})
            print(f"check {shape} T{T} O={o} il={i} {d}: worst {max(errs.values()):.1e}", flush=True)
    return rows


CATS_TOKENS = (512, 2048, 8192)
"""v37 (``--multi --cats``): the token counts it times (where ``CAT_TOKENS`` starts the one-slot ``cats``)."""


def multi_sweep(upstream_cls, reps: int, shapes, expand: bool = False, cats: bool = False,
                down: bool = False, tokens=None) -> list[dict]:
    flushes = {"read": pr.L2Flush("cuda"), "write": pr.L2Flush("cuda", mode="write")}

    def fns_for(sink, ops, x, gammas, batch):
        T = x.shape[0]
        p = tb.plan(ops, T, batch, x.device)
        assert p.tiles.cublas and p.single_slot < 0
        out = torch.empty_like(x)
        multi = upstream_cls(sink, batch, min_slots=2)
        fns = {"kit": lambda: tb.launch(ops, x, gammas, p, out), "sglang_multi": lambda: multi.forward(x, gammas)}
        if expand:  # v36c: the same batch planned with expand_act_kernel over its runs
            pr_ = with_runs(RUN_TOKENS, lambda: tb.plan(ops, T, batch, x.device))
            fns["runs"] = lambda o=torch.empty_like(x): tb.launch(ops, x, gammas, pr_, o)
        if cats:  # v37: the same batch with the down expand as more K (no merge), and without it where p merges
            fns["sglang_base"] = lambda: multi.forward(x, gammas, lora=False)
            pc = forcing(lambda: tb.plan(ops, T, batch, x.device), **CATS)
            fns["cats"] = lambda o=torch.empty_like(x): tb.launch(ops, x, gammas, pc, o)
            if p.grouped == "merge":
                pn = forcing(lambda: tb.plan(ops, T, batch, x.device), **NO_MERGE)
                fns["nomerge"] = lambda o=torch.empty_like(x): tb.launch(ops, x, gammas, pn, o)
        if down:  # v38: the down expand over the runs
            fns["sglang_base"] = lambda: multi.forward(x, gammas, lora=False)
            pd = forcing(lambda: tb.plan(ops, T, batch, x.device), **DOWN)
            if pd.down_runs is not None:
                fns["down_runs"] = lambda o=torch.empty_like(x): tb.launch(ops, x, gammas, pd, o)
        return fns

    rows = []
    for shape in shapes:
        base = None
        for R in (16, 64):
            for S in (4, 8):
                for T in tokens or (CATS_TOKENS if cats or down else MULTI_TOKENS):
                    g = pr.Case.of(shape, R, S, T).geometry
                    if not tb.pick_tiles(T, g.n * g.intermediate * g.hidden, g.hidden).cublas:
                        continue  # A at 128 tokens: the weight-streaming launches
                    base, row = h200_pdl.time_point(pr.Case.of(shape, R, S, T), fns_for, flushes, reps, base)
                    rows.append(row)
                    us = row["us"]
                    print(f"{shape:<11} R{R:<2} S{S} T{T:<4} " + " ".join(f"{k} {u:.1f}" for k, u in us.items())
                          + " kit/multi {:.3f} {:.3f}".format(*(us[f"kit@{f}"] / us[f"sglang_multi@{f}"]
                                                              for f in flushes)), flush=True)
    return rows


def print_against_kit(points: list[dict], contender: str, flush: str) -> None:
    """One line: ``contender``'s time over ``kit``'s at the points where it was timed, and at how many it was ahead."""
    got = [r["us"][f"{contender}@{flush}"] / r["us"][f"kit@{flush}"] for r in points if f"{contender}@{flush}" in r["us"]]
    print(f"  {contender}: {min(got, default=0):.3f}-{max(got, default=0):.3f}x kit, ahead at "
          f"{sum(g < 1 for g in got)} of {len(got)}", flush=True)


def main() -> int:
    ap = h200_pdl.run_arguments(__doc__, pr.SIDE_SHAPES)
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--multi", action="store_true", help="only the multi-slot cuBLAS path (v17b)")
    ap.add_argument("--expand", action="store_true", help="v36: the chain's activation tiles (EXPAND_VARIANTS at "
                    "EXPAND_POINTS, or --tokens); with --multi, v36c's runs")
    ap.add_argument("--cats", action="store_true", help="with --multi, v37: the down expand as more of the down "
                    "GEMM's K (CATS) beside the routed path, and sglang's base")
    ap.add_argument("--down", action="store_true", help="with --multi, v38: the down expand over the batch's runs "
                    "(DOWN) beside the routed path, and sglang's base")
    ap.add_argument("--tokens", default="", help="token counts: the one-slot sweep (with --multi, the several-slot "
                    "one) at these, on every shape of --shapes, instead of POINTS (v17c: A at 33-128 tokens; v17d: "
                    "34-47 on A, 2-16 elsewhere; v17e: 17-32)")
    args = ap.parse_args()
    from inkling_lab.upstream_wheel import UpstreamSink

    t0 = time.time()
    variants = EXPAND_VARIANTS if args.expand else VARIANTS
    rec = h200_pdl.record_head(h200_pdl.run_environment(), args.wheel, variants=variants)
    if args.multi:
        h200_pdl.record_checks(rec, multi_correctness(args.expand, args.cats, args.down), args.out)
        rec["points"] = multi_sweep(UpstreamSink, args.reps, args.shapes.split(","), args.expand, args.cats, args.down,
                                    [int(T) for T in args.tokens.split(",")] if args.tokens else None)
        rec["seconds"] = round(time.time() - t0, 1)
        records.write_json(args.out, rec)
        for fl in ("read", "write"):
            wins = sum(1 for r in rec["points"] if r["us"][f"kit@{fl}"] < r["us"]["sglang_multi@" + fl])
            print(f"{fl}: points faster than sglang's multi-slot path (of {len(rec['points'])}):", wins)
            if args.cats:
                for k in ("kit", "cats"):
                    near = sum(1 for r in rec["points"] if r["T"] >= 2048
                               and r["us"].get(f"{k}@{fl}", 1e9) <= 1.1 * r["us"]["sglang_base@" + fl])
                    print(f"  {k}: within 1.1x of the base at {near} of the T >= 2048 points", flush=True)
            for k, on in (("runs", args.expand), ("down_runs", args.down), ("cats", args.cats)):
                if on:
                    print_against_kit(rec["points"], k, fl)
        print(f"{rec['seconds']} s")
        return 0
    h200_pdl.record_checks(rec, correctness(variants), args.out, t0)
    if args.breakdown:
        rec["breakdown"] = breakdown(UpstreamSink, args.reps)
        records.write_json(args.out, rec)
    shapes = args.shapes.split(",")
    points = [(int(T), tuple(shapes)) for T in args.tokens.split(",")] if args.tokens else \
        EXPAND_POINTS if args.expand else POINTS
    rec["points"] = sweep(UpstreamSink, args.reps, shapes, points, variants)
    rec["seconds"] = round(time.time() - t0, 1)
    records.write_json(args.out, rec)
    for fl in ("read", "write"):
        wins = {k: sum(1 for r in rec["points"] if r["us"].get(f"{k}@{fl}", 1e9) < r["us"]["sglang_one_slot@" + fl])
                for k in ["kit", "launches", *variants]}
        print(f"{fl}: points faster than sglang's one-slot path (of {len(rec['points'])}):", wins)
        if args.expand:  # v36: each tile against the routed one, and within 1.1x of the base
            for k in variants:
                gain = [r["us"][f"{k}@{fl}"] / r["us"][f"routed@{fl}"] for r in rec["points"]
                        if f"{k}@{fl}" in r["us"] and f"routed@{fl}" in r["us"]]
                near = sum(1 for r in rec["points"] if r["us"].get(f"{k}@{fl}", 1e9) <= 1.1 * r["us"]["sglang_base@" + fl])
                print(f"  {k}: {min(gain, default=0):.3f}-{max(gain, default=0):.3f}x routed, "
                      f"within 1.1x of the base at {near}", flush=True)
    print(f"{rec['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
