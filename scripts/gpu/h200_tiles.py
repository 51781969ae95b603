"""Tile sweep for the Triton backend on a CUDA GPU (run on the H200; see KERNEL_NOTES.md).

Correctness against the float64 reference first, then every candidate ``Tiles`` at a
few token counts of shapes A and B (R 64, S 4 unless told), with the torch and cuBLAS paths for
comparison. Writes one JSON (``--out``) and prints the best tiles per point.

    PYTHONPATH=. python3 scripts/gpu/h200_tiles.py --out /tmp/tiles.json
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import asdict

import torch

from inkling_lab import profile as pr, records
from inkling_lab.forward.triton_backend import Tiles, launch, plan

BIG = 1 << 30
SMALL = [  # weight streaming: narrow tiles, the shrink split over H
    Tiles(16, 16, 16, 128, 128, 2, 4), Tiles(16, 32, 32, 128, 128, 4, 4), Tiles(16, 16, 16, 256, 128, 2, 4),
    Tiles(16, 16, 16, 512, 128, 4, 3), Tiles(16, 16, 16, 256, 256, 4, 4), Tiles(16, 32, 32, 256, 128, 4, 3),
    Tiles(16, 16, 16, 64, 128, 2, 8),
]
MID = [
    Tiles(32, 32, 32, 64, 512, 4, 3, cublas=True), Tiles(64, 64, 64, 64, BIG, 4, 3, cublas=True),
]
LARGE = [  # cuBLAS base GEMMs with the kernels as prologue/epilogues, and the all-Triton GEMM
    Tiles(32, 64, 64, 64, BIG, 4, 2, cublas=True), Tiles(64, 64, 64, 64, BIG, 4, 3, cublas=True),
    Tiles(64, 128, 128, 64, BIG, 8, 2, cublas=True), Tiles(32, 32, 32, 64, BIG, 4, 2, cublas=True),
    Tiles(128, 64, 128, 64, BIG, 8, 2, cublas=True), Tiles(128, 128, 128, 64, BIG, 8, 3),
]


EPILOGUES = [(64, 128, 128, 8), (128, 64, 128, 8), (32, 128, 64, 4), (64, 64, 64, 4),
             (32, 64, 128, 4), (64, 32, 128, 4), (16, 128, 128, 4), (32, 32, 64, 2)]
SHRINKS = [(64, 4, BIG), (64, 4, 512), (128, 4, BIG), (128, 8, BIG), (64, 8, BIG)]
"""(``sbm``, ``swarps``, ``k_chunk``) of the shrink; the last three since v19."""


def epilogue_candidates() -> list[Tiles]:
    """The cuBLAS path's epilogue tiles crossed with the shrink's tile, warps and split."""
    return [Tiles(bm, bf, bn, 64, k, w, 2, cublas=True, sbm=sbm, swarps=sw)
            for bm, bf, bn, w in EPILOGUES for sbm, sw, k in SHRINKS]


def candidates(T: int) -> list[Tiles]:
    if T <= 32:
        return SMALL
    if T <= 256:
        return MID + SMALL[:2] + LARGE[:1]
    return LARGE


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", default="1,16,32,64,128,256,1024,2048,8192")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--rank", type=int, default=64)
    ap.add_argument("--epilogues", action="store_true", help="sweep the cuBLAS path's epilogue and shrink tiles")
    ap.add_argument("--shapes", default="A,B", help="benchmark shapes (profile.SHAPES' names)")
    args = ap.parse_args()
    ceilings = pr.measure_ceilings()
    print("ceilings", ceilings, flush=True)
    flush = pr.L2Flush("cuda")
    rows = []
    for shape in args.shapes.split(","):
        base = None
        for T in [int(v) for v in args.tokens.split(",")]:
            c = pr.Case.of(shape, args.rank, args.slots, T)
            sc = c.scenario("cuda", sink=base)
            sink, x, g, batch = sc.sink, sc.x, sc.gammas, sc.batch
            base = sink
            roof = pr.roofline(c, **ceilings).us
            ops = sink.operands()
            for t in (epilogue_candidates() if args.epilogues else candidates(T)):
                p = plan(ops, T, batch, x.device, t)
                out = torch.empty_like(x)
                try:
                    us = statistics.median(pr.time_graph(lambda: launch(ops, x, g, p, out), flush, 30))
                except Exception as exc:  # a tile that does not fit in shared memory, say
                    print(shape, T, t, "FAILED", type(exc).__name__, str(exc)[:120], flush=True)
                    continue
                rows.append({"shape": shape, "T": T, "tiles": asdict(t), "us": us, "roofline_us": roof})
            for b in (() if args.epilogues else ("torch", "cublas_base")):
                fn, cap = pr.backend_runner(b, sink, x, g, batch)
                us = statistics.median((pr.time_graph if cap else pr.time_eager)(fn, flush, 20))
                rows.append({"shape": shape, "T": T, "tiles": b, "us": us, "roofline_us": roof})
            here = [r for r in rows if r["shape"] == shape and r["T"] == T]
            best = min((r for r in here if isinstance(r["tiles"], dict)), key=lambda r: r["us"])
            others = {r["tiles"]: round(r["us"], 1) for r in here if isinstance(r["tiles"], str)}
            here = sorted(here, key=lambda r: r["us"])[:8]
            print(f"{shape} T={T:5d} roof {roof:7.1f}  best {best['us']:8.1f} ({best['us'] / roof:.2f}x) "
                  f"{tuple(best['tiles'].values())}  {others}", flush=True)
            for r in sorted(here, key=lambda r: r["us"]):
                print("    ", round(r["us"], 1), r["tiles"] if isinstance(r["tiles"], str) else tuple(r["tiles"].values()))
    records.write_json(args.out, {"environment": records.environment("python3 " + " ".join(sys.argv)), "ceilings": ceilings,
                             "rows": rows})


if __name__ == "__main__":
    main()
