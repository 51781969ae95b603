"""``inkling-lab profile`` (and ``python -m inkling_lab.profile``): the correctness check,
then the grid, the side by side with upstream (``--vs-upstream WHEEL``) or the graph check
(``--graph-check``) on a CUDA GPU, each written as one JSON record; ``--show RECORD``
prints a recorded run's tables without a GPU, and with ``--against SECOND`` how a second pass of a
side by side agrees with it (``passes``)."""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import torch

from .. import records
from ..records import environment, write_json
from .graph_capture import graph_check
from .benchmark import check_correctness, correctness_cases, grid, kernel_table, run_grid, summary_table
from .roofline_model import GRID_RANKS, GRID_SLOTS, GRID_TOKENS, SHAPES, SIDE_SHAPES, SIDE_TOKENS, Case
from .passes import pass_agreement_text
from .side_by_side import BASE_SPREAD, base_outliers, kits, load_side_by_side, run_side_by_side, side_by_side_cases, \
    side_by_side_summary, side_by_side_table
from .timing import measure_ceilings


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,4,8, got {text!r}") from None


def register_cli(subparsers) -> argparse.ArgumentParser:
    """Add ``profile`` to an ``argparse`` subparsers object (``inkling-lab profile``)."""
    p = subparsers.add_parser(
        "profile", help="benchmark the batched forward on a CUDA GPU against the roofline",
        description="Correctness check first, then the grid (shapes x ranks x slots x tokens) per backend, "
                    "then a torch.profiler kernel table; writes one JSON record.")
    p.add_argument("--shapes", default=None,
                   help=f"comma-separated of {','.join(SHAPES)} (default A,B; with --vs-upstream all four)")
    p.add_argument("--ranks", type=_ints, default=list(GRID_RANKS), help="default 16,64")
    p.add_argument("--slots", type=_ints, default=list(GRID_SLOTS), help="default 1,4,8")
    p.add_argument("--tokens", type=_ints, default=None,
                   help="default 1,2,4,...,8192; with --vs-upstream 1,8,32,128,512,2048,8192")
    p.add_argument("--backends", default="triton,torch,cublas_base",
                   help="comma-separated of triton, torch, cublas_base")
    p.add_argument("--reps", type=int, default=50, help="timed replays per point (median reported)")
    p.add_argument("--out", default="data/profiles", help="folder for the JSON record")
    p.add_argument("--name", default=None, help="file name (default: <device>_<date>.json)")
    p.add_argument("--check-only", action="store_true", help="run the correctness check alone and record it")
    p.add_argument("--vs-upstream", metavar="WHEEL", default=None,
                   help="time the kit side by side with sglang 0.5.23's paths taken from this wheel file "
                        "(pip download --no-deps sglang==0.5.23) over the issue-15 grid; writes one record")
    p.add_argument("--graph-check", action="store_true",
                   help="capture the user-level forward with a device-resident batch in a CUDA graph, replay it "
                        "after in-place metadata updates, time the eager host cost; writes h200_graph.json")
    p.add_argument("--modes", default="read,write", help="L2 flush modes for --vs-upstream (default read,write)")
    p.add_argument("--show", metavar="RECORD", default=None,
                   help="print the table of a recorded run (e.g. data/profiles/h200_grid.json) and exit; no GPU needed")
    p.add_argument("--against", metavar="RECORD", default=None,
                   help="with --show on a side-by-side record: how a second pass of the same grid agrees with it "
                        "(each contender's run-to-run spread, the target verdicts that differ); no GPU needed")
    p.set_defaults(func=profile_command)
    return p


