"""Diagnostics on the H200 (KERNEL_NOTES.md): the L2-flush artefact, and which kernels
take the time in each path of the Triton backend.

    PYTHONPATH=. python3 scripts/gpu/h200_diag.py --out /tmp/diag.json
"""
from __future__ import annotations

import argparse
import statistics

from inkling_lab import profile as pr, records
from inkling_lab.forward.triton_backend import Tiles, pick_tiles

BIG = 1 << 30


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = {"flush": [], "kernels": []}
    flushes = {m: pr.L2Flush("cuda", m) for m in ("read", "write")}
    for shape, T in (("A", 1), ("A", 32), ("B", 1), ("A", 8192)):
        c = pr.Case.of(shape, 64, 4, T)
        sc = c.scenario("cuda")
        sink, x, g, batch = sc.sink, sc.x, sc.gammas, sc.batch
        for b in ("triton", "cublas_base"):
            fn, cap = pr.backend_runner(b, sink, x, g, batch)
            for m, fl in flushes.items():
                us = statistics.median(pr.time_graph(fn, fl, 30))
                rows["flush"].append({"shape": shape, "T": T, "backend": b, "flush": m, "us": us})
                print(f"flush {m:5s} {shape} T={T:5d} {b:12s} {us:8.1f} us", flush=True)
    for shape, T, tiles in (("A", 1, None), ("B", 1, None), ("A", 8192, None), ("B", 8192, None),
                            ("A", 8192, Tiles(128, 128, 128, 64, BIG, 8, 3)), ("A", 1024, None)):
        c = pr.Case.of(shape, 64, 4, T)
        t = tiles or pick_tiles(T, c.geometry.n * c.geometry.intermediate * c.geometry.hidden)
        table = pr.kernel_table(c, "triton", tiles=t)
        rows["kernels"].append({"shape": shape, "T": T, "tiles": str(t), "kernels": table})
        print(shape, T, t)
        for r in table:
            print(f"    {r['us_per_forward']:8.1f} {r['calls_per_forward']:4.1f} {r['kernel'][:70]}")
    records.write_json(args.out, {"environment": records.environment("scripts/gpu/h200_diag.py"), **rows})


if __name__ == "__main__":
    main()
