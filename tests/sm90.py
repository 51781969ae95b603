"""A kernel of the kit compiled for sm_90 (the H100's and H200's) on a machine without a GPU, and what the PTX says
of the width of its memory accesses.

``compile_for_sm90`` runs Triton's own binder and packer for a CUDA sm_90 target, then its compiler: the same
signature, constants and divisibility attributes a launch with these arguments would produce there (the values
matter only through ``% 16`` and ``== 1``). It needs ``@triton.jit`` functions compiled, not interpreted, so it runs
in a process of its own (``test_sm90_codegen.py``); ``experiments/``' sm_90 reports use it too. Triton here is the
local one, the GPU machines run their own: counts can differ a little, the widths of plain copies should not.

    python tests/sm90.py     # what test_sm90_codegen.py asserts, as JSON (widths, the split's barrier)
    python tests/sm90.py --forward B 512,2048   # every Triton launch of the default kit's forward there, a line each
"""
from __future__ import annotations

import json
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

TARGET = GPUTarget("cuda", 90, 32)


def compile_for_sm90(args, kwargs, fn):
    """``fn`` (a ``@triton.jit`` function) compiled for ``TARGET`` as ``fn[grid](*args, **kwargs)`` would be."""
    backend = make_backend(TARGET)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET, options=options.__dict__)


def access_widths(ptx: str) -> dict[str, list]:
    """The byte counts of the PTX's ``cp.async`` copies and the forms of its global loads and stores."""
    return {"cp_async": sorted({int(b, 0) for b in re.findall(r"cp\.async\.\w+\.shared\.global[^;]*?, (0x\w+|\d+)", ptx)}),
            "ld": sorted(set(re.findall(r"ld\.global[.\w]*", ptx))),
            "st": sorted(set(re.findall(r"st\.global[.\w]*", ptx)))}


def activation_widths() -> dict[str, dict]:
    """The reads of cuBLAS's ``y`` on an sm_90 (B's ``n 2, H 4096, F 2048``, 2048 tokens, bfloat16, rows interleaved):
    ``expand_act_kernel`` (``ONE_SLOT_TILES``' 32 x 64, R 16 and 64) and ``up_kernel``'s epilogue without the LoRA
    (64 x 128, 8 warps)."""
    import torch

    from inkling_lab.forward import kernels

    bf, (n, H, F, T) = torch.bfloat16, (2, 4096, 2048, 2048)
    y, g, act = torch.empty(T, n * 2 * F, dtype=bf), torch.empty(T, n, dtype=bf), torch.empty(T, n * F, dtype=bf)
    out = {}
    for R in (16, 64):
        sh, gb = torch.empty(T, 2 * R, dtype=bf), torch.empty(4, n, 2 * F, R, dtype=bf)
        k = compile_for_sm90((y, g, act, sh, gb, T, F, R, 1, n, 1, n * F, 0, 1.0, y, y, y),
                             dict(BM=32, BF=64, BR=R, INTERLEAVED=True, STAGES=2, RUNS=False, num_warps=4),
                             kernels.expand_act_kernel)
        out[f"expand_act_R{R}"] = access_widths(k.asm["ptx"])
    x, w13 = torch.empty(T, H, dtype=bf), torch.empty(n * 2 * F, H, dtype=bf)
    i32, f32 = torch.empty(T, dtype=torch.int32), torch.empty(T, 32)
    k = compile_for_sm90((x, w13, y, g, act, i32, f32, f32, w13, w13, f32, f32, i32, T, H, F, 16, 1, n, 1, 1, F, n * F),
                         dict(Y_IN=True, HAS_LORA=False, BM=64, BF=128, BK=64, BR=16, GROUP_M=8, INTERLEAVED=True,
                              SPLIT=1, num_warps=8), kernels.up_kernel)
    out["up_epilogue"] = access_widths(k.asm["ptx"])
    return out


def gemv_widths() -> dict[str, dict]:
    """One token's two GEMV kernels on the tiles ``gemv_for`` routes at Inkling's sizes (``n 2, H 6144, F 3072``,
    R 64, bfloat16, rows interleaved, PDL): v47's pipelined streams, whose weight steps should be 16-byte
    ``cp.async`` copies into shared memory."""
    import torch

    from inkling_lab.forward import kernels, triton_backend as tb

    bf, (n, H, F, R) = torch.bfloat16, (2, 6144, 3072, 64)
    t = tb.gemv_for(H, n * F)
    x, w13, w2 = torch.empty(1, H, dtype=bf), torch.empty(n * 2 * F, H, dtype=bf), torch.empty(n, H, F, dtype=bf)
    g, act, out = torch.empty(1, n, dtype=bf), torch.empty(1, n * F, dtype=bf), torch.empty(1, H, dtype=bf)
    i32, f32, sh = torch.empty(1, dtype=torch.int32), torch.empty(4), torch.empty(2 * R)
    gb, da, db = torch.empty(4, n, 2 * F, R, dtype=bf), torch.empty(4, n, R, F, dtype=bf), torch.empty(4, 1, H, R, dtype=bf)
    meta = dict(HAS_LORA=True, BR=R, PDL=True, STAGES=t.stages, num_warps=t.warps, num_stages=1)
    up = compile_for_sm90((x, w13, g, act, i32, f32, sh, gb, da, sh, H, F, R, 1, n, 0, 2, 1),
                          dict(BF=t.bf, BK=t.bk, **meta), kernels.gemv_up_kernel)
    down = compile_for_sm90((act, w2, out, i32, f32, sh, db, sh, H, F, R, 1, n, H * F, F),
                            dict(BH=t.bn, BK=t.dk, **meta), kernels.gemv_down_kernel)
    return {"gemv_up": {**access_widths(up.asm["ptx"]), "stages": t.stages},
            "gemv_down": {**access_widths(down.asm["ptx"]), "stages": t.stages}}


