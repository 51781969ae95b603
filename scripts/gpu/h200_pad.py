"""v59 probe on a CUDA GPU (issue 26 target 3): cuBLAS's base GEMMs with zero padding, before any path is built on it.

v58's probe (``h100_up_shrink_v58.json``) timed one cuBLAS GEMM over ``[w13_lin; A_s]`` padded with zero rows to 8448 at
B's 8192 tokens 2.2-2.3 % under the up GEMM alone over ``w13_lin``'s 8192 rows: more work in less time, so cuBLAS runs
another kernel there. If the kit's base GEMMs can be made faster than the same GEMMs in sglang's base by zeros alone,
the several-slot points of target 3 that sit 1-2 % over the line gain that much. Timed at each point, as CUDA graphs
taking turns under the read flush (medians):

- ``up+<p>``: ``y [T, n*2F + p] = x [T, H] w^T`` with ``w = [w13_lin; p zero rows]`` (``up+0``: the kit's up GEMM and
  sglang 0.5.23's, ``forward_with_lora`` in ``sglang/srt/lora/trtllm_lora_temp/inkling_dense.py``); the first ``n*2F``
  columns are the product whatever ``p`` is;
- ``down+<p>``: ``out [T, H] = act [T, n*F + p] w [n*F + p, H]`` with ``p`` zero columns of ``act`` and zero rows of
  ``w2_lin`` (``down+0``: the down GEMM, the kit's and that function's): the same product, a longer ``K``.

Each is checked against the float64 product first (the padded up GEMM's first ``n*2F`` columns); one that is wrong is
not timed.

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=.:scripts/gpu python3 scripts/gpu/h200_pad.py --out $OUT/NAME.json
"""
from __future__ import annotations

import sys
import time

import torch

import h200_pdl  # this folder's: the record and the timing
from inkling_lab import profile as pr, records

TOKENS = (2048, 8192)
PADS = (0, 64, 128, 256, 512)


def contenders(ops, x: torch.Tensor, act: torch.Tensor, pads=PADS) -> dict:
    """``up+<p>`` and ``down+<p>`` for each pad ``p``, each a callable returning its product (the up GEMM's first
    ``n*2F`` columns)."""
    N = ops.w13_lin.shape[0]
    fns = {}
    for p in pads:
        w13 = torch.cat([ops.w13_lin, ops.w13_lin.new_zeros(p, ops.hidden)])
        y = x.new_empty(x.shape[0], N + p)
        w2 = torch.cat([ops.w2_lin, ops.w2_lin.new_zeros(p, ops.hidden)])
        a = torch.cat([act, act.new_zeros(act.shape[0], p)], dim=1)
        out = x.new_empty(x.shape[0], ops.hidden)
        fns[f"up+{p}"] = lambda w13=w13, y=y: torch.mm(x, w13.T, out=y)[:, :N]
        fns[f"down+{p}"] = lambda a=a, w2=w2, out=out: torch.mm(a, w2, out=out)
    return fns


def errors(fns: dict, x: torch.Tensor, act: torch.Tensor, ops) -> dict:
    """Each contender's relative error (Frobenius) against its float64 product."""
    want = {"up": x.double() @ ops.w13_lin.double().T, "down": act.double() @ ops.w2_lin.double()}
    return {k: records.relative_error(fn().clone(), want[k.split("+")[0]], "fro") for k, fn in fns.items()}


def point(shape: str, T: int, flush, reps: int, device: str = "cuda", timer=None, pads=PADS) -> dict:
    """One point (the base weights alone: no adapter enters these GEMMs): each contender's error and (with ``timer``)
    medians."""
    sc = pr.Case.of(shape, 16, 1, T).scenario(device)
    ops = sc.sink.operands()
    gen = torch.Generator(device=sc.x.device).manual_seed(T)
    act = torch.randn(T, ops.w2_lin.shape[0], generator=gen, device=sc.x.device).to(sc.x.dtype)
    fns = contenders(ops, sc.x, act, pads)
    errs = errors(fns, sc.x, act, ops)
    ok = {k: fn for k, fn in fns.items() if errs[k] < 1e-2}
    return {"shape": shape, "T": T, "rel_err": errs, "us": timer(ok, {"read": flush}, reps) if timer else {}}


def main() -> int:
    ap = h200_pdl.run_arguments(__doc__, ("B", "Inkling", "A", "Inkling-TP8"), wheel=False)
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    args = ap.parse_args()
    t0 = time.time()
    rec = h200_pdl.record_head(h200_pdl.run_environment(), None, pads=list(PADS), points=[])
    flush = pr.L2Flush("cuda")
    for shape in args.shapes.split(","):
        for T in map(int, args.tokens.split(",")):
            row = point(shape, T, flush, args.reps, timer=h200_pdl.timed_medians)
            rec["points"].append(row)
            got = {k.split("@")[0]: u for k, u in row["us"].items()}
            for side in ("up", "down"):
                base = got.get(f"{side}+0")
                print(f"{shape:<11} T{T:<4} {side:<4} " + " ".join(
                    f"+{p} {got[f'{side}+{p}']:7.1f}" + (f" ({got[f'{side}+{p}'] / base:.3f})" if base and p else "")
                    for p in PADS if f"{side}+{p}" in got)
                    + f"  worst err {max(v for k, v in row['rel_err'].items() if k.startswith(side)):.1e}", flush=True)
            records.write_json(args.out, rec)
    return h200_pdl.finish_record(rec, args.out, t0)


if __name__ == "__main__":
    sys.exit(main())
