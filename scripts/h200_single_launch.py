"""The one-launch kernel (``inkling_lab/forward/single_launch.py``) on a CUDA GPU: correctness,
a small tile sweep, then the few-token grid against the three-launch triton backend.

1. Correctness against the float64 reference, bf16 and fp16, both gate/up layouts,
   both outer layouts, mixed / base-only / rank-0 tokens, output poisoned with NaN, the
   launch captured in a CUDA graph and replayed twice (the workspace must come back
   zero); any failure is recorded and makes the exit status 1.
2. Sweep: each candidate ``SingleConfig`` at R 64, S 4, T 1 and 32 per shape; the
   fastest per (shape, token tile) runs the grid (``sweep`` in the record says which won).
3. Grid: shapes A, B, Inkling and Inkling-TP8 x R 16, 64 x S 1, 4, 8 x T 1, 8, 32:
   ``single`` (this kernel), ``triton`` (the three-launch backend) and ``cublas_base``
   (the base sink alone through cuBLAS, no LoRA work), each a CUDA graph replayed with
   the L2 flushed before every replay (``profile.time_graph``), the three timed one after
   another at each point; ``single``'s output checked against ``triton``'s at every
   point. Each point carries its roofline (``profile.roofline``, the run's own ceilings)
   and the prediction made before the run, ``model_us`` = bytes / copy bandwidth + ``FIXED_US``.

    cd .gpu_stage && PYTHONPATH=. python3 scripts/h200_single_launch.py --out $OUT/h200_single_launch.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import asdict

import torch

from inkling_lab import profile as pr, records
from inkling_lab.forward import single_launch as sl
from inkling_lab.forward.reference import reference_forward
from inkling_lab.geometry import Geometry
from inkling_lab.scenario import Scenario

SHAPES = {"A": (2, 1536, 768), "B": (2, 4096, 2048), "inkling": (2, 6144, 3072), "inkling-tp8": (2, 6144, 384)}
RANKS, SLOTS, TOKENS = (16, 64), (1, 4, 8), (1, 8, 32)
CANDIDATES = {  # 4 per shape: warps, reduction step, feature block, the down tasks' w2 prefetch
    "default": sl.SingleConfig(),
    "w8": sl.SingleConfig(warps=8),
    "bk64_prefetch": sl.SingleConfig(bk=64, bkd=64, stages=4, prefetch=True),
    "prefetch": sl.SingleConfig(prefetch=True),
}
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


def check_correctness() -> list[dict]:
    """Shape A and Inkling-TP8 at 13 tokens (mixed slots, base-only tokens, a rank-0 slot
    whose buffers are not zero), R 16, S 3, every dtype/layout/outer combination."""
    rows = []
    for shape in ("A", "inkling-tp8"):
        n, H, F = SHAPES[shape]
        for dtype in (torch.bfloat16, torch.float16):
            for interleaved in (True, False):
                for outer in (1, n):
                    g = Geometry(n=n, hidden=H, intermediate=F, max_rank=16, slots=3, outer=outer)
                    slots_t = [0, 0, 0, -1, -1, 2, 2, 2, 2, 1, 1, 0, -1]
                    sc = Scenario.random(g, tokens=len(slots_t), seed=7, dtype=dtype, device=DEVICE,
                                         interleaved=interleaved, ranks=[16, 0, 9], token_slots=slots_t)
                    # The rank-0 slot keeps non-zero buffers: the kernel must skip it.
                    ops = sc.operands()
                    ops.buffers[0][1].normal_()
                    ref = reference_forward(ops, sc.x, sc.gammas, sc.batch)
                    base = reference_forward(ops, sc.x, sc.gammas, None)
                    T = sc.x.shape[0]
                    ws = sl.make_workspace(ops, T)
                    slots, scalings = sl.device_slots(sc.batch, T, DEVICE)
                    out = torch.full_like(sc.x, float("nan"))
                    sl.launch_single(ops, sc.x, sc.gammas, slots, scalings, out, ws)  # compile, run once eagerly
                    finish_or_exit(f"the first launch ({shape}, {dtype}, interleaved={interleaved}, O={outer})", 120)
                    graph = graph_of(lambda: sl.launch_single(ops, sc.x, sc.gammas, slots, scalings, out, ws))
                    errs = []
                    for _ in range(2):
                        out.fill_(float("nan"))
                        graph.replay()
                        finish_or_exit("a graph replay")
                        errs.append(records.relative_error(out, ref))
                    clean = bool(ws.counters.count_nonzero() == 0 and ws.sh.count_nonzero() == 0
                                 and ws.mid.count_nonzero() == 0)
                    err = max(errs)
                    row = dict(shape=shape, dtype=records.dtype_name(dtype), interleaved=interleaved, outer=outer,
                               T=T, rel_error=err, lora_effect=records.relative_error(base, ref),
                               workspace_clean=clean, ok=bool(err < TOLERANCE[dtype] and clean))
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
        # 1. the sweep: the fastest candidate per token tile (T <= 16 and T <= 32 compile apart)
        winners = {}
        for T in (1, 32):
            c = pr.Case(shape, n, H, F, R=64, S=4, T=T)
            sink, x, g, batch = pr.build_case(c, DEVICE, base=base)
            base = sink
            ops = sink.operands()
            timed = {}
            for name, config in CANDIDATES.items():
                if timed and time.time() - t0 > BUDGET_S:
                    break
                try:
                    fn, _, _ = single_runner(ops, x, g, batch, config)
                    fn()
                    finish_or_exit(f"{shape} T={T} config {name}", 120)
                    timed[name] = median(pr.time_graph(fn, flush, args.reps))
                except Exception as exc:  # a tile that does not fit, say: record it, keep going
                    print(shape, T, name, "FAILED", type(exc).__name__, str(exc)[:200], flush=True)
                    timed[name] = None
            ok = {k: v for k, v in timed.items() if v is not None}
            winners[T] = min(ok, key=ok.get) if ok else "default"
            sweep.append(dict(shape=shape, T=T, R=64, S=4, us=timed, winner=winners[T],
                              config=asdict(CANDIDATES[winners[T]])))
            print("sweep", sweep[-1], flush=True)
        # 2. the grid
        for R in RANKS:
            for S in SLOTS:
                for T in TOKENS:
                    if time.time() - t0 > GRID_BUDGET_S:
                        truncated = True
                        continue
                    c = pr.Case(shape, n, H, F, R=R, S=S, T=T)
                    sink, x, g, batch = pr.build_case(c, DEVICE, base=base)
                    base = sink
                    ops = sink.operands()
                    name = winners[1 if T <= 16 else 32]
                    fn, out, ws = single_runner(ops, x, g, batch, CANDIDATES[name])
                    tri, _ = pr.backend_runner("triton", sink, x, g, batch)
                    cub, _ = pr.backend_runner("cublas_base", sink, x, g, batch)
                    us = {"single": median(pr.time_graph(fn, flush, args.reps)),
                          "triton": median(pr.time_graph(tri, flush, args.reps)),
                          "cublas_base": median(pr.time_graph(cub, flush, args.reps))}
                    torch.cuda.synchronize()
                    expect = tri()
                    agree = records.relative_error(out, expect)  # the graph's last replay vs the backend
                    roof = pr.roofline(c, **ceilings)
                    row = dict(shape=shape, n=n, H=H, F=F, R=R, S=S, T=T, config=name, us=us,
                               roofline_us=roof.us, roofline_bytes=roof.bytes,
                               model_us=roof.bytes / (ceilings["copy_TBps"] * 1e12) * 1e6 + FIXED_US,
                               ratio_single=us["single"] / roof.us, speedup_vs_triton=us["triton"] / us["single"],
                               vs_cublas_base=us["cublas_base"] / us["single"], rel_vs_triton=agree,
                               out_absmax=float(expect.abs().max()),
                               workspace_clean=bool(ws.counters.count_nonzero() == 0))
                    print("point", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()},
                          flush=True)
                    points.append(row)
        del base
        torch.cuda.empty_cache()
    failed = [c for c in checks if not c["ok"]] + [p for p in points if not p["rel_vs_triton"] <= 2e-2
                                                   or not p["workspace_clean"] or not p["out_absmax"] > 0]
    records.write_json(args.out, {"environment": env, "ceilings": ceilings, "checks": checks, "sweep": sweep,
                                  "points": points, "candidates": {k: asdict(v) for k, v in CANDIDATES.items()},
                                  "failed": len(failed), "truncated": truncated, "seconds": time.time() - t0})
    print(f"wrote {args.out}: {len(points)} points{' (truncated by the time budget)' if truncated else ''}, "
          f"{len(failed)} failures, {time.time() - t0:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
