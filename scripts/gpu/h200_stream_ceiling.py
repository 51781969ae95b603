"""How fast can one forward's weights be *read* at all, in the harness the kit is timed in?

At T <= 32 the forward is a weight stream (``KERNEL_NOTES.md``: the three launches and the
one-launch kernel both move shape A's 14 MB at ~0.6 TB/s, against a 4.2 TB/s copy ceiling
measured on 4 GiB). This measures, per shape, the base weights' bytes (``w13 [n, 2F, H]``
plus ``w2 [n, H, F]``, bf16) read cold after the same L2 flush (``profile.L2Flush``, read
mode) in a replayed CUDA graph (``profile.time_graph``), by:

* ``stream``: a Triton kernel that only reads the bytes (each program sums ``block``
  elements at a time in a grid-stride loop, and writes one float); the fastest of a small
  sweep of block sizes and programs per multiprocessor, its sum checked against torch's;
* ``torch_sum``: ``buffer.sum(dtype=float32)``, one torch reduction;
* ``copy``: ``dst.copy_(src)`` of the same bytes (reads and writes them);
* ``mm_up`` / ``mm_down``: the base's two cuBLAS GEMMs at one token, ``x [1, H] @ w13_lin.T``
  and ``act [1, n*F] @ w2_lin.T`` (what sglang's base runs), each alone.

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=. python3 scripts/gpu/h200_stream_ceiling.py --out $OUT/h200_stream_ceiling.json
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

from inkling_lab import profile as pr, records

SHAPES = {"A": (2, 1536, 768), "B": (2, 4096, 2048), "inkling": (2, 6144, 3072), "inkling-tp8": (2, 6144, 384)}
SWEEP = [(block, per_sm) for block in (2048, 8192) for per_sm in (2, 4, 8)]
"""(elements per load, programs per multiprocessor) tried for ``stream``."""


@triton.jit
def stream_kernel(src_ptr, partial_ptr, N, BLOCK: tl.constexpr):
    """Program ``p`` of ``P``: sums ``src[i]`` for the blocks ``p, p + P, ...`` in float32 and
    writes ``partial[p]`` (so the loads are live; the sum is checked against torch)."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(pid * BLOCK, N, programs * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(src_ptr + offs, mask=offs < N, other=0.0).to(tl.float32)
    tl.store(partial_ptr + pid, tl.sum(acc, axis=0))


def stream_sum(src: torch.Tensor, block: int, programs: int) -> tuple[torch.Tensor, callable]:
    """``(partial [programs] float32, launch)``: ``launch()`` enqueues the read of the flat
    ``src``; ``partial.sum()`` is then ``src``'s sum."""
    partial = torch.empty(programs, dtype=torch.float32, device=src.device)

    def launch() -> None:
        stream_kernel[(programs,)](src, partial, src.numel(), BLOCK=block)

    return partial, launch


def median_us(fn, flush: pr.L2Flush, reps: int) -> float:
    return statistics.median(pr.time_graph(fn, flush, reps))


def measure(shape: str, reps: int, flush: pr.L2Flush, sms: int) -> dict:
    n, H, F = SHAPES[shape]
    dev = "cuda"
    elems = n * 2 * F * H + n * H * F
    src = torch.randn(elems, device=dev, dtype=torch.bfloat16)
    want = src.double().sum().item()
    row: dict = {"shape": shape, "n": n, "H": H, "F": F, "bytes": 2 * elems}
    sweep = {}
    for block, per_sm in SWEEP:
        partial, launch = stream_sum(src, block, per_sm * sms)
        launch()
        torch.cuda.synchronize()
        got = partial.double().sum().item()
        if abs(got - want) > 1e-3 * max(1.0, abs(want)) + 1e-2 * elems ** 0.5:
            raise AssertionError(f"{shape}: stream kernel sum {got} != {want} (block {block}, {per_sm}/SM)")
        sweep[f"b{block}_p{per_sm}"] = median_us(launch, flush, reps)
    best = min(sweep, key=sweep.get)
    row["stream_sweep_us"] = sweep
    row["stream_best"] = best
    us = {"stream": sweep[best],
          "torch_sum": median_us(lambda: src.sum(dtype=torch.float32), flush, reps)}
    dst = torch.empty_like(src)
    us["copy"] = median_us(lambda: dst.copy_(src), flush, reps)
    w13_lin = torch.randn(n * 2 * F, H, device=dev, dtype=torch.bfloat16)
    w2_lin = torch.randn(H, n * F, device=dev, dtype=torch.bfloat16)
    x = torch.randn(1, H, device=dev, dtype=torch.bfloat16)
    act = torch.randn(1, n * F, device=dev, dtype=torch.bfloat16)
    us["mm_up"] = median_us(lambda: x @ w13_lin.T, flush, reps)
    us["mm_down"] = median_us(lambda: act @ w2_lin.T, flush, reps)
    row["us"] = us
    moved = {"stream": (1, us["stream"]), "torch_sum": (1, us["torch_sum"]), "copy": (2, us["copy"]),  # copy: read and written
             "mm_up+mm_down": (1, us["mm_up"] + us["mm_down"])}
    row["TBps"] = {k: round(times * row["bytes"] / (t * 1e-6) / 1e12, 3) for k, (times, t) in moved.items()}
    return row


def start(doc: str, argv: list[str] | None) -> tuple[argparse.Namespace, dict, dict, pr.L2Flush, int]:
    """What a weight-stream script of this folder starts with: its options (``--out``,
    ``--reps``, ``--shapes``; ``doc``'s first paragraph describes it), the record's
    environment (its command this run's own), this run's ceilings, the read flush and the
    multiprocessor count."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--shapes", default=",".join(SHAPES))
    args = p.parse_args(argv)
    env = records.environment("python3 " + " ".join(sys.argv))
    return args, env, pr.measure_ceilings(), pr.L2Flush("cuda"), torch.cuda.get_device_properties(0).multi_processor_count


def main(argv: list[str] | None = None) -> int:
    t0 = time.time()
    args, env, ceilings, flush, sms = start(__doc__, argv)
    rows = [measure(s, args.reps, flush, sms) for s in args.shapes.split(",")]
    for r in rows:
        print(f"{r['shape']:<12} {r['bytes'] / 1e6:7.1f} MB  " +
              "  ".join(f"{k} {v:7.1f} us" for k, v in r["us"].items()) + f"  TB/s {r['TBps']}", flush=True)
    path = records.write_json(args.out, {"environment": env, "ceilings": ceilings, "flush": "read",
                                         "reps": args.reps, "rows": rows, "seconds": time.time() - t0})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
