"""v58 on a CUDA GPU (issue 26 target 3): the up GEMM with one slot's gate/up shrink in one Triton launch
(``up_shrink``), beside cuBLAS's ways of making the same two products, at one slot and many tokens.

Contenders at each point (tokens on one slot), as CUDA graphs taking turns under the read flush (medians):

- ``up``: cuBLAS's up GEMM alone (the floor of every cuBLAS way); ``beside``: the kit's pair (``_launch_single``: the
  shrink on the side stream); ``grouped_swapped``: v56b's pair (the up GEMM on the side stream, a one-group grouped
  GEMM here); ``up_cat``: one cuBLAS GEMM over ``[w13_lin; A_s]``; all from ``h200_up_cat.contenders``;
- ``up_cat_pad``: the same with zero rows up to a multiple of 256 (cuBLAS's tiles at an ``N`` off their multiples);
- ``tri_<config>``: ``up_shrink`` at each of ``CONFIGS``, and ``tri_<config>_up``, the same tiles without the shrink's
  column tiles (Triton's up GEMM alone, against ``up``).

Each contender's ``y`` and ``sh`` are checked against the float64 products first; one that is wrong is not timed.

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=.:scripts/gpu:experiments/up_shrink python3 \
        experiments/up_shrink/h200_up_shrink.py --out $OUT/NAME.json
"""
from __future__ import annotations

import sys
import time

import torch

import h200_pdl  # scripts/gpu's: the record, the timing
import h200_up_cat  # scripts/gpu's: the kit's pairs and their errors against float64
import up_shrink
from inkling_lab import profile as pr, records
from inkling_lab.forward import triton_backend as tb

CONFIGS = {
    "m128n128k64s4w8": dict(bm=128, bn=128, bk=64, stages=4, warps=8),
    "m128n64k64s4w4": dict(bm=128, bn=64, bk=64, stages=4, warps=4),
    "m64n128k64s4w4": dict(bm=64, bn=128, bk=64, stages=4, warps=4),
    "m128n256k64s3w8": dict(bm=128, bn=256, bk=64, stages=3, warps=8),
    "m64n64k128s4w4": dict(bm=64, bn=64, bk=128, stages=4, warps=4),
}
"""``up_shrink``'s tiles: ``m<BM>n<BN>k<BK>s<stages>w<warps>``, ``GROUP_M`` 8. Hopper's wgmma wants ``BM`` 64 a warp
group; the shared memory a stage takes is ``(BM + BN) * BK * 2`` bytes (64-96 KB at 4 stages: one or two programs a
multiprocessor)."""
TOKENS = (2048, 8192)


def contenders(ops, x: torch.Tensor, p: tb.Plan) -> dict:
    """``h200_up_cat``'s one-slot contenders, ``up_cat_pad`` and the Triton launches, each returning ``(y, sh)``."""
    fns = {k: v for k, v in h200_up_cat.contenders(ops, x, p).items()
           if k in ("up", "beside", "grouped_swapped", "up_cat")}
    s = int(p.slots[0])
    a = ops.buffers[0][s, 0]                                    # [2R, H]
    N, R2 = ops.w13_lin.shape[0], a.shape[0]
    rows = -(-(N + R2) // 256) * 256
    w_pad = torch.cat([ops.w13_lin, a, a.new_zeros(rows - N - R2, a.shape[1])])
    y_pad = x.new_empty(x.shape[0], rows)

    def up_cat_pad():
        torch.mm(x, w_pad.T, out=y_pad)
        return y_pad[:, :N], y_pad[:, N:N + R2]
    fns["up_cat_pad"] = up_cat_pad
    y, sh = x.new_empty(x.shape[0], N), x.new_empty(x.shape[0], R2)
    for name, cfg in CONFIGS.items():
        fns[f"tri_{name}"] = lambda cfg=cfg: up_shrink.up_shrink(x, ops.w13_lin, a, y, sh, **cfg)
        fns[f"tri_{name}_up"] = lambda cfg=cfg: up_shrink.up_shrink(x, ops.w13_lin, None, y, **cfg)
    return fns


def point(shape: str, R: int, T: int, flush, reps: int, device: str = "cuda", timer=None) -> dict:
    """One point, one slot: each contender's error against float64 and (with ``timer``) medians."""
    ops, x, p = h200_up_cat.slot_ordered(shape, R, 1, T, device)
    fns = contenders(ops, x, p)
    errs = h200_up_cat.errors(fns, x, ops, p.slots.long())
    ok = {k: fn for k, fn in fns.items() if errs[k] < 1e-2}
    return {"shape": shape, "R": R, "S": 1, "T": T, "rel_err": errs,
            "us": timer(ok, {"read": flush}, reps) if timer else {}}


def summary(row: dict) -> str:
    """One line for a point: cuBLAS's ways, the best Triton launch against ``beside`` and the best Triton up GEMM alone
    against cuBLAS's, the worst error, and what was not timed."""
    got = {k.split("@")[0]: u for k, u in row["us"].items()}
    parts = [f"{row['shape']:<11} R{row['R']:<2} T{row['T']:<4}"]
    parts += [f"{k} {got[k]:.1f}" for k in ("up", "beside", "grouped_swapped", "up_cat", "up_cat_pad") if k in got]
    for alone, against in ((False, "beside"), (True, "up")):
        tri = [k for k in got if k.startswith("tri_") and k.endswith("_up") == alone]
        if tri and against in got:
            best = min(tri, key=got.get)
            parts.append(f"| {best} {got[best]:.1f} ({got[best] / got[against]:.3f}x {against})")
    parts.append(f"| worst err {max(row['rel_err'].values()):.1e}")
    if missing := sorted(set(row["rel_err"]) - set(got)):
        parts.append(f"| not timed: {missing}")
    return " ".join(parts)


def main() -> int:
    ap = h200_pdl.run_arguments(__doc__, ("A", "Inkling-TP8", "B", "Inkling"), wheel=False)
    ap.add_argument("--ranks", default="16,64")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    args = ap.parse_args()
    t0 = time.time()
    rec = h200_pdl.record_head(h200_pdl.run_environment(), None, candidates=CONFIGS, points=[])
    flush = pr.L2Flush("cuda")
    for shape in args.shapes.split(","):
        for R in map(int, args.ranks.split(",")):
            for T in map(int, args.tokens.split(",")):
                row = point(shape, R, T, flush, args.reps, timer=h200_pdl.timed_medians)
                rec["points"].append(row)
                print(summary(row), flush=True)
                records.write_json(args.out, rec)
    return h200_pdl.finish_record(rec, args.out, t0)


if __name__ == "__main__":
    sys.exit(main())
