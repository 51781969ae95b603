"""v25 and v26 on a CUDA GPU (issue 26 target 1): a few tokens of one slot in two steps (``act_down.py``
beside this file) where the kit and sglang's base take three:

* the kept copies (``act_down.kept_forward``), the activation folded into the down GEMM's K loop
  (``act_down_<tiles>``: cuBLAS's ``y = x @ w13_s.T`` on the slot's copy, then ``act_down_kernel``) or into
  the up GEMM's epilogue (``up_act_<tiles>``: ``up_act_kernel``, then cuBLAS's down GEMM; v26 adds tiles
  whose ``H`` is split over 2-8 programs, ``x<split>``), beside the kept copies through today's three
  launches (``kept``: cuBLAS, the activation kernel, cuBLAS);
* the pool's LoRA with nothing kept (``slot_down_<tiles>``: ``act_down.slot_forward``, cuBLAS's ``y`` with
  the shrink beside it, then ``act_down_kernel`` with the expand, the activation, the down GEMM and the down
  LoRA in one launch), beside the kit's default path (``kit``);

and sglang 0.5.23's no-LoRA base (``forward_with_lora`` of ``srt/lora/trtllm_lora_temp/inkling_dense.py`` with no
active adapter: cuBLAS, ``InklingBatchDenseMLP._swiglu``'s ``silu_and_mul_triton`` from
``sglang/kernels/ops/moe/inkling_moe.py``, cuBLAS; ``upstream_wheel.UpstreamSink``), at one slot, 2, 8, 16, 32 and 64 tokens,
every shape, both flushes; R 16 for everything (the copies carry no rank), R 64 for ``kit`` and the slot fold.
Each fold is swept over its tiles (``VARIANTS``; the folds ``SWEPT``). The run decides what is routed
(KERNEL_NOTES.md v25, v26). Every contender is checked against the float64 reference at each point
(``h200_pdl.time_point``) and, first, launched twice and replayed from a graph twice into NaN-poisoned
outputs (A and TP8, both gate/up layouts, bfloat16 and float16, 2, 9 and 32 tokens).

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=.:scripts/gpu:experiments/act_down \
        python3 experiments/act_down/h200_act_down.py --wheel WHEEL --out $OUT/h200_act_down.json \\
        [--folds down,up,slot] [--shapes Inkling-TP8]
"""
from __future__ import annotations

import argparse
import sys

import torch

import act_down as ad  # beside this file: the kernel and its two-launch forward
import h200_pdl  # scripts/gpu's: time_point, kept_plan, sweep_main

from inkling_lab import profile as pr
from inkling_lab.batch import SlotBatch
from inkling_lab.forward import triton_backend as tb
from inkling_lab.forward.reference import reference_forward

TOKENS = (2, 8, 16, 32, 64)
KEPT_RANK = 16
"""The rank of the points that time the kept copies too (they carry no rank); at rank 64 only the kit and
the slot fold run."""
VARIANTS = {
    "down": {"h64k128s4": dict(bh=64, bk=128, stages=4), "h64k128s6": dict(bh=64, bk=128, stages=6),
             "h64k256s3": dict(bh=64, bk=256, stages=3), "h32k128s4": dict(bh=32, bk=128, stages=4),
             "h128k128s4w8": dict(bh=128, bk=128, stages=4, warps=8), "h64k64s6": dict(bh=64, bk=64, stages=6)},
    "up": {"f32k128s4": dict(bh=32, bk=128, stages=4), "f32k256s3": dict(bh=32, bk=256, stages=3),
           "f64k128s4": dict(bh=64, bk=128, stages=4), "f64k256s2w8": dict(bh=64, bk=256, stages=2, warps=8),
           "f64k128s4x2": dict(bh=64, bk=128, stages=4, split=2), "f64k128s4x4": dict(bh=64, bk=128, stages=4, split=4),
           "f64k128s4x8": dict(bh=64, bk=128, stages=4, split=8), "f32k128s4x4": dict(bh=32, bk=128, stages=4, split=4)},
    "slot": {"h64k64s3": dict(bh=64, bk=64, stages=3), "h64k128s2": dict(bh=64, bk=128, stages=2),
             "h128k64s3w8": dict(bh=128, bk=64, stages=3, warps=8)}}
