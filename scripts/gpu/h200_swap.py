"""v56c probe on a CUDA GPU (issue 26 target 3): v56b's swapped pair in the whole one-slot forward, on and off.

v56b's side by side (``history/h100_side_by_side_v56b.json`` at bde289a, against dc8ae6e's pair, the ratios to the
base) took the points without ``_down_cat``'s row copy 2.5-3.7 % lower (B and the real model R 64 S 1 T 512), as its
probe had them, but not B R 16 S 1 T 2048: 1.068 -> 1.092-1.100x read, where the probe timed the pair alone at
0.98-1.00x the old one. The swapped chain also moved that copy (``_cat_rows``, slot ``s``'s down ``B^T`` into
``w2_cat``) from the side stream, beside the up GEMM, to this one, after the shrink. This times the forward both ways
in one process, as CUDA graphs taking turns under both flushes (``h200_pdl.timed_cases``), beside sglang 0.5.23's
no-LoRA base (``forward_with_lora`` of ``sglang/srt/lora/trtllm_lora_temp/inkling_dense.py`` with no active adapter):

- ``routed``: ``plan`` as routed (``swaps``: the up GEMM on the side stream, the one-group grouped shrink and the
  copy on this one);
- ``beside``: the same batch planned with ``SWAP_TOKENS`` out of reach (the shrink and the copy on the side stream,
  the up GEMM on this one: the routing before 41780e8).

Each is checked against the float64 reference at every point; the log names each arm's arrangement at each point, so
a routing that did not take the pair is seen.

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=.:scripts/gpu python3 scripts/gpu/h200_swap.py --wheel WHEEL \\
        --out $OUT/NAME.json [--shapes B,Inkling]
"""
from __future__ import annotations

import sys

import torch

import h200_pdl  # this folder's: the record, the timing, the checks
from inkling_lab import profile as pr
from inkling_lab.forward import triton_backend as tb
from inkling_lab.forward.reference import reference_forward

SHAPES = ("B", "Inkling")
RANKS = (16, 64)
TOKENS = (512, 2048)
CHECKS = (("B", 16, 515), ("Inkling", 64, 515))
"""The correctness pass: shape, rank and a token count past ``SWAP_TOKENS`` with a partial tile, both gate/up
layouts."""
OFF = 1 << 62
"""``SWAP_TOKENS`` while ``beside`` is planned: no batch reaches it."""


def plans(ops, T: int, batch, device) -> dict:
    """``{"routed": plan, "beside": plan}`` of one batch: as routed, and with ``swaps`` out of reach."""
    routed = tb.plan(ops, T, batch, device)
    on = tb.SWAP_TOKENS
    tb.SWAP_TOKENS = OFF
    try:
        beside = tb.plan(ops, T, batch, device)
    finally:
        tb.SWAP_TOKENS = on
    return {"routed": routed, "beside": beside}


def contenders(sink, x: torch.Tensor, gammas: torch.Tensor, batch) -> dict:
    """Each arm (``plans``) as a forward of no arguments into an output of its own; its arrangement printed."""
    ops = sink.operands()
    fns = {}
    for arm, p in plans(ops, x.shape[0], batch, x.device).items():
        print(f"  {arm}: {'swapped' if p.offs is not None else 'beside'}", flush=True)
        fns[arm] = (lambda p=p, out=torch.empty_like(x): tb.launch(ops, x, gammas, p, out))
    return fns


def correctness() -> list[dict]:
    """Both arms at ``CHECKS``, both gate/up layouts, one slot at scaling 0.7 in a pool with a rank-0 slot, against
    the float64 reference, graph replays included (``h200_pdl.checked_row``)."""
    rows = []
    for shape, R, T in CHECKS:
        for interleaved in (True, False):
            c = pr.Case.of(shape, R, 3, T, interleaved=interleaved)
            sc = c.scenario("cuda", seed=T + int(interleaved))
            one = h200_pdl.one_slot_batch(c.geometry, T)
            ref = reference_forward(sc.sink.operands(), sc.x, sc.gammas, one)
            fns = contenders(sc.sink, sc.x, sc.gammas, one)
            rows.append(h200_pdl.checked_row(c, fns, ref, f"{shape} R{R} T{T} il={interleaved}"))
    return rows


def sweep(upstream_cls, reps: int, shapes) -> list[dict]:
    """One slot at ``RANKS`` x ``TOKENS`` on each shape, timed (``h200_pdl.timed_cases``) -> the rows."""
    return h200_pdl.timed_cases(((f"{shape:<8} R{R:<2} T{T:<4}", pr.Case.of(shape, R, 1, T))
                                 for shape in shapes for R in RANKS for T in TOKENS), contenders, upstream_cls, reps)


def main() -> int:
    rec = h200_pdl.sweep_main(__doc__, ("read", "write"), correctness, None, sweep)
    print(f"{rec['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
