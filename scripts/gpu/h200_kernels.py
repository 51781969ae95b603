"""Where the LoRA's time goes (issue 26 target 3, KERNEL_NOTES v39; target 1, v50): at the side by side's points
that miss target 3 (or ``--points``), ``torch.profiler``'s kernel table (``profile.benchmark.kernel_rows``: 10
forwards, warm L2, each kernel's device µs per forward, side streams counted whole) of the kit's routed plan, of the
kit's own plan without an adapter (``kit_bare``: what the same launches cost without the LoRA) and of sglang 0.5.23's
base (``upstream_wheel.UpstreamSink`` with no active adapter: ``forward_with_lora`` of
``srt/lora/trtllm_lora_temp/inkling_dense.py``), with the fields of the plan that pick the kit's path.

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=. python3 scripts/gpu/h200_kernels.py --wheel WHEEL --out $OUT/NAME.json \
        [--points A:16:1:8,Inkling:64:1:8]
"""
from __future__ import annotations

import sys

import torch

import h200_pdl  # this folder's: run_arguments, run_environment, record_head
from inkling_lab import profile as pr, records
from inkling_lab.forward import triton_backend as tb
from inkling_lab.profile.benchmark import kernel_rows

POINTS = [("B", 16, 4, 2048), ("B", 16, 8, 2048), ("B", 64, 4, 8192), ("B", 64, 4, 2048), ("Inkling", 64, 4, 8192),
          ("Inkling", 64, 8, 2048), ("A", 16, 4, 8192), ("A", 64, 8, 2048), ("A", 64, 8, 8192),
          ("Inkling-TP8", 16, 8, 8192), ("Inkling-TP8", 64, 4, 2048), ("Inkling-TP8", 64, 8, 8192), ("B", 16, 1, 2048)]
"""(shape, R, S, T): target 3's misses at faed0ed (and B's one-slot point on the line) across the paths."""


def plan_fields(p: tb.Plan) -> dict:
    """What picks the kit's several-slot path: the grouped mode, the one slot, and which of v36c's, v37's and
    v38's operands the plan carries."""
    return {"grouped": p.grouped, "single_slot": p.single_slot,
            **{k: getattr(p, k) is not None for k in ("cats", "down_runs", "act_runs")}}


def point(upstream_cls, shape: str, R: int, S: int, T: int, device: str = "cuda") -> dict:
    """One point's plan fields and the three kernel tables (``top`` 16)."""
    sc = pr.Case.of(shape, R, S, T).scenario(device)
    ops = sc.sink.operands()
    p = tb.plan(ops, T, sc.batch, sc.x.device)
    bare = tb.plan(ops, T, None, sc.x.device)
    out = torch.empty_like(sc.x)
    base = upstream_cls(sc.sink, sc.batch, min_slots=2)
    return {"shape": shape, "R": R, "S": S, "T": T, "plan": plan_fields(p),
            "kit": kernel_rows(lambda: tb.launch(ops, sc.x, sc.gammas, p, out), 16),
            "kit_bare": kernel_rows(lambda: tb.launch(ops, sc.x, sc.gammas, bare, out), 16),
            "sglang_base": kernel_rows(lambda: base.forward(sc.x, sc.gammas, lora=False), 16)}


def points(spec: str) -> list[tuple[str, int, int, int]]:
    """``--points``: ``shape:R:S:T`` comma-separated (empty: ``POINTS``)."""
    if not spec:
        return POINTS
    return [(sh, int(R), int(S), int(T)) for sh, R, S, T in (q.split(":") for q in spec.split(","))]


def main() -> int:
    ap = h200_pdl.run_arguments(__doc__, pr.SIDE_SHAPES)
    ap.add_argument("--points", default="", help="shape:R:S:T,... (default: target 3's misses, POINTS)")
    args = ap.parse_args()
    from inkling_lab.upstream_wheel import UpstreamSink

    rec = h200_pdl.record_head(h200_pdl.run_environment(), args.wheel, points=[])
    for shape, R, S, T in (q for q in points(args.points) if q[0] in args.shapes.split(",")):
        row = point(UpstreamSink, shape, R, S, T)
        rec["points"].append(row)
        records.write_json(args.out, rec)
        print(f"== {shape} R{R} S{S} T{T} plan {row['plan']}", flush=True)
        for who in ("kit", "kit_bare", "sglang_base"):
            print(f"  {who} total {sum(r['us_per_forward'] for r in row[who]):.1f} µs", flush=True)
            for r in row[who]:
                print(f"  {who:<11} {r['us_per_forward']:8.1f} x{r['calls_per_forward']:.0f} {r['kernel'][:80]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
