"""v48b on a CUDA GPU: the FMA stream of a few tokens (``few_fma.bare_forward``, no LoRA) against the kit's
few-token launches without an adapter and sglang's no-LoRA base (``forward_with_lora`` of
``srt/lora/trtllm_lora_temp/inkling_dense.py`` with no active adapter, added by ``h200_pdl.with_sglang_base``), at 2, 4
and 8 tokens on every shape.

Each contender is checked against the float64 reference without LoRA first (``h200_pdl.time_read_point``), then timed as
graphs taking turns under the read flush (medians); each row carries the shape's stream ceiling (``--ceiling``).

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=.:scripts/gpu:experiments/few_fma python3 experiments/few_fma/h200_few_fma.py \
        --wheel WHEEL --ceiling data/profiles/h100_stream_ceiling.json --out $OUT/h100_few_fma_v48b.json
"""
from __future__ import annotations

import sys
import time

import torch

import few_fma
import h200_pdl  # scripts/gpu's: time_read_point, the record's head, the stream ceilings
from inkling_lab import profile as pr, records
from inkling_lab.forward import triton_backend as tb

CONFIGS = {
    "fma_f2k256s6": dict(bf=2, bk=256, bh=4, dk=256, stages=6),
    "fma_f4k128s6": dict(bf=4, bk=128, bh=8, dk=128, stages=6),
    "fma_f2k128s8": dict(bf=2, bk=128, bh=4, dk=128, stages=8),
    "fma_f2k256s6w8": dict(bf=2, bk=256, bh=4, dk=256, stages=6, warps=8),
}
"""``bare_forward``'s tiles: ``f<bf>k<bk>s<stages>`` (``w8``: 8 warps), each column of a step kept apart (``v`` 1).
Compiled for sm_90 (Triton 3.9, Inkling, 8 tokens): the up kernel 56-106 registers, 20-30 KB of shared memory, a loop
step of 32-64 FFMA, 26-38 shared loads and one bf16 widening per operand, no shuffles."""
TOKENS = (2, 4, 8)


def contenders(upstream_cls):
    def fns_for(sink, ops, x, gammas, batch):
        T = x.shape[0]
        picked = tb.pick_tiles(T, ops.n * ops.intermediate * ops.hidden, ops.hidden)
        fns = h200_pdl.launches(ops, x, gammas, [("auto_bare_base", None, picked)])
        act = torch.empty(T, ops.n * ops.intermediate, dtype=x.dtype, device=x.device)
        for name, cfg in CONFIGS.items():
            fns[name + "_base"] = (lambda cfg=cfg, out=torch.empty_like(x): few_fma.bare_forward(
                x, gammas, ops.w13, ops.w2, ops.interleaved, act=act, out=out, **cfg))
        h200_pdl.with_sglang_base(fns, upstream_cls, sink, batch, x, gammas)
        return fns
    return fns_for


def main() -> int:
    ap = h200_pdl.run_arguments(__doc__, pr.SHAPES, ceiling=True)
    args = ap.parse_args()
    from inkling_lab.upstream_wheel import UpstreamSink

    t0 = time.time()
    ceiling = h200_pdl.stream_ceilings(args.ceiling)
    rec = h200_pdl.record_head(h200_pdl.run_environment(), args.wheel, candidates=CONFIGS)
    flush = pr.L2Flush("cuda")
    rec["sweep"] = []
    for shape in args.shapes.split(","):
        base = None
        for T in TOKENS:
            base, row = h200_pdl.time_read_point(pr.Case.of(shape, 16, 1, T), contenders(UpstreamSink), flush,
                                                 args.reps, base)
            row["stream_ceiling_us"] = ceiling[h200_pdl.CEILING[shape]]
            rec["sweep"].append(row)
            us, b = row["us"], row["us"]["sglang_base"]
            print(f"{shape:<11} T{T} base {b:6.1f} ceiling {row['stream_ceiling_us']:6.1f} "
                  + " ".join(f"{k.removesuffix('_base')} {u:6.1f} ({u / b:.3f})" for k, u in us.items()
                             if k != "sglang_base")
                  + "  worst err " + f"{max(row['rel_err'].values()):.1e}", flush=True)
        records.write_json(args.out, rec)
    return h200_pdl.finish_record(rec, args.out, t0)


if __name__ == "__main__":
    sys.exit(main())
