"""Sweep the split-K target of the weight-streaming path (``triton_backend.TARGET_PROGRAMS``)
at few tokens on every side-by-side shape; run on the H200 (KERNEL_NOTES.md, v7):
    PYTHONPATH=. python3 scripts/gpu/h200_split_sweep.py --out /tmp/split.json
Each point is checked against the float64 reference before it is timed (CUDA graph
replays, L2 read-flushed before each)."""
from __future__ import annotations

import argparse
import statistics

import torch

from inkling_lab import profile as pr, records
from inkling_lab.forward import triton_backend as tb
from inkling_lab.forward.reference import reference_forward


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--targets", default="1,132,264,396,528,792")
    ap.add_argument("--tokens", default="1,8,32")
    args = ap.parse_args()
    flush = pr.L2Flush("cuda")
    rows = []
    for shape in pr.SIDE_SHAPES:
        for T in [int(v) for v in args.tokens.split(",")]:
            for R in (16, 64):
                c = pr.Case.of(shape, R, 4, T)
                sc = c.scenario("cuda", seed=T)
                ops, x, g, batch = sc.operands(), sc.x, sc.gammas, sc.batch
                ref = reference_forward(ops, x, g, batch)
                line = []
                for target in [int(v) for v in args.targets.split(",")]:
                    tb.TARGET_PROGRAMS = target
                    p = tb.plan(ops, T, batch, x.device)
                    out = torch.full_like(x, float("nan"))
                    tb.launch(ops, x, g, p, out)
                    tb.launch(ops, x, g, p, out)
                    err = records.relative_error(out, ref, "fro")
                    us = statistics.median(pr.time_graph(lambda: tb.launch(ops, x, g, p, out), flush, 30))
                    sp = p.split
                    rows.append({"shape": shape, "R": R, "T": T, "target": target, "us": us, "rel_err": err,
                                 "up_split": sp.up if sp else 1, "down_split": sp.down if sp else 1})
                    line.append(f"{target}:{us:.1f}({sp.up if sp else 1},{sp.down if sp else 1})"
                                + ("" if err < 1e-2 else f" ERR {err:.1e}"))
                print(shape, "R", R, "T", T, " ".join(line), flush=True)
    records.write_json(args.out, {"environment": records.environment("scripts/gpu/h200_split_sweep.py"), "rows": rows})


if __name__ == "__main__":
    main()
