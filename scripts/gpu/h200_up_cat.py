"""v56 probe on a CUDA GPU (issue 26 target 3): the gate/up shrink as more rows of the up GEMM, before any path is
built on it. At 2048 and 8192 tokens the kit runs the shrink ``sh = x A_s^T`` as a GEMM of its own beside the up GEMM
``y = x w13_lin^T`` that reads the same ``x`` (``_launch_single``: cuBLAS on a side stream; ``_launch_grouped``:
``torch._grouped_mm`` over the slots' runs, the up GEMM on the side stream). Three ways timed at each point, as
CUDA graphs taking turns under both flushes:

- ``up``: the up GEMM alone, ``[T, n*2F]`` (the floor: no shrink at all);
- ``beside``: the kit's pair, the shrink beside the up GEMM (one slot: ``torch.mm``; several: the grouped GEMM);
- ``up_cat``: one cuBLAS GEMM over ``[w13_lin; A_g for each used slot g]`` ``[n*2F + G*2R, H]`` (a copy made once,
  outside the timing): ``y`` in the first ``n*2F`` columns, each used slot's shrink of every token after them
  (``G`` times the shrink's FLOPs for ``G`` slots, one launch and one read of ``x``);
- at one slot also (v56b) the pair arranged as the several-slot path has it: ``grouped_side``, the shrink as a grouped
  GEMM (one group: the batch's ``offs``) on the side stream; ``swapped``, the up GEMM on the side stream and ``torch.mm``'s shrink on this
  one; ``grouped_swapped``, the up GEMM on the side stream and the one-group grouped GEMM on this one.

Each contender's ``y`` and each token's own slot's ``sh`` are checked against the float64 products first; one that is
wrong is not timed.

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=.:scripts/gpu python3 scripts/gpu/h200_up_cat.py --out $OUT/NAME.json
"""
from __future__ import annotations

import dataclasses
import sys
import time

import torch

import h200_pdl  # this folder's: the record, the timing and the products' reference (own_slot_products)
from inkling_lab import profile as pr, records
from inkling_lab.forward import triton_backend as tb

TOKENS = (2048, 8192)
SLOTS = (1, 4)


def contenders(ops, x: torch.Tensor, p: tb.Plan) -> dict:
    """``up``, ``beside`` and ``up_cat`` for ``x [T, H]`` on plan ``p`` (tokens in slot order), each a callable returning
    ``(y [T, n*2F], sh [T, 2R] or None)``: ``sh[t]`` token ``t``'s product with its own slot's ``gate_up_A``."""
    ga = ops.buffers[0][:, 0]                                   # [S, 2R, H]
    T, N, R2 = x.shape[0], ops.w13_lin.shape[0], ga.shape[1]
    slots = p.slots.long()
    used = sorted(s for s in slots.unique().tolist() if s >= 0)
    w13_cat = torch.cat([ops.w13_lin, ga[used].reshape(-1, ops.hidden)])    # [n*2F + G*2R, H]
    y, y_cat, sh = (x.new_empty(T, N), x.new_empty(T, w13_cat.shape[0]), x.new_empty(T, R2))
    block = torch.full_like(slots, -1)                          # each token's slot's place among the used ones
    for g, s in enumerate(used):
        block[slots == s] = g
    cols = N + block.clamp(min=0)[:, None] * R2 + torch.arange(R2, device=x.device)

    def gemm():
        return torch.mm(x, ops.w13_lin.T, out=y)

    def up():
        return gemm(), None

    def up_cat():
        torch.mm(x, w13_cat.T, out=y_cat)
        return y_cat[:, :N], y_cat.gather(1, cols)

    def pair(shrink_on_side: bool, grouped: bool):
        """The up GEMM and the shrink, one of them on the side stream (``_Beside``); the shrink ``torch.mm`` (one slot)
        or ``torch._grouped_mm`` over the slots' runs (``p.offs``)."""
        def shrink():
            return torch._grouped_mm(x, ga.transpose(1, 2), offs=p.offs) if grouped else torch.mm(x, ga[used[0]].T, out=sh)

        def run():
            first, second = (shrink, gemm) if shrink_on_side else (gemm, shrink)
            side = tb._Beside(x)
            with side:
                a = first()
            b = second()
            side.join()
            return y, (a if shrink_on_side else b)
        return run

    if len(used) > 1:  # the kit's pair as _launch_grouped has it
        return {"up": up, "beside": pair(False, True), "up_cat": up_cat}
    # the kit's pair as _launch_single has it, then v56b's three other arrangements of it
    return {"up": up, "beside": pair(True, False), "up_cat": up_cat, "grouped_side": pair(True, True),
            "swapped": pair(False, False), "grouped_swapped": pair(False, True)}


