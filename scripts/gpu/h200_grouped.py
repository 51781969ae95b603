"""v20 on a CUDA GPU (issue 26 target 3): several slots whose tokens run in slot order, each LoRA
product one grouped GEMM over the slots' runs (``triton_backend._launch_grouped``,
``torch._grouped_mm``: CUTLASS on sm90 in bfloat16), its ``epi`` (v20's ``fold`` mode left in v39), against the
multi-slot cuBLAS path with its Triton shrinks (``kit``), sglang 0.5.23's multi-slot path and its
no-LoRA base, at S 4 and 8, R 16 and 64, 512-8192 tokens on every shape, both flushes; each point
records what ``auto`` routes there (``routed``: ``grouped_mode``'s mode, or ``kit``); then each
launch of both paths alone at a few points.

1. Correctness first, against the float64 reference on fresh random inputs (bfloat16, both gate/up
   layouts, three runs of uneven length with an empty slot between them and scalings 0.6-1.4, 600
   tokens), the grouped launch launched twice and replayed from a graph twice into NaN-poisoned outputs.
2. The sweep; every contender is checked again at each point (``h200_pdl.time_point``).
3. ``--breakdown``: the launches alone (read flush).

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=. python3 scripts/gpu/h200_grouped.py --wheel WHEEL --out $OUT/NAME.json
"""
from __future__ import annotations

import dataclasses
import statistics
import sys

import torch

import h200_pdl  # this folder's (the script's own, first on sys.path): time_point, check_contender, sweep_main
from inkling_lab import profile as pr
from inkling_lab.batch import SlotBatch
from inkling_lab.forward import triton_backend as tb
from inkling_lab.forward.reference import reference_forward

MODES = ("epi",)
TOKENS = (512, 2048, 8192)
BREAKDOWN = [("A", 64, 4, 8192), ("B", 64, 4, 8192), ("Inkling-TP8", 64, 4, 2048)]


def grouped_plan(ops, x, batch):
    """The plan with its groups (``epi``) at any token count and rank: the routed plan, given
    ``segment_offsets``' fields where ``grouped_mode`` left them out or merges (v21)."""
    p = tb.plan(ops, x.shape[0], batch, x.device)
    if p.grouped in MODES:
        return p
    slots = p.slots.cpu()
    offs = tb.segment_offsets(slots, ops.slots)
    return p if offs is None else dataclasses.replace(p, merge_slots=None, runs=(), offs=offs.to(x.device), grouped="epi")


def contenders(ops, x, gammas, batch) -> dict:
    """``kit``: the plan without its groups (the multi-slot path); ``g_epi``: the grouped launch. (v42's ``kit_w8``,
    the same on 8 warps' shrinks, in ``h100_grouped_v42.json``, is ``kit`` since ``SHRINK_WARPS``.)"""
    p = grouped_plan(ops, x, batch)
    assert p.offs is not None, "the grouped plan was not made"
    old = dataclasses.replace(p, offs=None, grouped="", fast={})
    return {"kit": lambda out=torch.empty_like(x): tb.launch(ops, x, gammas, old, out),
            "g_epi": lambda out=torch.empty_like(x): tb._launch_grouped(ops, x, gammas, p, out)}


def correctness() -> list[dict]:
    rows = []
    for shape in ("A", "Inkling-TP8"):
        for interleaved in (True, False):
            c = pr.Case.of(shape, 16, 4, 600, interleaved=interleaved)
            sc = c.scenario("cuda", seed=7 + int(interleaved))
            x, gammas = sc.x, sc.gammas
            batch = SlotBatch.from_segments([150, 0, 320, 130], [0, 1, 2, 3], 4, lora_ranks=[16] * 4,
                                            scalings=[0.6, 1.0, 1.4, 0.8])
            ops = sc.sink.operands()
            ref = reference_forward(ops, x, gammas, batch)
            rows.append(h200_pdl.checked_row(c, contenders(ops, x, gammas, batch), ref, f"{shape} il={interleaved}"))
    return rows


def sweep(upstream_cls, reps: int, shapes) -> list[dict]:
    flushes = h200_pdl.both_flushes()

    routed = {}

    def fns_for(sink, ops, x, gammas, batch):
        mode = tb.grouped_mode(x.shape[0], ops, x.device, len(batch.active_slots()))
        # what auto runs at this point ("merge": v21's merged weights, timed by h200_merge.py)
        routed["at"] = "g_" + mode if mode in MODES else mode or "kit"
        fns = contenders(ops, x, gammas, batch)
        multi = h200_pdl.with_sglang_base(fns, upstream_cls, sink, batch, x, gammas)
        fns["sglang_multi"] = lambda: multi.forward(x, gammas)
        return fns

    rows = []
    for shape in shapes:
        base = None
        for R in (16, 64):
            for S in (4, 8):
                for T in TOKENS:
                    base, row = h200_pdl.time_point(pr.Case.of(shape, R, S, T), fns_for, flushes, reps, base)
                    row = {**row, "routed": routed["at"]}
                    rows.append(row)
                    us = row["us"]
                    for fl in flushes:
                        got = {k.split("@")[0]: u for k, u in us.items() if k.endswith("@" + fl)}
                        best = min((k for k in got if k.startswith("g_")), key=got.get)
                        print(f"{shape:<11} R{R:<2} S{S} T{T:<4} {fl:<5} " + " ".join(f"{k} {u:.1f}" for k, u in got.items())
                              + f"  {best} {got[best] / got['kit']:.3f}x kit, {got[best] / got['sglang_base']:.3f}x base",
                              flush=True)
    return rows


