"""v16 on a CUDA GPU: the swap-AB launches for 2-32 tokens (``Tiles.swap``:
``swap_kernels.swap_up_kernel``, ``swap_down_kernel``, after the unchanged shrink) against the
backend's three launches (``triton_v13``: what ``pick_tiles`` gives 2-32 tokens without them,
PDL as ``plan`` sets it), sglang 0.5.23's no-LoRA base taken from its wheel, and the stream
ceiling (``h200_stream_ceiling.json``).

1. Correctness first, against the float64 reference on fresh random inputs (``h200_pdl.check``:
   bf16 and fp16, both gate/up layouts, both outer layouts, mixed / base-only / rank-0 tokens,
   no adapter, a device-resident batch, graph replays; the output poisoned with NaN).
2. The sweep: R 64 S 4 at T = 8 and 32 per shape, every candidate (and two as the bare
   stream: no adapter) as graphs taking turns with ``triton_v13`` and ``sglang_base`` (read
   flush), medians.
3. The grid: every T = 8 and 32 point of the side-by-side grid (R 16/64, S 1/4/8) with the
   sweep's winner for that shape and T, both flushes; then T = 2 and 16 at R 64 S 4.

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=. python3 scripts/gpu/h200_swap.py --wheel WHEEL --out $OUT/h200_swap.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

import h200_pdl  # this folder's: check(), the correctness matrix's pieces, CEILING
from h200_gemv import time_point
from inkling_lab import profile as pr, records
from inkling_lab.batch import SlotBatch
from inkling_lab.forward import triton_backend as tb
from inkling_lab.forward.reference import reference_forward

CANDIDATES = {
    "f16k256s4": dict(bf=16, bk=256, bn=16, dk=256, stages=4),
    "f16k256s4p": dict(bf=16, bk=256, bn=16, dk=256, stages=4, pdl=True),
    "f32k128s4": dict(bf=32, bk=128, bn=32, dk=128, stages=4),
    "f32k256s4": dict(bf=32, bk=256, bn=16, dk=256, stages=4),
}
"""``swap_tiles`` candidates: features per up program (``2*bf`` rows of ``w13``), K step,
``w2`` rows per down program, its K step, pipeline depth; ``p``: PDL. (The first run,
``history/h200_swap_v16a.json``, also swept ``bk`` 128 at 6 stages, ``bk`` 512 at 3 and 8
warps: each slower than ``f16k256s4`` at every shape and T.) On the grid the winner without
PDL runs with PDL where ``use_pdl`` turns it on for the three launches."""
STREAMED = ("f16k256s4",)
"""Candidates also timed without an adapter: the two swap-AB launches alone."""
SWEEP_TOKENS = (8, 32)


def swap(name: str, T: int, batch=None, ops=None) -> tb.Tiles:
    """Candidate ``name`` for ``T`` tokens: the token tile 16 up to 16 tokens, else 32; given
    ``batch`` and ``ops``, PDL where ``use_pdl`` turns it on for the three launches."""
    t = tb.swap_tiles(bm=16 if T <= 16 else 32, **CANDIDATES[name])
    if ops is None:
        return t
    slots = 0 if batch is None else len(batch.active_slots())
    return replace(t, pdl=tb.use_pdl(T, ops.n * ops.intermediate * ops.hidden, slots))


def three_launches(ops, batch, T: int) -> tb.Tiles:
    """What ``pick_tiles`` and ``plan`` give ``T`` tokens on the three launches (PDL where
    ``use_pdl`` turns it on)."""
    elems = ops.n * ops.intermediate * ops.hidden
    slots = 0 if batch is None else len(batch.active_slots())
    return replace(tb.pick_tiles(T, elems), pdl=tb.use_pdl(T, elems, slots))


def correctness(variant: str) -> list[dict]:
    rows = []
    layouts = [(o, i, d) for o in (1, 2) for i in (True, False) for d in ("bfloat16", "float16")]
    for shape in pr.SHAPES:
        for o, i, d in layouts if shape == "A" else layouts[:1] + layouts[-1:]:
            for T in (8,) if shape == "A" else (32,):
                c = pr.Case.of(shape, 16, 3, T, outer=o, interleaved=i, dtype=d)
                sc = c.scenario("cuda", seed=T)
                x, gammas, g = sc.x, sc.gammas, c.geometry
                ids = torch.randint(-1, g.slots, (T,), generator=torch.Generator().manual_seed(T + 7))
                ids[0] = 0
                batch = SlotBatch.from_token_slots(ids, g.slots, lora_ranks=[g.max_rank, g.max_rank, 0])  # slot 2: rank 0
                ops = sc.sink.operands()
                ref, ref_base = reference_forward(ops, x, gammas, batch), reference_forward(ops, x, gammas, None)
                try:
                    errs = h200_pdl.check(ops, x, gammas, batch, swap(variant, T), ref, ref_base, c)
                except Exception as exc:  # recorded, and the run goes on
                    errs = {"failure": float("nan")}
                    print(f"check {shape} T={T} FAILED: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                ok = all(e == e and e < 1e-2 for e in errs.values())
                rows.append({**c.record(), "variant": variant, "rel_err": errs, "ok": ok})
                print(f"check {shape} T={T} O={o} il={i} {d}: worst {max(errs.values()):.1e}", flush=True)
    return rows


def fns(names, upstream_cls, streamed=STREAMED, pdl_rule=False):
    def fns_for(sink, ops, x, gammas, batch):
        T = x.shape[0]
        out = {}
        for label, b, tiles in [("triton_v13", batch, three_launches(ops, batch, T))] \
                + [(v, batch, swap(v, T, *((batch, ops) if pdl_rule else ()))) for v in names] + [(v + "_stream_base", None, swap(v, T)) for v in streamed
                                                             if v in names]:
            p, o = tb.plan(ops, T, b, x.device, tiles), torch.empty_like(x)
            out[label] = (lambda p=p, o=o: tb.launch(ops, x, gammas, p, o))
        up = upstream_cls(sink, batch, min_slots=2)
        out["sglang_base"] = lambda: up.forward(x, gammas, lora=False)
        return out
    return fns_for


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheel", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--shapes", default=",".join(pr.SHAPES))
    ap.add_argument("--budget-s", type=float, default=330.0, help="stop starting new points past this many seconds")
    args = ap.parse_args()
    from inkling_lab.upstream_wheel import UpstreamSink, unpack

    t0 = time.time()
    env = records.environment("python3 " + " ".join(sys.argv))
    ceilings = pr.measure_ceilings()
    print(env, ceilings, flush=True)
    rec = {"environment": env, "ceilings": ceilings, "candidates": CANDIDATES,
           "upstream": unpack(args.wheel, Path.home() / ".cache" / "inkling_lab" / "sglang-0.5.23")}
    rec["correctness"] = correctness("f16k256s4")
    if not all(r["ok"] for r in rec["correctness"]):
        print("correctness FAILED: no timing", flush=True)
        records.write_json(args.out, rec)
        return 1
    records.write_json(args.out, rec)
    print(f"correctness: {sum(r['ok'] for r in rec['correctness'])}/{len(rec['correctness'])} ok, {time.time() - t0:.0f} s",
          flush=True)
    ceiling = {r["shape"]: r["us"]["stream"]
               for r in json.loads(Path("data/profiles/h200_stream_ceiling.json").read_text())["rows"]}
    read, write = pr.L2Flush("cuda"), pr.L2Flush("cuda", mode="write")
    shapes = args.shapes.split(",")
    rec["sweep"], best, bases = [], {}, {}
    for shape in shapes:
        for T in SWEEP_TOKENS:
            bases[shape], row = time_point(pr.Case.of(shape, 64, 4, T), fns(CANDIDATES, UpstreamSink), read, args.reps,
                                           bases.get(shape))
            row["stream_ceiling_us"] = ceiling[h200_pdl.CEILING[shape]]
            rec["sweep"].append(row)
            us = row["us"]
            best[shape, T] = min((v for v in CANDIDATES if v in us), key=us.get, default="f16k256s4")
            print(f"sweep {shape:<11} T{T:<2} " + " ".join(f"{k} {v:.1f}" for k, v in us.items())
                  + f"  best {best[shape, T]}", flush=True)
        records.write_json(args.out, rec)
    rec["best"] = {f"{s} {T}": v for (s, T), v in best.items()}
    rec["points"] = []
    # shapes innermost: a run cut short by the budget still has every shape
    grid = [(shape, R, S, T) for T in (8, 32) for R in (64, 16) for S in (4, 1, 8) for shape in shapes] \
        + [(shape, 64, 4, T) for T in (2, 16) for shape in shapes]
    for shape, R, S, T in grid:
        if time.time() - t0 > args.budget_s:
            print("budget reached: the rest of the grid not timed", flush=True)
            break
        v = best[shape, 8 if T <= 8 else 32].removesuffix("p")
        bases[shape], row = time_point(pr.Case.of(shape, R, S, T), fns((v,), UpstreamSink, streamed=(), pdl_rule=True), read, args.reps,
                                       bases.get(shape), more_flushes=(write,))
        row.update(us={"read": row["us"], "write": row.pop("us_write")}, swap_config=v,
                   stream_ceiling_us=ceiling[h200_pdl.CEILING[shape]],
                   roofline_us=pr.roofline(pr.Case.of(shape, R, S, T), **ceilings).us)
        rec["points"].append(row)
        us = row["us"]["read"]
        print(f"{shape:<11} R{R:<2} S{S} T{T:<2} " + " ".join(f"{k} {u:6.1f}" for k, u in us.items())
              + f"  swap/base {us.get(v, float('nan')) / us['sglang_base']:.2f} write "
              + f"{row['us']['write'].get(v, float('nan')) / row['us']['write']['sglang_base']:.2f}", flush=True)
        records.write_json(args.out, rec)
    rec["seconds"] = round(time.time() - t0, 1)
    records.write_json(args.out, rec)
    pts = rec["points"]
    for mode in ("read", "write"):
        for label in ("swap", "triton_v13"):
            def us(r, label=label):
                return r["us"][mode].get(r["swap_config"] if label == "swap" else label, float("inf"))
            wins = sum(1 for r in pts if r["T"] in (8, 32) and us(r) < r["us"][mode]["sglang_base"])
            print(f"{mode}: {label} faster than sglang's base at {wins} of {sum(r['T'] in (8, 32) for r in pts)} T=8/32 points;"
                  f" swap faster than triton_v13 at {sum(1 for r in pts if us(r, 'swap') < us(r, 'triton_v13'))}")
    for shape in shapes:
        fr = [r["stream_ceiling_us"] / r["us"]["read"][r["swap_config"]] for r in pts
              if r["shape"] == shape and r["swap_config"] in r["us"]["read"]]
        if fr:
            print(f"{shape:<11} swap stream-ceiling fraction {min(fr):.2f}-{max(fr):.2f}")
    print(f"{rec['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