def profile_command(args: argparse.Namespace) -> int:
    if args.against and not args.show:
        print("--against compares a second pass with the record given to --show: "
              "inkling-lab profile --show FIRST.json --against SECOND.json", file=sys.stderr)
        return 2
    if args.against:
        try:
            first, second = (load_side_by_side(path) for path in (args.show, args.against))
            text = pass_agreement_text(first, second)
        except (OSError, ValueError) as exc:
            print(f"cannot compare the passes: {exc}", file=sys.stderr)
            return 2
        except (KeyError, TypeError, AttributeError, ZeroDivisionError) as exc:  # a point without its times
            print(f"cannot compare the passes: a point of {args.show} or {args.against} is not a side-by-side "
                  f"point ({type(exc).__name__}: {exc}); give two records written by inkling-lab profile --vs-upstream",
                  file=sys.stderr)
            return 2
        print(text)
        return 0
    if args.show:
        try:
            rec = records.load_record(args.show, ("environment", "ceilings"), "profile record", "`inkling-lab profile`")
        except (OSError, ValueError) as exc:
            print(f"cannot read the record: {exc}", file=sys.stderr)
            return 2
        env, ceil = rec["environment"], rec["ceilings"]
        if "points" in rec:  # a side-by-side record
            print(f"{env['device']}, {env['date']}, commit {env['git_commit']}; upstream {rec['upstream']['wheel']}")
            for kit in kits(rec):
                for mode in rec["modes"]:
                    print(f"{kit}, flush {mode}:\n" + side_by_side_summary(rec, mode, kit) + "\n\n"
                          + side_by_side_table(rec, mode, kit) + "\n\nsglang's base off its shape's median "
                          f"(over {BASE_SPREAD:.0%}):\n" + base_outliers(rec, mode, kit) + "\n")
            return 0
        print(f"{env['device']}, {env['date']}, torch {env['torch']}, triton {env['triton']}, commit {env['git_commit']}")
        print(f"ceilings: copy {ceil['copy_TBps']:.2f} TB/s, bf16 matmul {ceil['matmul_TFLOPs']:.0f} TFLOP/s\n")
        print(summary_table(rec["records"]))
        return 0
    if not torch.cuda.is_available():
        print("inkling-lab profile needs a CUDA GPU; the recorded H200 runs are in data/profiles/ "
              "(notebooks/06_profiling.ipynb plots them)", file=sys.stderr)
        return 2
    shapes = [s for s in (args.shapes or ",".join(SIDE_SHAPES if args.vs_upstream else ("A", "B"))).split(",") if s]
    args.tokens = args.tokens or list(SIDE_TOKENS if args.vs_upstream else GRID_TOKENS)
    bad = [s for s in shapes if s not in SHAPES]
    if bad:
        print(f"unknown shape(s) {bad}; choose from {sorted(SHAPES)}", file=sys.stderr)
        return 2
    backends = [b for b in args.backends.split(",") if b]
    command = "inkling-lab profile " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["profile"] else sys.argv[1:])
    env = environment(command)
    print(f"{env['device']}  torch {env['torch']}  triton {env['triton']}", flush=True)
    ceilings = measure_ceilings()
    print(f"ceilings: copy {ceilings['copy_TBps']:.2f} TB/s, bf16 matmul {ceilings['matmul_TFLOPs']:.0f} TFLOP/s",
          flush=True)
    if args.vs_upstream:
        return _vs_upstream_command(args, env, ceilings, shapes)
    if args.graph_check:
        rows = graph_check()
        path = write_json(Path(args.out) / (args.name or "h200_graph.json"), {"environment": env, "rows": rows})
        for r in rows:
            print(r)
        print(f"wrote {path}")
        return 0 if all(r["ok"] for r in rows) else 1
    checks = check_correctness(correctness_cases(shapes))
    worst = max((r["rel_err"] for r in checks), default=0.0)
    print(f"correctness: {len(checks)} cases, worst rel err {worst:.2e}", flush=True)
    if not all(r["ok"] for r in checks):
        print("correctness check FAILED; not timing", file=sys.stderr)
        return 1
    timed, kernels = [], []
    if not args.check_only:
        timed = run_grid(grid(shapes, args.ranks, args.slots, args.tokens), backends, ceilings, args.reps)
        probe = [Case.of(s, 64, 4, T) for s in shapes for T in (1, 8192)]
        kernels = [{"case": c.record(), "backend": b, "kernels": kernel_table(c, b)} for c in probe for b in backends]
    name = args.name or f"{env['device'].replace(' ', '_')}_{env['date'][:10]}.json"
    payload = {"environment": env, "ceilings": ceilings, "correctness": checks,
               "records": [asdict(r) for r in timed], "kernel_tables": kernels}
    path = write_json(Path(args.out) / name, payload)
    for r in checks:
        print(f"  {r['shape']} T={r['T']:<5} O={r['outer']} interleaved={r['interleaved']!s:<5} {r['dtype']:<8} "
              f"rel err {r['rel_err']:.1e}")
    print(summary_table(payload["records"]))
    print(f"wrote {path}")
    return 0


def _vs_upstream_command(args: argparse.Namespace, env: dict, ceilings: dict, shapes: Sequence[str]) -> int:
    from ..upstream_wheel import unpack

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inkling_lab" / "sglang-0.5.23"
    provenance = unpack(args.vs_upstream, cache)
    modes = [m for m in args.modes.split(",") if m]
    checks = check_correctness(correctness_cases(shapes))
    print(f"kit correctness: {len(checks)} cases, worst rel err {max(r['rel_err'] for r in checks):.2e}", flush=True)
    if not all(r["ok"] for r in checks):
        print("correctness check FAILED; not timing", file=sys.stderr)
        return 1
    path = Path(args.out) / (args.name or "h200_side_by_side.json")
    head = {"environment": env, "ceilings": ceilings, "upstream": provenance, "modes": modes, "reps": args.reps,
            "correctness": checks}
    points = run_side_by_side(side_by_side_cases(shapes, args.ranks, args.slots, args.tokens), ceilings,
                              args.reps, modes, checkpoint=lambda pts: write_json(path, {**head, "points": pts}))
    rec = {**head, "points": points}
    write_json(path, rec)
    for kit in kits(rec):
        for mode in modes:
            print(f"{kit}, flush {mode}:\n" + side_by_side_summary(rec, mode, kit))
    print(f"wrote {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m inkling_lab.profile ...``: the same as ``inkling-lab profile ...``."""
    parser = argparse.ArgumentParser(prog="inkling-lab")
    register_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["profile", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)