def breakdown(reps: int) -> list[dict]:
    """Each launch of the grouped path and of the Triton shrinks alone, read flush, at ``BREAKDOWN``."""
    flush, rows = pr.L2Flush("cuda"), []
    for shape, R, S, T in BREAKDOWN:
        sc = pr.Case.of(shape, R, S, T).scenario("cuda")
        x, gammas, batch = sc.x, sc.gammas, sc.batch
        ops = sc.sink.operands()
        n, F = ops.n, ops.intermediate
        ga, gb, da, db = ops.buffers
        p = tb.plan(ops, T, batch, x.device)
        offs = p.offs
        y = torch.mm(x, ops.w13_lin.T)
        act = torch.randn(T, n * F, dtype=x.dtype, device="cuda") * 0.1
        sh = torch._grouped_mm(x, ga[:, 0].transpose(1, 2), offs=offs)
        mid = torch._grouped_mm(act, ops.a_cat.transpose(1, 2), offs=offs)
        out = torch.empty_like(x)
        br = max(16, R)
        lora = tb.Lora(True, sh, gb, da, db, mid, R, 1, 0, br)
        f32 = torch.zeros(T, 2 * R, dtype=torch.float32, device="cuda")
        m32 = torch.zeros(T, R, dtype=torch.float32, device="cuda")
        key = ("bd",)
        fns = {"mm_up": lambda: torch.mm(x, ops.w13_lin.T, out=y),
               "mm_down": lambda: torch.mm(act, ops.w2_lin, out=out),
               "grouped_shrink_up": lambda: torch._grouped_mm(x, ga[:, 0].transpose(1, 2), offs=offs),
               "grouped_shrink_down": lambda: torch._grouped_mm(act, ops.a_cat.transpose(1, 2), offs=offs),
               "grouped_expand_up": lambda: torch._grouped_mm(sh, ops.w1_delta.transpose(1, 2), offs=offs),
               "grouped_expand_down": lambda: torch._grouped_mm(mid, db[:, 0].transpose(1, 2), offs=offs),
               "addmm_up": lambda: y.addmm_(x, ops.w13_lin.T),
               "triton_shrink_up": lambda: tb._shrink(x, p, ga, f32, m32, k=ops.hidden, ldx=ops.hidden, x_o_off=0,
                                                      rank=R, outer=1, a_slot=2 * R, a_outer=2 * R, halves=2, br=br,
                                                      zero_mid=False, key=("s1",)),
               "triton_shrink_down": lambda: tb._shrink(act, p, ops.a_cat, m32, m32, k=n * F, ldx=n * F, x_o_off=0,
                                                        rank=R, outer=1, a_slot=R, a_outer=0, halves=1, br=br,
                                                        zero_mid=False, key=("s2",)),
               "up_act": lambda: tb._up(ops, x, y, gammas, act, p, tb.Lora.none(x)),
               "up_act_expand": lambda: tb._up(ops, x, y, gammas, act, p, lora),
               "down_epilogue": lambda: tb._down(ops, act, out, p, lora, mid, key)}
        graphs = {}
        for k, fn in fns.items():
            try:
                fn()
                graphs[k] = pr.capture(fn)
            except Exception as exc:  # recorded, and the run goes on
                rows.append({"shape": shape, "R": R, "S": S, "T": T, "launch": k, "failure": f"{type(exc).__name__}: {exc}"[:300]})
                print(f"breakdown {shape} {k} FAILED: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        for k, v in pr.time_interleaved(graphs, flush, reps).items():
            rows.append({"shape": shape, "R": R, "S": S, "T": T, "launch": k, "us": statistics.median(v)})
            print(f"breakdown {shape:<11} R{R} S{S} T{T:<4} {k:<20} {statistics.median(v):7.1f} us", flush=True)
        del graphs, fns
    return rows


def main() -> int:
    rec = h200_pdl.sweep_main(__doc__, MODES, correctness, breakdown, sweep)
    for fl in ("read", "write"):
        pts = rec["points"]
        best = {k: sum(1 for r in pts if r["us"].get(f"{k}@{fl}", 1e9) < r["us"][f"kit@{fl}"]) for k in
                ("g_" + m for m in MODES)}
        base = {k: sum(1 for r in pts if r["T"] >= 2048 and r["us"].get(f"{k}@{fl}", 1e9) <= 1.1 * r["us"][f"sglang_base@{fl}"])
                for k in ("kit", *("g_" + m for m in MODES))}
        fastest = h200_pdl.routed_fastest(pts, fl, ("kit", *("g_" + m for m in MODES)))
        print(f"{fl}: faster than kit (of {len(pts)}): {best}; T>=2048 within 1.1x base: {base}; "
              f"routed within 1% of the fastest: {fastest}/{len(pts)}", flush=True)
    print(f"{rec['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