"""``act_down.tiles``' arguments tried for each fold (``down`` and ``slot``: ``h<rows of the down weight>k<step>
s<stages>[w<warps>]``; ``up``: ``f<features>k<step of H>s<stages>[w<warps>][x<split>]``)."""
SWEPT = ("up",)
"""The folds a run sweeps by default (``--folds``). v25's run (``data/profiles/h100_act_down.json``, commit 4e6ef03)
swept ``down``, ``up`` (without the split tiles) and ``slot``: ``down`` and ``slot`` lost at every point; v26's
(commit 84b7f71, ``h100_act_down_v26.log``; at the TP-8 slice a115e0d, ``h100_act_down_v26_tp8.json``) ``up``
with its split tiles and ``slotup``, a slot fold since removed (KERNEL_NOTES.md v26)."""
FIRST = {fold: next(iter(v)) for fold, v in VARIANTS.items()}
"""The tiles of each fold the correctness pass runs."""
PREFIX = {"down": "act_down", "up": "up_act", "slot": "slot_down"}


def name(fold: str, tiles: str) -> str:
    """The contender's name in the record: ``act_down_<tiles>``, ``up_act_<tiles>`` (the kept copies) or
    ``slot_down_<tiles>`` (the pool's LoRA, nothing kept)."""
    return f"{PREFIX[fold]}_{tiles}"


def _tiles(T: int, v: dict) -> "ad.Tiles":
    return ad.tiles(T, **v)


def contenders(sink, x, gammas, batch, variants=None) -> dict:
    """``kit`` on the pool with nothing kept and each ``slot`` variant (``act_down.slot_forward``, the batch's
    one slot at its scaling), then,
    where ``variants`` (default: the ``SWEPT`` folds') has a kept fold, every slot kept at the batch's
    scalings and the batch forced onto the copies (``h200_pdl.kept_plan``): ``kept`` on today's three
    launches, and each kept fold's two launches on the same copies for each of its ``variants``."""
    variants = {f: VARIANTS[f] for f in SWEPT} if variants is None else variants
    sink.keep_merged(None)
    ops = sink.operands()
    T = x.shape[0]
    p = tb.plan(ops, T, batch, x.device)
    scalings = batch.scalings.to(device=x.device, dtype=torch.float32)
    fns = {"kit": lambda out=torch.empty_like(x): tb.launch(ops, x, gammas, p, out)}
    for key, v in variants.get("slot", {}).items():
        fns[name("slot", key)] = lambda out=torch.empty_like(x), t=_tiles(T, v): ad.slot_forward(
            ops, x, gammas, p.single_slot, scalings, out, t)
    if not set(variants) - {"slot"}:
        return fns
    kept_ops, k = h200_pdl.kept_plan(tb, sink, p, x, batch)
    fns["kept"] = lambda out=torch.empty_like(x): tb._launch_merged(kept_ops, x, gammas, k, out)
    for fold in ("down", "up"):
        for key, v in variants.get(fold, {}).items():
            t = _tiles(T, v)
            fns[name(fold, key)] = lambda out=torch.empty_like(x), t=t, fold=fold, w=ad.workspace(
                kept_ops, T, t, x.device): ad.kept_forward(kept_ops, x, gammas, k.merge_rows[0], out, t, fold, w)
    return fns


def correctness() -> list[dict]:
    rows = []
    for shape in ("A", "Inkling-TP8"):
        for interleaved in (True, False):
            for dtype in ("bfloat16", "float16"):
                for T in (2, 9, 32):
                    c = pr.Case.of(shape, 16, 1, T, interleaved=interleaved, dtype=dtype)
                    sc = c.scenario("cuda", seed=7 + T + int(interleaved))
                    batch = SlotBatch.from_segments([T], [0], 1, lora_ranks=[16], scalings=[1.4])
                    ref = reference_forward(sc.sink.operands(), sc.x, sc.gammas, batch)
                    fns = contenders(sc.sink, sc.x, sc.gammas, batch, {f: {t: VARIANTS[f][t]} for f, t in FIRST.items()
                                                                      if f in SWEPT})
                    rows.append(h200_pdl.checked_row(c, fns, ref, f"{shape} il={interleaved} {dtype} T{T}"))
    return rows


