"""v15 on a CUDA GPU: the fused GEMMs (``Tiles.tma``, ``forward/fused_gemm.py``: the LoRA
expand as extra K steps of the base GEMMs, SwiGLU x gamma in the up GEMM's epilogue)
against the backend's current path (``kit``: what ``plan`` picks), sglang 0.5.23's
one-slot cuBLAS path, multi-slot kernels and no-LoRA base, taken from its wheel.

1. Correctness first, against the float64 reference on fresh random inputs: bf16 and fp16,
   both gate/up layouts, one slot, no adapter, graph replays (NaN-poisoned outputs), and a
   batch of several slots with a base-only and a rank-0 segment through ``plan``'s own
   tiles, at a token count with a partial tile.
2. The sweep: R 64, S 1 at T 32-8192 per shape, every candidate tile (``CANDIDATES``)
   beside ``kit`` and upstream's paths, read flush, medians.
3. The grid: R 16/64, S 1 at T 128-8192, both flushes, ``fused`` (the sweep's best for the
   shape and T) beside ``kit`` and upstream's paths.
4. The compiled kernels: registers, spills, whether wgmma is in the PTX.

``--confirm T,T,...``: the routing alone (``auto``'s tiles against the path without the
fused GEMMs and upstream, A R 16/64 S 1, both flushes, two passes). The first run
(``h200_fused_sweep.json``) also tried several slots, the third (``history/h200_fused_prefetch.json``,
``--quick`` at commit 418497f, removed after it) the LoRA operands loaded before the K loop:
see KERNEL_NOTES.md v15.

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=. python3 scripts/gpu/h200_fused.py --wheel WHEEL --out $OUT/NAME.json [--confirm 64,96,128]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import h200_pdl  # this folder's (the script's own, first on sys.path): check, run, graph_replays, time_point
from inkling_lab import profile as pr, records
from inkling_lab.batch import SlotBatch
from inkling_lab.forward import fused_gemm, triton_backend as tb
from inkling_lab.forward.reference import reference_forward


def fused(T: int, bm=128, bf=64, bn=128, bk=64, warps=8, stages=3, programs=0, group_m=8) -> tb.Tiles:
    """A candidate's tiles; the multi-slot shrinks split ``K`` as the cuBLAS path's do at ``T``."""
    return tb.Tiles(bm=bm, bf=bf, bn=bn, bk=bk, k_chunk=tb.pick_tiles(max(T, 256)).k_chunk, warps=warps,
                    stages=stages, group_m=group_m, cublas=True, sbm=64, tma=True, programs=programs)


CANDIDATES = {
    "m128f64n128k64w8s3p": dict(),
    "m128f64n128k64w8s3": dict(programs=-1),
    "m128f128n256k64w8s3p": dict(bf=128, bn=256),
    "m128f128n256k64w8s3": dict(bf=128, bn=256, programs=-1),
    "m128f64n128k64w4s4p": dict(warps=4, stages=4),
    "m128f64n128k128w8s3p": dict(bk=128),
    "m64f64n128k64w4s4": dict(bm=64, warps=4, stages=4, programs=-1),
    "m64f32n64k128w4s4": dict(bm=64, bf=32, bn=64, bk=128, warps=4, stages=4, programs=-1),
}
"""Fused-GEMM tiles: tokens per tile (m), features per up tile (f: 2f weight rows), hidden
columns per down tile (n), K step (k), warps, pipeline stages; ``p``: persistent (one
program per multiprocessor), else one program per tile."""


def contenders(names, upstream_cls, with_kit=True):
    def fns_for(sink, ops, x, gammas, batch):
        T = x.shape[0]
        fns = {}
        labels = ([("kit", None)] if with_kit else []) + [(v, fused(T, **CANDIDATES[v])) for v in names]
        for label, tiles in labels:
            p, out = tb.plan(ops, T, batch, x.device, tiles), torch.empty_like(x)
            fns[label] = (lambda p=p, out=out: tb.launch(ops, x, gammas, p, out))
        multi = upstream_cls(sink, batch, min_slots=2)
        fns["sglang_multi"] = lambda: multi.forward(x, gammas)
        if batch.num_slots == 1:
            one = upstream_cls(sink, batch)
            fns["sglang_one_slot"] = lambda: one.forward(x, gammas)
        fns["sglang_base"] = lambda: multi.forward(x, gammas, lora=False)
        return fns
    return fns_for


def correctness(t: tb.Tiles, T: int = 300) -> list[dict]:
    rows = []
    for shape in ("A", "Inkling-TP8"):
        for interleaved in (True, False):
            for dtype in ("bfloat16", "float16"):
                c = pr.Case.of(shape, 16, 3, T, interleaved=interleaved, dtype=dtype)
                sc = c.scenario("cuda", seed=T + int(interleaved))
                x, gammas, g = sc.x, sc.gammas, c.geometry
                ids = torch.tensor(([0] * 100 + [2] * 60 + [-1] * 40 + [1] * 50 + [0] * 50)[:T])
                batch = SlotBatch.from_token_slots(ids, g.slots, lora_ranks=[g.max_rank, 0, g.max_rank],
                                                   scalings=[0.7, 1.3, 1.9])
                one = SlotBatch.from_token_slots([2] * T, g.slots, lora_ranks=[g.max_rank, 0, g.max_rank],
                                                 scalings=[0.7, 1.3, 1.9])
                ops = sc.sink.operands()
                ref_one, ref_base = reference_forward(ops, x, gammas, one), reference_forward(ops, x, gammas, None)
                try:
                    errs = {"one_slot": records.relative_error(h200_pdl.run(ops, x, gammas, one, t), ref_one, "fro"),
                            "one_slot_graph": records.relative_error(h200_pdl.graph_replays(ops, x, gammas, one, t),
                                                                     ref_one, "fro"),
                            "no_adapter": records.relative_error(h200_pdl.run(ops, x, gammas, None, t), ref_base, "fro"),
                            "mixed_auto": records.relative_error(
                                h200_pdl.run(ops, x, gammas, batch, tb.plan(ops, T, batch, x.device).tiles),
                                reference_forward(ops, x, gammas, batch), "fro")}
                except Exception as exc:  # recorded, and the run goes on
                    errs = {"failure": float("nan")}
                    print(f"check {shape} il={interleaved} {dtype} FAILED: {type(exc).__name__}: {str(exc)[:400]}",
                          flush=True)
                ok = all(e == e and e < 1e-2 for e in errs.values())
                rows.append({**c.record(), "rel_err": errs, "ok": ok})
                print(f"check {shape} il={interleaved} {dtype}: " + " ".join(f"{k} {v:.1e}" for k, v in errs.items()),
                      flush=True)
    return rows


def compiled() -> list[dict]:
    """Registers, spills, shared memory and wgmma of every fused kernel compiled in this run."""
    rows = []
    for kern in (fused_gemm.fused_up_kernel, fused_gemm.fused_down_kernel):
        try:
            for cache in kern.device_caches.values():
                for key, ck in cache[0].items():
                    ptx = ck.asm.get("ptx", "")
                    rows.append({"kernel": kern.fn.__name__, "key": str(key)[:300], "n_regs": ck.n_regs,
                                 "n_spills": ck.n_spills, "shared": ck.metadata.shared, "wgmma": "wgmma" in ptx,
                                 "tma": "cp.async.bulk.tensor" in ptx})
        except Exception as exc:  # another Triton's internals: recorded
            rows.append({"kernel": str(kern), "failure": f"{type(exc).__name__}: {exc}"[:300]})
    return rows


def confirm(rec: dict, tokens: list[int], args, upstream_cls, t0: float) -> int:
    """The routing as ``auto`` has it (``kit``: ``plan``'s own tiles) against the path
    without the fused GEMMs (``kit_v14``) and upstream, both flushes, two passes; the
    routed tiles checked first (``correctness``, a partial tile: 100 tokens)."""
    routed = tb.fused_tiles(128, 0, 64) or fused(128)
    rec["routed_tiles"] = vars(routed)
    rec["correctness"] = correctness(routed, T=100)
    print(f"correctness: {sum(r['ok'] for r in rec['correctness'])}/{len(rec['correctness'])} ok", flush=True)
    flushes = {"read": pr.L2Flush("cuda"), "write": pr.L2Flush("cuda", mode="write")}

    def fns_for(sink, ops, x, gammas, batch):
        T = x.shape[0]
        fns = {}
        for label, tiles in (("kit", None), ("kit_v14", tb.pick_tiles(T, ops.n * ops.intermediate * ops.hidden,
                                                                      ops.hidden, tma=False))):
            p, out = tb.plan(ops, T, batch, x.device, tiles), torch.empty_like(x)
            fns[label] = (lambda p=p, out=out: tb.launch(ops, x, gammas, p, out))
        one, multi = upstream_cls(sink, batch), upstream_cls(sink, batch, min_slots=2)
        fns["sglang_one_slot"] = lambda: one.forward(x, gammas)
        fns["sglang_multi"] = lambda: multi.forward(x, gammas)
        fns["sglang_base"] = lambda: multi.forward(x, gammas, lora=False)
        return fns

    rec["points"] = []
    for rep in (0, 1):
        base = None
        for R in (16, 64):
            for T in tokens:
                c = pr.Case.of("A", R, 1, T)
                base, row = h200_pdl.time_point(c, fns_for, flushes, args.reps, base)
                row.update(rep=rep, routed=tb.fused_tiles(T, c.geometry.n * c.geometry.intermediate * c.geometry.hidden,
                                                          R) is not None)
                rec["points"].append(row)
                us = row["us"]
                print(f"pass {rep} A R{R:<2} T{T:<4} " + " ".join(f"{k} {u:6.1f}" for k, u in us.items()), flush=True)
        records.write_json(args.out, rec)
    if args.diagnose:
        diagnose(rec, args.reps)
    rec["seconds"] = round(time.time() - t0, 1)
    records.write_json(args.out, rec)
    print(f"{rec['seconds']} s")
    return 0


DIAG = {"m128f64n128k128w8s3p": dict(bk=128), "m128f64n128k64w8s4p": dict(stages=4),
        "m128f128n256k64w8s3p": dict(bf=128, bn=256)}
"""Tiles of the diagnosis: each kernel alone, with and without its LoRA steps."""


def diagnose(rec: dict, reps: int) -> None:
    """Where the fused GEMMs lose to cuBLAS at many tokens: each launch alone (read flush),
    against cuBLAS's GEMM of the same base product: the up kernel with and without its LoRA
    steps, interleaved (its epilogue splits the accumulator into gate/up pairs) and
    contiguous (two accumulators), the down kernel likewise. GFLOP/s of the base product."""
    flush, rows = pr.L2Flush("cuda"), []
    for shape, T in (("A", 8192), ("B", 8192)):
        fns, flops = {}, {}
        for interleaved in (True, False):
            c = pr.Case.of(shape, 64, 1, T, interleaved=interleaved)
            sc = c.scenario("cuda")
            ops, x, g = sc.sink.operands(), sc.x, sc.gammas
            n, F, H = ops.n, ops.intermediate, ops.hidden
            slots = torch.zeros(T, dtype=torch.int32, device="cuda")
            sc_ = torch.ones(1, device="cuda")
            sh = torch.randn(T, 2 * ops.max_rank, device="cuda", dtype=x.dtype)
            mid = torch.randn(T, ops.max_rank, device="cuda", dtype=x.dtype)
            act = torch.empty(T, n * F, device="cuda", dtype=x.dtype)
            y, out = torch.empty(T, n * 2 * F, device="cuda", dtype=x.dtype), torch.empty_like(x)
            lay = "il" if interleaved else "ct"
            if interleaved:
                fns["cublas_up"] = lambda x=x, ops=ops, y=y: torch.mm(x, ops.w13_lin.T, out=y)
                fns["cublas_down"] = lambda act=act, ops=ops, out=out: torch.mm(act, ops.w2_lin, out=out)
                flops["cublas_up"], flops["cublas_down"] = 2 * T * H * n * 2 * F, 2 * T * n * F * H
            for name, kw in DIAG.items():
                t = fused(T, **kw)
                if F % t.bf:
                    continue
                for lora in (False, True):
                    k = f"up_{lay}_{'lora' if lora else 'base'}_{name}"
                    fns[k] = (lambda ops=ops, x=x, g=g, act=act, slots=slots, s=sc_, sh=sh if lora else None, t=t:
                              fused_gemm.up(ops, x, g, act, slots, s, sh, t))
                    flops[k] = flops.get("cublas_up", 2 * T * H * n * 2 * F)
                    if interleaved:
                        k = f"down_{'lora' if lora else 'base'}_{name}"
                        db = ops.buffers[3]
                        fns[k] = (lambda ops=ops, act=act, out=out, slots=slots, s=sc_, m=mid if lora else None,
                                  db=db if lora else None, t=t: fused_gemm.down(ops, act, out, slots, s, m, db, t))
                        flops[k] = 2 * T * n * F * H
        graphs = {}
        for k, fn in fns.items():
            try:
                graphs[k] = pr.capture(fn)
            except Exception as exc:  # recorded, and the run goes on
                rows.append({"shape": shape, "T": T, "launch": k, "failure": f"{type(exc).__name__}: {exc}"[:300]})
                print(f"diag {shape} {k} FAILED: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        for k, v in pr.time_interleaved(graphs, flush, reps).items():
            us = statistics.median(v)
            rows.append({"shape": shape, "T": T, "launch": k, "us": us, "base_tflops": flops[k] / us / 1e6})
            print(f"diag {shape} T{T} {k:<34} {us:8.1f} us {flops[k] / us / 1e6:6.0f} TFLOP/s", flush=True)
        del graphs, fns
    rec["diagnosis"] = rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheel", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--shapes", default=",".join(pr.SIDE_SHAPES))
    ap.add_argument("--budget", type=float, default=420.0, help="seconds: the grid stops before this")
    ap.add_argument("--diagnose", action="store_true", help="with --confirm: each fused launch alone against cuBLAS")
    ap.add_argument("--confirm", default="", help="token counts: only the routing check (auto against the "
                    "path without the fused GEMMs and upstream) at A, R 16/64, S 1, both flushes, twice")
    args = ap.parse_args()
    from inkling_lab.upstream_wheel import UpstreamSink

    t0 = time.time()
    rec = h200_pdl.record_head(h200_pdl.run_environment(), args.wheel, candidates=CANDIDATES)
    ceilings = rec["ceilings"]
    if args.confirm:
        return confirm(rec, [int(v) for v in args.confirm.split(",")], args, UpstreamSink, t0)
    rec["correctness"] = correctness(fused(300))
    records.write_json(args.out, rec)
    print(f"correctness: {sum(r['ok'] for r in rec['correctness'])}/{len(rec['correctness'])} ok, "
          f"{time.time() - t0:.0f} s", flush=True)
    read, write = pr.L2Flush("cuda"), pr.L2Flush("cuda", mode="write")
    shapes = args.shapes.split(",")
    rec["sweep"], best = [], {}
    for shape in shapes:
        base = None
        for S, T in [(1, 32), (1, 128), (1, 512), (1, 2048), (1, 8192)]:
            names = [v for v in CANDIDATES if T > 128 or v.startswith("m64") or v == "m128f64n128k64w8s3"]
            base, row = h200_pdl.time_point(pr.Case.of(shape, 64, S, T), contenders(names, UpstreamSink), {"read": read},
                                   args.reps, base)
            rec["sweep"].append(row)
            us = {k.removesuffix("@read"): u for k, u in row["us"].items()}
            best[shape, S, T] = min((v for v in names if v in us), key=us.get, default=None)
            print(f"sweep {shape:<11} S{S} T{T:<4} " + " ".join(f"{k} {v:.1f}" for k, v in us.items())
                  + f"  best {best[shape, S, T]}", flush=True)
        records.write_json(args.out, rec)
    rec["best"] = {f"{s} S{S} {T}": v for (s, S, T), v in best.items()}
    rec["compiled"] = compiled()
    records.write_json(args.out, rec)
    rec["points"] = []
    for shape in shapes:
        base = None
        for R in (16, 64):
            for S, T in [(1, 128), (1, 512), (1, 2048), (1, 8192)]:
                if time.time() - t0 > args.budget:
                    break
                v = best.get((shape, S, T))
                if v is None:
                    continue
                c = pr.Case.of(shape, R, S, T)
                base, row = h200_pdl.time_point(c, contenders([v], UpstreamSink), {"read": read, "write": write}, args.reps, base)
                row.update(fused_config=v, roofline_us=pr.roofline(c, **ceilings).us)
                rec["points"].append(row)
                us = row["us"]
                up = min(u for k, u in us.items() if k.startswith("sglang_") and "base" not in k and k.endswith("@read"))
                print(f"{shape:<11} R{R:<2} S{S} T{T:<4} " + " ".join(f"{k} {u:7.1f}" for k, u in us.items() if k.endswith("@read"))
                      + f"  fused/kit {us[v + '@read'] / us['kit@read']:.3f} fused/upstream {us[v + '@read'] / up:.3f}"
                      f" fused/base {us[v + '@read'] / us['sglang_base@read']:.3f}", flush=True)
        records.write_json(args.out, rec)
    rec["seconds"] = round(time.time() - t0, 1)
    records.write_json(args.out, rec)
    for r in rec["compiled"]:
        print("compiled", {k: r.get(k) for k in ("kernel", "n_regs", "n_spills", "shared", "wgmma", "tma")})
    print(f"{rec['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