def split_reduce_order() -> dict[str, bool]:
    """``up_kernel``'s ``K`` split (``_split_reduce``) for sm_90 at the TP-8 slice's sizes (``n 2, H 6144, F 384``, 8
    tokens, bfloat16, no adapter) on v48's 8 x 8 tile (4 warps) and on ``pick_tiles``' own few-token tile: whether every
    read of the finished sum (``ld.volatile``) comes before a barrier that comes before the workspace's zeroing store.
    Without it the 8 x 8 tile read and zeroed the sum in different layouts, so one thread could zero an element another
    had yet to read: v48's wrong sums on an H100."""
    import torch

    from inkling_lab.forward import kernels, triton_backend as tb

    bf, (n, H, F, T) = torch.bfloat16, (2, 6144, 384, 8)
    x, w13, act = torch.empty(T, H, dtype=bf), torch.empty(n * 2 * F, H, dtype=bf), torch.empty(T, n * F, dtype=bf)
    g, i32, f32 = torch.empty(T, n, dtype=bf), torch.empty(T, dtype=torch.int32), torch.empty(T, 32)
    ws, cnt = torch.empty(T, n * 2 * F), torch.empty(1024, dtype=torch.int32)
    out = {}
    tiles = (("v48_8x8", tb.Tiles(8, 4, 8, 512, 128, 4, 4), 2), ("few_tokens", tb.pick_tiles(T, n * F * H, H), 6))
    for name, t, split in tiles:
        k = compile_for_sm90((x, w13, act, g, act, i32, f32, f32, w13, w13, f32, ws, cnt,
                              T, H, F, 16, 1, n, 1, 2, 1, n * F),
                             dict(Y_IN=False, HAS_LORA=False, BM=t.bm, BF=t.bf, BK=t.bk, BR=16, GROUP_M=8, INTERLEAVED=True,
                                  SPLIT=split, num_warps=t.warps, num_stages=t.stages), kernels.up_kernel)
        lines = k.asm["ptx"].splitlines()
        reads = [i for i, line in enumerate(lines) if "ld.volatile.global" in line]
        zero = next(i for i, line in enumerate(lines) if i > reads[-1] and re.search(r"\bst\.global", line))
        out[name] = any("bar.sync" in line for line in lines[reads[-1]:zero])
    return out


def forward_widths(shape: str, tokens) -> None:
    """Prints each distinct Triton launch of the default kit's forward (``triton_backend.launch`` on ``plan``'s own
    route, CPU tensors of the shape's real sizes, the launches captured instead of run) at R 16 / 64, S 1 / 4 and each
    of ``tokens``, compiled for sm_90, with its access widths (v43's audit)."""
    import torch

    from inkling_lab import profile as pr
    from inkling_lab.forward import triton_backend as tb

    launches, done, run = [], set(), tb._run
    tb._run = lambda kern, grid, args, fast=None, **meta: launches.append((kern, args, meta))  # captured, not run
    cases = [(R, S, T) for R in (16, 64) for S in (1, 4) for T in tokens]
    try:
        for R, S, T in cases:
            sc = pr.Case.of(shape, R, S, T).scenario("cpu")
            ops = sc.sink.operands()
            launches.clear()
            tb.launch(ops, sc.x, sc.gammas, tb.plan(ops, T, sc.batch, sc.x.device), torch.empty_like(sc.x))
            for kern, args, meta in launches:
                key = (kern.fn.__name__, json.dumps(meta, sort_keys=True, default=str))
                if key not in done:
                    done.add(key)
                    widths = access_widths(compile_for_sm90(args, meta, kern).asm["ptx"])
                    print(f"{shape} R{R} S{S} T{T} {key[0]} {key[1]} {widths}", flush=True)
    finally:
        tb._run = run


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--forward"]:
        forward_widths(sys.argv[2], [int(t) for t in sys.argv[3].split(",")])
    else:
        print(json.dumps({**activation_widths(), **gemv_widths(), "split_reduce_barrier": split_reduce_order()}))
