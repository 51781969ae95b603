"""v42 on a CUDA GPU (issue 26 target 3): the several-slot shrinks alone, tokens in slot order, at rank 64 (``--ranks``) and
512-8192 tokens on every shape, both flushes: ``torch._grouped_mm`` over the slots' runs (what
``_launch_grouped`` runs; CUTLASS on sm90, bfloat16 out) against ``shrink_kernel`` (``triton_backend._shrink``,
float32 atomics into a zeroed workspace, the zeroing timed with it) on token tiles of 64 and 128, slices of ``K``
of 512 to all of it, 4 and 8 warps; ``kit`` marks the tiles ``pick_tiles`` gives there. Both shrinks of the
forward: the gate/up one over ``x [T, H]`` (``gate_up_A [S, 1, 2R, H]``, ``2R`` columns) and the down one over
``act [T, n*F]`` (``a_cat [S, R, n*F]``, ``R`` columns). Each contender is checked against the float64 product of
each token with its own slot's factor before it is timed.

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=. python3 scripts/gpu/h200_shrinks.py --out $OUT/NAME.json
"""
from __future__ import annotations

import dataclasses
import sys
import time

import torch

import h200_pdl  # this folder's: the record, the timing and the products' reference (own_slot_products)
from inkling_lab import profile as pr, records
from inkling_lab.forward import triton_backend as tb

TOKENS = (512, 2048, 8192)
SLOTS = (4, 8)
VARIANTS = [(bm, kc, w) for bm in (64, 128) for kc in (512, 1024, 2048, 0) for w in (4, 8)]
"""``(sbm, k_chunk, swarps)``; ``k_chunk`` 0: all of ``K`` in one program."""


def variant_name(bm: int, kc: int, warps: int) -> str:
    return f"tri_{bm}_{kc or 'all'}_w{warps}"


def shrink_operands(ops, x: torch.Tensor, act: torch.Tensor, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, a)`` of ``side`` ``"up"`` (``x [T, H]``, ``gate_up_A``'s ``[S, 2R, H]``) or ``"down"`` (``act [T, n*F]``,
    ``a_cat [S, R, n*F]``): each token's shrink is ``src[t] @ a[s(t)].T``."""
    return (x, ops.buffers[0][:, 0]) if side == "up" else (act, ops.a_cat)


def shrink_contenders(ops, x: torch.Tensor, act: torch.Tensor, p: tb.Plan, side: str) -> dict:
    """``grouped`` and each ``VARIANTS`` launch of ``side``'s shrink (``shrink_operands``), each a callable returning
    its ``[T, N]`` product (``N = 2R`` up, as ``HALVES`` 2 blocks of ``R``; ``R`` down)."""
    src, a = shrink_operands(ops, x, act, side)
    (S, N, k), R = a.shape, ops.buffers[0].shape[2] // 2
    fns = {"grouped": lambda: torch._grouped_mm(src, a.transpose(1, 2), offs=p.offs)}
    dst = torch.zeros(src.shape[0], N, dtype=torch.float32, device=src.device)
    for bm, kc, w in VARIANTS:
        name = variant_name(bm, kc, w)
        q = dataclasses.replace(p, tiles=dataclasses.replace(p.tiles, sbm=bm, k_chunk=kc or k, swarps=w), fast={})

        def run(q=q, name=name):
            dst.zero_()
            tb._shrink(src, q, a, dst, dst, k=k, ldx=k, x_o_off=0, rank=R, outer=1, a_slot=N, a_outer=0,
                       halves=N // R, br=max(16, R), zero_mid=False, key=(name, side))
            return dst
        fns[name] = run
    return fns


def kit_variant(T: int, ops) -> str:
    """The ``VARIANTS`` name of the shrink tiles ``pick_tiles`` gives the several-slot path at ``T`` tokens."""
    t = tb.pick_tiles(T, ops.n * ops.intermediate * ops.hidden, ops.hidden)
    kc = t.k_chunk if t.k_chunk < ops.hidden else 0
    return variant_name(t.sbm or t.bm, kc, t.swarps)


def point(shape: str, R: int, S: int, T: int, flushes: dict, reps: int, device: str = "cuda", timer=None) -> list[dict]:
    """Both shrinks at one point: a row per side with each contender's relative error and (CUDA) medians."""
    sc = pr.Case.of(shape, R, S, T).scenario(device)
    ops = sc.sink.operands()
    p = tb.plan(ops, T, sc.batch, sc.x.device)
    if p.offs is None:
        p = dataclasses.replace(p, offs=tb.segment_offsets(p.slots.cpu(), ops.slots).to(sc.x.device))
    act = torch.randn(T, ops.n * ops.intermediate, dtype=sc.x.dtype, device=sc.x.device) * 0.5
    rows = []
    for side in ("up", "down"):
        fns = shrink_contenders(ops, sc.x, act, p, side)
        ref = h200_pdl.own_slot_products(*shrink_operands(ops, sc.x, act, side), p.slots.long())
        errs = {k: records.relative_error(fn().clone(), ref, "fro") for k, fn in fns.items()}
        ok = {k: fn for k, fn in fns.items() if errs[k] < 1e-2}
        us = timer(ok, flushes, reps) if timer else {}
        rows.append({"shape": shape, "R": R, "S": S, "T": T, "side": side, "kit": kit_variant(T, ops),
                     "rel_err": errs, "us": us})
    return rows


def main() -> int:
    ap = h200_pdl.run_arguments(__doc__, pr.SIDE_SHAPES, wheel=False)
    ap.add_argument("--ranks", default="64")
    args = ap.parse_args()
    t0 = time.time()
    rec = h200_pdl.record_head(h200_pdl.run_environment(), None, variants=VARIANTS, points=[])
    flushes = h200_pdl.both_flushes()
    for shape, R in ((s, int(r)) for r in args.ranks.split(",") for s in args.shapes.split(",")):
        for S in SLOTS:
            for T in TOKENS:
                for row in point(shape, R, S, T, flushes, args.reps, timer=h200_pdl.timed_medians):
                    rec["points"].append(row)
                    for fl in flushes:
                        got = {k.split("@")[0]: u for k, u in row["us"].items() if k.endswith("@" + fl)}
                        best = min(got, key=got.get)
                        print(f"{shape:<11} R{R} S{S} T{T:<4} {row['side']:<4} {fl:<5} grouped {got['grouped']:7.1f} "
                              f"kit {row['kit']} {got.get(row['kit'], float('nan')):7.1f} best {best} {got[best]:7.1f} "
                              f"({got[best] / got['grouped']:.3f}x grouped)  worst err {max(row['rel_err'].values()):.1e}",
                              flush=True)
                records.write_json(args.out, rec)
    return h200_pdl.finish_record(rec, args.out, t0)


if __name__ == "__main__":
    sys.exit(main())
