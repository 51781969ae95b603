"""The one-launch kernel (``experiments/single_launch/single_launch.py``, v12) on a CUDA GPU:
correctness, a small sweep of candidates, then the few-token grid against the
three-launch triton backend and the cuBLAS base.

1. Correctness against the float64 reference, bf16 and fp16, both gate/up layouts,
   both outer layouts, mixed / base-only / rank-0 tokens, output poisoned with NaN, the
   launch captured in a CUDA graph and replayed twice (the workspace must come back
   zero); then the same case under each candidate schedule the interpreter cannot test
   concurrently (7 programs for hundreds of tasks, one program per task, lag 0, the
   register cap, the back-off); any failure is recorded and makes the exit status 1.
2. Sweep: each candidate (``CANDIDATES``: changes to ``pick_config``'s choice for the
   shape) at R 64, S 4, T 1 and 32 per shape, its output checked against the triton
   backend's; the fastest correct one per (shape, token tile) runs the grid (``sweep``
   in the record says which won, with each candidate's grid size and lag).
3. Grid: shapes A, B, Inkling and Inkling-TP8 x R 16, 64 x S 1, 4, 8 x T 1, 8, 32:
   ``single`` (this kernel), ``triton`` (the three-launch backend) and ``cublas_base``
   (the base sink alone through cuBLAS, no LoRA work), each a CUDA graph replayed with
   the L2 flushed before every replay (``profile.time_graph``), the three timed one after
   another at each point; ``single``'s output checked against ``triton``'s at every
   point. Each point carries its roofline (``profile.roofline``, the run's own ceilings)
   and the version's prediction made before the run (``predicted_us``, KERNEL_NOTES.md, where one
   was written), besides v10's ``model_us`` = bytes / copy bandwidth + ``FIXED_US``.

The record has ``version`` (the kernel's design version) and ``compiled`` (registers,
spills, shared memory and programs per multiprocessor of every variant launched).

    cd .gpu_stage && PYTHONPATH=. timeout 400 python3 experiments/single_launch/h200_single_launch.py --out $OUT/h200_single_launch.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import asdict, replace

import torch
import triton

from inkling_lab import profile as pr, records
import single_launch as sl  # this folder (the script's own, first on sys.path)
from inkling_lab.forward.reference import reference_forward
from inkling_lab.geometry import Geometry
from inkling_lab.scenario import Scenario

SHAPES = {"A": (2, 1536, 768), "B": (2, 4096, 2048), "inkling": (2, 6144, 3072), "inkling-tp8": (2, 6144, 384)}
RANKS, SLOTS, TOKENS = (16, 64), (1, 4, 8), (1, 8, 32)
CANDIDATES = {  # changes to pick_config's choice for the shape (at most 6: the run must stay under 5 minutes)
    "v12": {},                                 # one program per task, every up task first (v11's sweep winners)
    "v11": dict(persistent=True, lag=-1),      # v11's default: persistent grid, down chunks interleaved
    "phased": dict(persistent=True),           # persistent grid, every up task first (v11's sweep winner at most points)
    "kc_other": None,                          # the other chunk size (256 <-> 512): atomics vs dependency grain
    "kc_whole": "whole",                       # one chunk per expert: the fewest out_acc atomics
}
PREDICTED_US = {  # v12's prediction before its run (KERNEL_NOTES.md), R 64, S 4
    ("A", 1): 22.0, ("A", 32): 31.0, ("B", 1): 43.0, ("B", 32): 62.0,
    ("inkling", 1): 82.0, ("inkling", 32): 100.0, ("inkling-tp8", 1): 31.0, ("inkling-tp8", 32): 43.0,
}
CHECK_SCHEDULES = {"programs7": dict(programs=7, persistent=True), "persistent": dict(persistent=True),
                   "interleaved_down": dict(persistent=True, lag=-1), "lag0": dict(lag=0),
                   "r128": dict(maxnreg=128), "sleep": dict(persistent=True, sleep_ns=100)}
"""Schedules checked on the GPU beyond the default (shape A, bf16, interleaved, shared outer):
real concurrency, which Triton's interpreter (one program after another) never shows."""
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 3e-3}
"""Max-norm relative error allowed against float64 (the triton backend reaches ~4e-3 bf16, ~4e-4 fp16)."""
FIXED_US = 3.0
"""The prediction's fixed cost of one launch (``model_us``): ~2 us of graph launch, fill and
drain, ~1 us for the two device-wide waits (shrink -> activation, up -> down)."""
DEVICE = "cuda"
BUDGET_S, GRID_BUDGET_S = 200, 280
"""Past these many seconds the sweep stops trying candidates and the grid stops (recorded as
``truncated``): the run must stay under 5 minutes, compiling included."""