def sweep(upstream_cls, reps: int, shapes) -> list[dict]:
    def fns(sink, x, gammas, batch):
        kept = int(batch.lora_ranks.max()) == KEPT_RANK
        return contenders(sink, x, gammas, batch, {f: VARIANTS[f] for f in SWEPT if kept or f.startswith("slot")})

    return h200_pdl.timed_cases(((f"{shape:<11} R{R} T{T:<3}", pr.Case.of(shape, R, 1, T))
                                 for shape in shapes for R in (KEPT_RANK, 64) for T in TOKENS), fns, upstream_cls, reps)


REPLACES = {"down": "kept", "up": "kept", "slot": "kit"}
"""The path each fold would take the place of if routed: the kept copies' three launches, or the kit's default."""


def best(row: dict, fold: str, flush: str) -> tuple[str, float] | None:
    """The fastest of ``fold``'s tiles at one point of the record under ``flush``: ``(contender, µs)``, or
    ``None`` where none of them ran (or all failed their check)."""
    got = [(k, u) for k, u in ((name(fold, t), row["us"].get(f"{name(fold, t)}@{flush}")) for t in VARIANTS[fold])
           if u is not None]
    return min(got, key=lambda g: g[1]) if got else None


def decide(points: list[dict], flushes=("read", "write")) -> dict:
    """What the record says to route, per fold: ``ahead``, every ``(shape, R, T)`` where the fold's best tile
    beat the path it replaces (``REPLACES``) under every flush, with both times and sglang's base;
    ``up_to``, per shape, the largest token count up to which it was ahead at every timed T of that shape (and
    rank: the smaller of the two); ``under_base``, the points where it beat sglang's base under every flush."""
    out = {}
    for fold, rival in REPLACES.items():
        if fold not in SWEPT:
            continue
        ahead, under, by_shape = [], [], {}
        for r in points:
            mine = [best(r, fold, fl) for fl in flushes]
            theirs = [r["us"].get(f"{rival}@{fl}") for fl in flushes]
            if any(m is None for m in mine) or any(t is None for t in theirs):
                continue
            key = (r["shape"], r["R"], r["T"])
            won = all(m[1] < t for m, t in zip(mine, theirs))
            by_shape.setdefault((r["shape"], r["R"]), []).append((r["T"], won))
            if won:
                ahead.append({"point": key, "tiles": mine[0][0], "us": mine[0][1], rival: theirs[0],
                              "sglang_base": r["us"][f"sglang_base@{flushes[0]}"]})
            if all(m[1] < r["us"][f"sglang_base@{fl}"] for m, fl in zip(mine, flushes)):
                under.append(key)
        up_to = {}
        for (shape, _), series in by_shape.items():
            reach = 0
            for T, won in sorted(series):
                if not won:
                    break
                reach = T
            up_to[shape] = min(up_to.get(shape, reach), reach)
        out[fold] = {"ahead": ahead, "up_to": up_to, "under_base": under}
    return out


def main() -> int:
    global SWEPT
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--folds", help=f"comma-separated of {','.join(VARIANTS)} (default {','.join(SWEPT)})")
    known, sys.argv[1:] = pre.parse_known_args()
    SWEPT = tuple(known.folds.split(",")) if known.folds else SWEPT
    names = ("kit", "kept", *(name(f, t) for f in SWEPT for t in VARIANTS[f]))  # kept ones: R 16 only
    rec = h200_pdl.sweep_main(__doc__, names, correctness, None, sweep)
    for fl in ("read", "write"):
        under = {k: sum(1 for r in rec["points"] if r["us"].get(f"{k}@{fl}", float("inf"))
                        < r["us"][f"sglang_base@{fl}"]) for k in names}  # of the points each contender ran at
        print(f"{fl}: under the base (of {len(rec['points'])}): {under}", flush=True)
    for fold, d in decide(rec["points"]).items():
        print(f"{fold}: ahead of {REPLACES[fold]} at {len(d['ahead'])} points, up to {d['up_to']} tokens per shape; "
              f"under sglang's base at {len(d['under_base'])}: {d['under_base']}", flush=True)
    print(f"{rec['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
