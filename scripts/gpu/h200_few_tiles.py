"""v48 on a CUDA GPU: 2-32 tokens through the three launches on GEMV-shaped tensor-core tiles.

At one token the GEMV kernels (v14, v47: a few weight rows a program across all of ``K``, big pipelined
steps) run 0.88-0.97x sglang's no-LoRA base on an H100, while 8 tokens on ``pick_tiles``' 16-token tiles
(32 rows of ``w13`` a program, 128-wide steps) run 1.02-2.1x it. This script asks whether the same
``up_kernel`` / ``down_kernel`` on tiles shaped like the GEMV's (4 or 8 features, 8 or 16 rows a
program, 256-1024-wide steps, 3-4 deep, a token tile of 8 at 8 tokens) close that gap. Triton 3.6 pads a
``tl.dot`` narrower than 16 on ``M`` or ``N`` (its ``min_dot_size`` is 1, 1, 16), so 8 weight rows are one
``m16n8k16`` MMA wide; the LoRA epilogues are the gathered
ones (``Tiles.gather``: no ``tl.dot`` over a ``K`` of ``bf < 16`` features).

1. Correctness first, against the float64 reference on fresh random inputs (``h200_pdl.check``: a mixed
   batch with a rank-0 slot, no adapter, graph replays, a device-resident batch, base-only tokens; bf16
   and fp16, both gate/up layouts, both outer layouts on A, two layouts on the others) at 8 and 32 tokens.
2. The sweep: at 8 and 32 tokens, R 16 S 1 and R 64 S 4 per shape, every candidate with its LoRA and
   without an adapter (``*_bare_base``: the stream alone), ``auto`` (what the kit routes), ``auto``'s
   tiles without an adapter (``auto_bare_base``) and sglang's no-LoRA base (``forward_with_lora`` of
   ``srt/lora/trtllm_lora_temp/inkling_dense.py`` with no active adapter, added by ``h200_pdl.with_sglang_base``),
   as graphs taking turns under the read flush, medians; each row's stream ceiling (``--ceiling``: this card's record).

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=.:scripts/gpu python3 scripts/gpu/h200_few_tiles.py --wheel WHEEL \
        --ceiling data/profiles/h100_stream_ceiling.json --out $OUT/h100_few_tiles_v48.json

``--check-only f4k512s4,f4k1024s3 --shapes Inkling-TP8`` runs point 1 alone for those candidates at those shapes (v49: the
check of ``_split_reduce``'s barrier on the tiles whose ``K`` split raced without it).
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, replace

import torch

import h200_pdl  # this folder's: the checks, time_read_point, the record's head, the stream ceilings
from inkling_lab import profile as pr, records
from inkling_lab.forward import triton_backend as tb

CANDIDATES = {
    "f4k512s4": tb.Tiles(8, 4, 8, 512, 128, 4, 4, gather=True),
    "f8k512s4": tb.Tiles(8, 8, 16, 512, 128, 4, 4, gather=True),
    "f8k256s4w2": tb.Tiles(8, 8, 16, 256, 128, 2, 4, gather=True),
    "f4k1024s3": tb.Tiles(8, 4, 8, 1024, 128, 4, 3, gather=True),
    "f16k512s3": tb.Tiles(8, 16, 16, 512, 128, 4, 3, gather=True),
    "f4k512s4p": tb.Tiles(8, 4, 8, 512, 128, 4, 4, gather=True, pdl=True),
    "f8k512s4p": tb.Tiles(8, 8, 16, 512, 128, 4, 4, gather=True, pdl=True),
}
"""v48's tiles (``bm, bf, bn, bk, k_chunk, warps, stages``), all with the gathered epilogues: ``f<bf>k<bk>s<stages>``
(``w2``: two warps; ``p``: the three launches chained by PDL, as ``use_pdl`` has them for one slot on A and B up
to 16 tokens, where ``auto``'s tiles may take it); the token tile as tall as the batch (``tiles``: 8 rows at 8
tokens, so the pipeline's buffers of ``x`` hold no padding). ``pick_tiles``' own few-token tile is
``Tiles(16, 16, 16, 128, 128, 2, 4)``; the old sweep (``h200_tiles.py``' ``SMALL``) had 16 and 32 features at
64-512-wide steps, never fewer than 16 features."""
TOKENS = (8, 32)
POINTS = ((16, 1), (64, 4))
"""(R, S) of the sweep's points: one slot at a low rank, and v14's R 64 S 4."""


def tiles(name: str, T: int) -> tb.Tiles:
    """Candidate ``name`` for ``T`` tokens: one token tile of all of them (``bm`` the next power of two, up to 32),
    so every weight row streams once."""
    t = CANDIDATES[name]
    return replace(t, bm=max(t.bm, 1 << (T - 1).bit_length())) if T <= 32 else t


def correctness(variants=None, shapes=None) -> list[dict]:
    """The pass of point 1: ``variants`` (default every candidate) at ``shapes`` (default every shape)."""
    return h200_pdl.checked_layouts(TOKENS, variants or CANDIDATES, lambda v, ops, x, gammas, batch, ref, ref_base, c: h200_pdl.check(
        ops, x, gammas, batch, tiles(v, x.shape[0]), ref, ref_base, c), shapes)


def contenders(upstream_cls):
    def fns_for(sink, ops, x, gammas, batch):
        T = x.shape[0]
        picked = tb.pick_tiles(T, ops.n * ops.intermediate * ops.hidden, ops.hidden)
        fns = h200_pdl.launches(ops, x, gammas, [("auto", batch, None), ("auto_bare_base", None, picked)]
                                + [(v, batch, tiles(v, T)) for v in CANDIDATES]
                                + [(v + "_bare_base", None, tiles(v, T)) for v in CANDIDATES])
        h200_pdl.with_sglang_base(fns, upstream_cls, sink, batch, x, gammas)
        return fns
    return fns_for


def main() -> int:
    ap = h200_pdl.run_arguments(__doc__, pr.SHAPES, ceiling=True)
    ap.add_argument("--check-only", metavar="CANDIDATES",
                    help="only the correctness pass, of these candidates (comma-separated) at --shapes' shapes")
    args = ap.parse_args()
    from inkling_lab.upstream_wheel import UpstreamSink

    t0 = time.time()
    ceiling = h200_pdl.stream_ceilings(args.ceiling)
    rec = h200_pdl.record_head(h200_pdl.run_environment(), args.wheel,
                               candidates={k: asdict(t) for k, t in CANDIDATES.items()})
    h200_pdl.record_checks(rec, correctness(args.check_only and args.check_only.split(","), args.shapes.split(",")),
                           args.out, t0)
    if args.check_only:
        return h200_pdl.finish_record(rec, args.out, t0)
    flush = pr.L2Flush("cuda")
    rec["sweep"] = []
    for shape in args.shapes.split(","):
        base = None
        for R, S in POINTS:
            for T in TOKENS:
                base, row = h200_pdl.time_read_point(pr.Case.of(shape, R, S, T), contenders(UpstreamSink), flush,
                                                     args.reps, base)
                row["stream_ceiling_us"] = ceiling[h200_pdl.CEILING[shape]]
                rec["sweep"].append(row)
                us, b = row["us"], row["us"]["sglang_base"]
                best = min((v for v in CANDIDATES if v in us), key=us.get, default=None)
                print(f"{shape:<11} R{R:<2} S{S} T{T:<2} base {b:6.1f} auto {us.get('auto', float('nan')) / b:.3f} "
                      f"auto_bare {us.get('auto_bare_base', float('nan')) / b:.3f}  "
                      + " ".join(f"{v} {us[v] / b:.3f}/{us.get(v + '_bare_base', float('nan')) / b:.3f}"
                                 for v in CANDIDATES if v in us) + f"  best {best}", flush=True)
            records.write_json(args.out, rec)
    return h200_pdl.finish_record(rec, args.out, t0)


if __name__ == "__main__":
    sys.exit(main())
