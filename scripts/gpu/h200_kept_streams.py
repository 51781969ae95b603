"""v24 on a CUDA GPU (issue 26 target 3): several kept slots, their GEMMs one cuBLAS ``torch.mm`` per run on
a stream each (``kept_streams``: ``triton_backend._launch_merged`` with ``Plan.run_streams``), against the
grouped GEMM on the same copies (``kept``: ``run_streams`` off), the kit's default path (``kit``: ``plan`` with nothing kept) and sglang 0.5.23's no-LoRA
base, at S 4 and 8, 2048-8192 tokens, R 16 (the copies carry no rank), every shape, both flushes. Every
contender is checked against the float64 reference at each point (``h200_pdl.time_point``) and, first,
launched twice and replayed from a graph twice into NaN-poisoned outputs (A and TP8, bfloat16).

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=.:scripts/gpu python3 experiments/kept_streams/h200_kept_streams.py \\
        --wheel WHEEL --out $OUT/h200_kept_streams.json
"""
from __future__ import annotations

import dataclasses
import sys

import torch

import h200_pdl  # this folder's (the script's own, first on sys.path): time_point, check_contender, record_head

from inkling_lab import profile as pr
from inkling_lab.batch import SlotBatch
from inkling_lab.forward import triton_backend as tb
from inkling_lab.forward.reference import reference_forward

SLOTS, TOKENS = (4, 8), (2048, 4096, 8192)


def contenders(sink, x, gammas, batch) -> dict:
    """``kit`` on the pool with nothing kept, then every slot kept at the batch's scalings and the batch
    forced onto the copies (``kept_operands``): ``kept`` and ``kept_streams`` on the same plan, ``run_streams``
    off and on."""
    sink.keep_merged(None)
    ops = sink.operands()
    p = tb.plan(ops, x.shape[0], batch, x.device)
    kept_ops, k = h200_pdl.kept_plan(tb, sink, p, x, batch)
    k, ks = dataclasses.replace(k, run_streams=False), dataclasses.replace(k, run_streams=True, fast={})
    return {"kit": lambda out=torch.empty_like(x): tb.launch(ops, x, gammas, p, out),
            "kept": lambda out=torch.empty_like(x): tb._launch_merged(kept_ops, x, gammas, k, out),
            "kept_streams": lambda out=torch.empty_like(x): tb._launch_merged(kept_ops, x, gammas, ks, out)}


def correctness() -> list[dict]:
    rows = []
    for shape in ("A", "Inkling-TP8"):
        for interleaved in (True, False):
            c = pr.Case.of(shape, 16, 4, 600, interleaved=interleaved, dtype="bfloat16")
            sc = c.scenario("cuda", seed=5 + int(interleaved))
            batch = SlotBatch.from_segments([150, 0, 320, 130], [0, 1, 2, 3], 4, lora_ranks=[16] * 4,
                                            scalings=[0.6, 1.0, 1.4, 0.8])
            ref = reference_forward(sc.sink.operands(), sc.x, sc.gammas, batch)
            rows.append(h200_pdl.checked_row(c, contenders(sc.sink, sc.x, sc.gammas, batch), ref,
                                             f"{shape} il={interleaved}"))
    return rows


def sweep(upstream_cls, reps: int, shapes) -> list[dict]:
    return h200_pdl.timed_cases(((f"{shape:<11} S{S} T{T:<4}", pr.Case.of(shape, 16, S, T))
                                 for shape in shapes for S in SLOTS for T in TOKENS), contenders, upstream_cls, reps)


def main() -> int:
    rec = h200_pdl.sweep_main(__doc__, ("kit", "kept", "kept_streams"), correctness, None, sweep)
    for fl in ("read", "write"):
        def within(k):
            return h200_pdl.within_base(rec["points"], k, fl)
        faster = sum(1 for r in rec["points"] if r["us"].get(f"kept_streams@{fl}", float("inf"))
                     < r["us"].get(f"kept@{fl}", float("inf")))
        print(f"{fl}: within 1.1x base (of {len(rec['points'])}): kit {within('kit')}, kept {within('kept')}, "
              f"kept_streams {within('kept_streams')}; kept_streams faster than kept at {faster}", flush=True)
    print(f"{rec['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