def errors(fns: dict, x: torch.Tensor, ops, slots: torch.Tensor) -> dict:
    """Each contender's worst relative error (Frobenius) over ``y`` and, where it makes one, ``sh``, against float64."""
    y_ref = x.double() @ ops.w13_lin.double().T
    sh_ref = h200_pdl.own_slot_products(x, ops.buffers[0][:, 0], slots)
    out = {}
    for name, fn in fns.items():
        y, sh = fn()
        errs = [records.relative_error(y.clone(), y_ref, "fro")]
        if sh is not None:
            errs.append(records.relative_error(sh.clone(), sh_ref, "fro"))
        out[name] = max(errs)
    return out


def slot_ordered(shape: str, R: int, S: int, T: int, device: str = "cuda") -> tuple:
    """``(ops, x, p)`` at one point, every slot of ``S`` used, tokens in slot order: the plan with its runs' ``offs``
    (made here where its routing made none)."""
    sc = pr.Case.of(shape, R, S, T).scenario(device)
    ops = sc.sink.operands()
    p = tb.plan(ops, T, sc.batch, sc.x.device)
    if p.offs is None:
        p = dataclasses.replace(p, offs=tb.segment_offsets(p.slots.cpu(), ops.slots).to(sc.x.device))
    return ops, sc.x, p


def point(shape: str, R: int, S: int, T: int, flushes: dict, reps: int, device: str = "cuda", timer=None) -> dict:
    """One point (``slot_ordered``): each contender's error and (with ``timer``) medians."""
    ops, x, p = slot_ordered(shape, R, S, T, device)
    fns = contenders(ops, x, p)
    errs = errors(fns, x, ops, p.slots.long())
    ok = {k: fn for k, fn in fns.items() if errs[k] < 1e-2}
    return {"shape": shape, "R": R, "S": S, "T": T, "rel_err": errs, "us": timer(ok, flushes, reps) if timer else {}}


def main() -> int:
    ap = h200_pdl.run_arguments(__doc__, pr.SIDE_SHAPES, wheel=False)
    ap.add_argument("--ranks", default="16,64")
    ap.add_argument("--slots", default=",".join(map(str, SLOTS)))
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    args = ap.parse_args()
    t0 = time.time()
    rec = h200_pdl.record_head(h200_pdl.run_environment(), None, points=[])
    flushes = h200_pdl.both_flushes()
    for shape in args.shapes.split(","):
        for R in map(int, args.ranks.split(",")):
            for S in map(int, args.slots.split(",")):
                for T in map(int, args.tokens.split(",")):
                    row = point(shape, R, S, T, flushes, args.reps, timer=h200_pdl.timed_medians)
                    rec["points"].append(row)
                    for fl in flushes:
                        got = {k.split("@")[0]: u for k, u in row["us"].items() if k.endswith("@" + fl)}
                        print(f"{shape:<11} R{R:<2} S{S} T{T:<4} {fl:<5} " + " ".join(f"{k} {v:7.1f}" for k, v in got.items())
                              + (f"  up_cat/beside {got['up_cat'] / got['beside']:.3f}" if {"up_cat", "beside"} <= set(got)
                                 else "") + f"  worst err {max(row['rel_err'].values()):.1e}", flush=True)
                    records.write_json(args.out, rec)
    return h200_pdl.finish_record(rec, args.out, t0)


if __name__ == "__main__":
    sys.exit(main())