def finish_or_exit(what: str, seconds: float = 30.0) -> None:
    """Wait for the device, but give up after ``seconds``: a task waiting on a counter that
    never fills would spin forever and hold the GPU for the rest of the lease. Exiting
    the process tears the context down and the kernel with it."""
    done = torch.cuda.Event()
    done.record()
    deadline = time.time() + seconds
    while not done.query():
        if time.time() > deadline:
            print(f"HANG: {what} did not finish in {seconds:.0f} s; exiting", flush=True)
            os._exit(3)
        time.sleep(0.005)


def graph_of(fn):
    """``fn`` captured in a CUDA graph (warmed up on a side stream first, as ``time_graph`` does)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def config_for(ops, T: int, change: dict | str | None) -> sl.SingleConfig:
    """``pick_config``'s choice with ``change`` applied (``None``: the other chunk size;
    ``"whole"``: one chunk per expert, ``kc`` the power of two at or above ``F``)."""
    base = sl.pick_config(ops, T)
    if change is None:
        return replace(base, kc=512 if base.kc == 256 else 256)
    if change == "whole":
        return replace(base, kc=max(base.kc, triton.next_power_of_2(ops.intermediate)))
    return replace(base, **change)


def check_case(shape: str, dtype: torch.dtype, interleaved: bool, outer: int, schedule: str) -> dict:
    """One correctness case at 13 tokens (mixed slots, base-only tokens, a rank-0 slot whose
    buffers are not zero), R 16, S 3: an eager launch, then two graph replays."""
    n, H, F = SHAPES[shape]
    g = Geometry(n=n, hidden=H, intermediate=F, max_rank=16, slots=3, outer=outer)
    slots_t = [0, 0, 0, -1, -1, 2, 2, 2, 2, 1, 1, 0, -1]
    sc = Scenario.random(g, tokens=len(slots_t), seed=7, dtype=dtype, device=DEVICE,
                         interleaved=interleaved, adapters=[16, 0, 9], token_slots=slots_t)
    # The rank-0 slot keeps non-zero buffers: the kernel must skip it.
    ops = sc.operands()
    ops.buffers[0][1].normal_()
    ref = reference_forward(ops, sc.x, sc.gammas, sc.batch)
    base = reference_forward(ops, sc.x, sc.gammas, None)
    T = sc.x.shape[0]
    config = config_for(ops, T, CHECK_SCHEDULES.get(schedule, {}))
    ws = sl.make_workspace(ops, T, config)
    slots, scalings = sl.device_slots(sc.batch, T, DEVICE)
    out = torch.full_like(sc.x, float("nan"))
    sl.launch_single(ops, sc.x, sc.gammas, slots, scalings, out, ws)  # compile, run once eagerly
    finish_or_exit(f"the first launch ({shape}, {dtype}, interleaved={interleaved}, O={outer}, {schedule})", 120)
    graph = graph_of(lambda: sl.launch_single(ops, sc.x, sc.gammas, slots, scalings, out, ws))
    errs = []
    for _ in range(2):
        out.fill_(float("nan"))
        graph.replay()
        finish_or_exit("a graph replay")
        errs.append(records.relative_error(out, ref))
    clean = ws.clean()
    err = max(errs)
    return dict(rel_error=err, lora_effect=records.relative_error(base, ref), workspace_clean=clean,
                plan=sl.schedule(ops, ws, T, True, 3), ok=bool(err < TOLERANCE[dtype] and clean))


def check_correctness() -> list[dict]:
    """Shape A and Inkling-TP8, every dtype/layout/outer combination (``check_case``); then
    shape A (bf16, interleaved, shared outer) under each of ``CHECK_SCHEDULES``. A case that
    raises (a compile error, say) is recorded as failed and the run goes on."""
    rows = []
    cases = [(shape, dtype, interleaved, outer, "default") for shape in ("A", "inkling-tp8")
             for dtype in (torch.bfloat16, torch.float16) for interleaved in (True, False)
             for outer in (1, SHAPES[shape][0])]
    cases += [("A", torch.bfloat16, True, 1, name) for name in CHECK_SCHEDULES]
    for shape, dtype, interleaved, outer, schedule in cases:
        row = dict(shape=shape, dtype=records.dtype_name(dtype), interleaved=interleaved, outer=outer, T=13,
                   schedule=schedule)
        try:
            row.update(check_case(shape, dtype, interleaved, outer, schedule))
        except Exception as exc:
            row.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:300]}")
        print("check", row, flush=True)
        rows.append(row)
    return rows


def median(xs):
    return statistics.median(xs)


def single_runner(ops, x, g, batch, config):
    T = x.shape[0]
    ws = sl.make_workspace(ops, T, config)
    slots, scalings = sl.device_slots(batch, T, x.device)
    out = torch.empty_like(x)
    return (lambda: sl.launch_single(ops, x, g, slots, scalings, out, ws)), out, ws


def grid_point(c, sink, x, g, batch, name: str, ceilings: dict, flush, reps: int) -> dict:
    """One grid point: ``single`` (candidate ``name``), ``triton`` and ``cublas_base``, each a CUDA
    graph timed after an L2 flush; ``single``'s output checked against ``triton``'s."""
    ops = sink.operands()
    T, gm = c.T, c.geometry
    fn, out, ws = single_runner(ops, x, g, batch, config_for(ops, T, CANDIDATES[name]))
    fn()
    finish_or_exit(f"{c.shape} R={gm.max_rank} S={gm.slots} T={T}", 120)
    tri, _ = pr.backend_runner("triton", sink, x, g, batch)
    cub, _ = pr.backend_runner("cublas_base", sink, x, g, batch)
    us = {"single": median(pr.time_graph(fn, flush, reps)),
          "triton": median(pr.time_graph(tri, flush, reps)),
          "cublas_base": median(pr.time_graph(cub, flush, reps))}
    torch.cuda.synchronize()
    expect = tri()
    agree = records.relative_error(out, expect)  # the graph's last replay vs the backend
    roof = pr.roofline(c, **ceilings)
    return dict(shape=c.shape, n=gm.n, H=gm.hidden, F=gm.intermediate, R=gm.max_rank, S=gm.slots, T=T,
                config=name, us=us, plan=sl.schedule(ops, ws, T, True, gm.slots),
                roofline_us=roof.us, roofline_bytes=roof.bytes,
                predicted_us=PREDICTED_US.get((c.shape, T)) if (gm.max_rank, gm.slots) == (64, 4) else None,
                model_us=roof.bytes / (ceilings["copy_TBps"] * 1e12) * 1e6 + FIXED_US,
                ratio_single=us["single"] / roof.us, speedup_vs_triton=us["triton"] / us["single"],
                vs_cublas_base=us["cublas_base"] / us["single"], rel_vs_triton=agree,
                out_absmax=float(expect.abs().max()), workspace_clean=ws.clean())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="h200_single_launch.json")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    t0 = time.time()
    env = records.environment(" ".join(["python3"] + sys.argv))
    ceilings = pr.measure_ceilings()
    print("ceilings", ceilings, flush=True)
    checks = check_correctness()
    flush = pr.L2Flush(DEVICE)
    sweep, points, truncated = [], [], False
    for shape in args.shapes.split(","):
        n, H, F = SHAPES[shape]
        base = None
        # 1. the sweep: the fastest correct candidate per token tile (T <= 16 and T <= 32 compile apart)
        winners = {}
        for T in (1, 32):
            sc = pr.Case(shape, Geometry(n, H, F, 64, 4), T).scenario(DEVICE, sink=base)
            sink, x, g, batch = sc.sink, sc.x, sc.gammas, sc.batch
            base = sink
            ops = sink.operands()
            tri, _ = pr.backend_runner("triton", sink, x, g, batch)
            expect = tri()
            timed, agree, plans, errors = {}, {}, {}, {}
            for name, change in CANDIDATES.items():
                if timed and time.time() - t0 > BUDGET_S:
                    break
                try:
                    config = config_for(ops, T, change)
                    fn, out, ws = single_runner(ops, x, g, batch, config)
                    fn()
                    finish_or_exit(f"{shape} T={T} config {name}", 120)
                    timed[name] = median(pr.time_graph(fn, flush, args.reps))
                    torch.cuda.synchronize()
                    agree[name] = records.relative_error(out, expect)   # the last replay vs the triton backend
                    plans[name] = dict(sl.schedule(ops, ws, T, True, 4), clean=ws.clean(), config=asdict(config))
                except Exception as exc:  # a variant that does not compile here, say: record it, keep going
                    print(shape, T, name, "FAILED", type(exc).__name__, str(exc)[:200], flush=True)
                    timed[name] = None
                    errors[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
            ok = {k: v for k, v in timed.items()
                  if v is not None and agree.get(k, 1.0) <= 2e-2 and plans.get(k, {}).get("clean")}
            winners[T] = min(ok, key=ok.get) if ok else "v12"
            sweep.append(dict(shape=shape, T=T, R=64, S=4, us=timed, rel_vs_triton=agree, plans=plans,
                              errors=errors, winner=winners[T],
                              wrong=sorted(set(k for k, v in timed.items() if v is not None) - set(ok))))
            print("sweep", {k: v for k, v in sweep[-1].items() if k != "plans"}, flush=True)
        # 2. the grid
        for R in RANKS:
            for S in SLOTS:
                for T in TOKENS:
                    if time.time() - t0 > GRID_BUDGET_S:
                        truncated = True
                        continue
                    c = pr.Case(shape, Geometry(n, H, F, R, S), T)
                    sc = c.scenario(DEVICE, sink=base)
                    sink, x, g, batch = sc.sink, sc.x, sc.gammas, sc.batch
                    base = sink
                    try:
                        points.append(grid_point(c, sink, x, g, batch, winners[1 if T <= 16 else 32], ceilings,
                                                 flush, args.reps))
                    except Exception as exc:  # recorded as a failed point; the grid goes on
                        points.append(dict(shape=shape, R=R, S=S, T=T,
                                           error=f"{type(exc).__name__}: {str(exc)[:300]}"))
                    print("point", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in points[-1].items()
                                    if k != "plan"}, flush=True)
        del base
        torch.cuda.empty_cache()
    failed = ([c for c in checks if not c["ok"]]
              + [p for p in points if "error" in p or not p["rel_vs_triton"] <= 2e-2 or not p["workspace_clean"]
                 or not p["out_absmax"] > 0]
              + [(w["shape"], w["T"], k) for w in sweep for k in w["wrong"] + sorted(w["errors"])])
    records.write_json(args.out, {"version": sl.VERSION, "environment": env, "ceilings": ceilings, "checks": checks,
                                  "sweep": sweep, "points": points,
                                  "candidates": {k: "the other kc" if v is None else v for k, v in CANDIDATES.items()},
                                  "compiled": sl.compiled_variants(), "failed": len(failed), "truncated": truncated,
                                  "seconds": time.time() - t0})
    print("\nsweep (us, R64 S4):", flush=True)
    for w in sweep:
        print(f"  {w['shape']:12s} T={w['T']:2d} winner {w['winner']:9s} "
              + " ".join(f"{k}={v:.1f}" if v is not None else f"{k}=FAILED" for k, v in w["us"].items()), flush=True)
    print("R64 S4 points (us): single / triton / cublas_base / predicted / roofline", flush=True)
    for p in points:
        if (p.get("R"), p.get("S")) == (64, 4) and "us" in p:
            print(f"  {p['shape']:12s} T={p['T']:2d} {p['us']['single']:6.1f} / {p['us']['triton']:6.1f} / "
                  f"{p['us']['cublas_base']:6.1f} / {p['predicted_us'] or float('nan'):5.1f} / {p['roofline_us']:5.1f}",
                  flush=True)
    print(f"wrote {args.out}: {len(points)} points{' (truncated by the time budget)' if truncated else ''}, "
          f"{len(failed)} failures, {time.time() - t0:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
