"""The tensor-parallel check over NCCL on two GPUs, recorded under data/tp/ (SPEC §7).

Shards seeded shared sinks and their LoRA pools over two ranks (both outer layouts,
both gate/up layouts; float64 and float32 at a small size, bf16 at preset A), runs the
forward on each GPU with the partial outputs summed by an NCCL all-reduce, and checks
the result against the unsharded module and the float64 reference. Then it times the
all-reduce of one layer's partial output ``[T, H]`` (bf16, H of presets A and B).

Run from the repository root (needs only torch; no network, no install):

    NCCL_NVLS_ENABLE=0 PYTHONPATH=. python3 scripts/gpu/tp_nccl_check.py --out data/tp

Without two GPUs, ``--dist-backend auto`` (the default) falls back to gloo on the CPU:
a dry run of the same logic. The record is ``<out>/<backend>_tp<tp>.json``.
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys

# NVLink multicast (NVLS) stays off on the lent machines; the ranks inherit this.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402

from inkling_lab import parallel, records  # noqa: E402  (needs only torch)

PRESETS, Geometry = parallel.PRESETS, parallel.Geometry

EXACT = Geometry(n=2, hidden=64, intermediate=128, rank=8, slots=3)
"""Small enough for the float64 reference to be quick; large enough for real GEMMs."""


def _nccl_version() -> str | None:
    try:
        return ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    except (AttributeError, RuntimeError):
        return None


def _devices() -> list[str]:
    if not torch.cuda.is_available():
        return [platform.processor() or platform.machine()]
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="data/tp", help="folder for the JSON record (default data/tp)")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--dist-backend", default="auto", choices=("auto", "nccl", "gloo"))
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--iters", type=int, default=50, help="timed all-reduce calls per shape")
    args = p.parse_args(argv)

    backend = parallel.resolve_dist_backend(args.dist_backend, args.tp)
    cases = (parallel.demo_cases(EXACT, torch.float64, args.tokens) + parallel.demo_cases(EXACT, torch.float32, args.tokens)
             + parallel.demo_cases(PRESETS["A"], torch.bfloat16, args.tokens))
    results = parallel.run_tp(cases, args.tp, backend)
    checks = [r.check(c.reference()) for r, c in zip(results, cases)]
    shapes = [(t, g.hidden) for g in (PRESETS["A"], PRESETS["B"]) for t in (1, 16, 256, 4096)]
    allreduce = parallel.measure_allreduce(args.tp, shapes, torch.bfloat16, backend, args.iters)

    print(f"tensor parallelism, tp={args.tp}, {backend} on {', '.join(_devices())}")
    print(parallel.format_checks(checks))
    print("all-reduce of the partial output [T, H] in bf16 (rank 0, median):")
    for r in allreduce:
        print(f"  H={r['hidden']:5} T={r['tokens']:5}: {r['bytes_per_token']} B/token, "
              f"{r['median_s'] * 1e6:9.1f} us, bus bandwidth {r['busbw_GBps']:8.2f} GB/s")
    passed = all(c["passed"] for c in checks)
    env = " ".join(f"{k}={os.environ[k]}" for k in ("NCCL_NVLS_ENABLE",) if k in os.environ)
    record = {
        "what": "tensor-parallel shared sink + LoRA: sharded forward with all-reduce vs unsharded and "
                "float64 reference (inkling_lab.parallel), and all-reduce timings",
        **records.environment(f"{env} PYTHONPATH=. python3 {shlex.join(sys.argv)}".strip()),
        "devices": _devices(), "nccl": _nccl_version(), "platform": platform.platform(),
        "tp": args.tp, "dist_backend": backend, "passed": passed, "checks": checks, "allreduce": allreduce,
    }
    path = os.path.join(args.out, f"{backend}_tp{args.tp}.json")
    records.write_json(path, record)
    print(f"{'PASSED' if passed else 'FAILED'}; record: {path}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
