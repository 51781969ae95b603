"""Compile the swept folds' kernels (``act_down.py``; v25's ``act_down_kernel`` with and without its LoRA,
``up_act_kernel``; v26's split and LoRA forms of ``up_act_kernel``) for sm_90 on a machine without a GPU and report what ptxas
made of each: registers, stack, spills, shared memory, how many programs of it fit a multiprocessor by
shared memory, whether the K loop streams through shared memory (``cp.async``, 16-byte and all), and
whether the products are wgmma or mma.sync. The launch arguments are those ``kept_forward`` and ``slot_forward`` (rank ``--rank``) pass for the
shapes of the side by side (A, B, Inkling, its TP-8 slice) at 8 and 32 tokens, captured instead of launched
and specialized by Triton's own binder for sm_90 (``experiments/single_launch/sm90_compile_check.py``'s
helpers). Triton here is the local one; the H200 runs its own 3.6, so counts can differ a little. A tile
whose shared memory is over the H200's 227 KB per block would fail to launch there: the sweep's tiles
(``h200_act_down.VARIANTS`` of the folds ``--folds``, default the run's ``SWEPT``) are checked by this before the run.

    PYTHONPATH=.:experiments/act_down:experiments/single_launch python experiments/act_down/sm90_report.py \\
        [--shapes A,TP8] [--tokens 8,32] [--folds down,up,slot] [--rank 64] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

import act_down as ad  # beside this file
import h200_act_down  # beside this file: the sweep's tiles
from sm90_compile_check import compile_for_sm90, resources  # experiments/single_launch's

SHAPES = {"A": (2, 1536, 768), "B": (2, 4096, 2048), "Inkling": (2, 6144, 3072), "TP8": (2, 6144, 384)}
SHARED_PER_BLOCK = 232448
"""The most dynamic shared memory one block may take on an H200 (227 KB)."""
SHARED_PER_SM = 233472
"""The shared memory of one H200 multiprocessor (228 KB)."""
KERNELS = {"down": "act_down_kernel", "up": "up_act_kernel", "slot": "act_down_kernel"}
RANK = 64
"""The slot folds' rank by default (the widest the side by side times: the most registers and shared memory
for the factors)."""


def captured(fold: str, n: int, H: int, F: int, T: int, tiles: ad.Tiles, rank: int = RANK):
    """``(kernel, grid, args, kwargs)`` of the Triton launch ``kept_forward`` (``down``, ``up``) or
    ``slot_forward`` (``slot``, at ``rank``) makes for one slot of these sizes (bf16, interleaved), its cuBLAS
    GEMMs run on the CPU on empty tensors."""
    bf16 = dict(dtype=torch.bfloat16)
    kept = SimpleNamespace(w13=torch.empty(1, n * 2 * F, H, **bf16), w2=torch.empty(1, H, n * F, **bf16))
    buffers = (torch.empty(1, 1, 2 * rank, H, **bf16), torch.empty(1, n, 2 * F, rank, **bf16), None,
               torch.empty(1, 1, H, rank, **bf16))
    ops = SimpleNamespace(kept=kept, n=n, intermediate=F, hidden=H, interleaved=True, shared_outer=True,
                          buffers=buffers, a_cat=torch.empty(1, rank, n * F, **bf16),
                          w13_lin=torch.empty(n * 2 * F, H, **bf16), w2=torch.empty(n, H, F, **bf16),
                          w2_lin=torch.empty(n * F, H, **bf16), dtype=torch.bfloat16, device=torch.device("cpu"))
    x, gammas = torch.zeros(T, H, **bf16), torch.zeros(T, n, **bf16)
    seen, name = {}, KERNELS[fold]
    holder = ad.kernels if fold == "up" else ad  # the up fold launches the library's kernel
    real = getattr(holder, name)

    class Capture:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.update(grid=grid, args=args, kwargs=kwargs)

    setattr(holder, name, Capture())
    try:
        if fold == "slot":
            ad.slot_forward(ops, x, gammas, 0, torch.ones(1), torch.empty_like(x), tiles)
        else:
            ad.kept_forward(ops, x, gammas, 0, torch.empty_like(x), tiles, fold)
    finally:
        setattr(holder, name, real)
    return real, seen["grid"], seen["args"], seen["kwargs"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", default="8,32")
    ap.add_argument("--folds", default=",".join(h200_act_down.SWEPT))
    ap.add_argument("--rank", type=int, default=RANK)
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args()
    tmp = Path("/tmp/sm90_compile_check_act_down")
    tmp.mkdir(exist_ok=True)
    rows = []
    for shape in args.shapes.split(","):
        n, H, F = SHAPES[shape]
        for T in (int(t) for t in args.tokens.split(",")):
            for fold in args.folds.split(","):
                for name, v in h200_act_down.VARIANTS[fold].items():
                    fn, grid, a, kw = captured(fold, n, H, F, T, ad.tiles(T, **v), args.rank)
                    k = compile_for_sm90(a, kw, fn)
                    ptx, shared = k.asm["ptx"], k.metadata.shared
                    row = dict(shape=shape, T=T, R=args.rank if fold.startswith("slot") else None,
                               contender=h200_act_down.name(fold, name), programs=grid[0],
                               **resources(k.asm["cubin"], ptx, 0, tmp), shared=shared,
                               fits=shared <= SHARED_PER_BLOCK, per_sm_by_shared=SHARED_PER_SM // max(shared, 1),
                               cp_async=ptx.count("cp.async.cg") + ptx.count("cp.async.ca"),
                               cp_async_16=len(re.findall(r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], 0x10", ptx)),
                               wgmma=ptx.count("wgmma.mma_async"), mma_sync=ptx.count("mma.sync"))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["fits"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
