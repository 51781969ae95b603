"""v24 (issue 26 target 3): several kept slots' GEMMs as one cuBLAS ``torch.mm`` per run, each run on a
stream of its own, in place of ``triton_backend._launch_merged``'s grouped GEMM on the gate/up side and its
serial ``torch.mm`` per run on the down side. The copies are those ``SharedSinkLoRA.keep_merged`` holds
(``KeptMerge``: ``w13 [K, n*2F, H]``, ``w2 [K, H, n*F]``); the activation is the kit's own ``up_kernel``
launch over every token, between the two sides. At 256-1024 rows a run, one run's GEMM does not fill the
H200's 132 multiprocessors; several at once might, where the grouped GEMM on the copies measured 1.1-1.9x
sglang's no-LoRA base (``h200_merge.json``, v22)."""
from __future__ import annotations

import torch

from inkling_lab.forward import triton_backend as tb

_STREAMS: dict[tuple[int, int], torch.cuda.Stream] = {}


def _stream(device: torch.device, i: int) -> torch.cuda.Stream:
    key = (device.index if device.index is not None else torch.cuda.current_device(), i)
    if key not in _STREAMS:
        _STREAMS[key] = torch.cuda.Stream(device)
    return _STREAMS[key]


def _per_run(x: torch.Tensor, runs, work) -> None:
    """``work(i, a, b)`` for each run ``(a, b)``: on CUDA the ``i``-th on its own stream, every stream
    first waiting for the current one, which then waits for them all; on the CPU one after another."""
    if not x.is_cuda:
        for i, (a, b) in enumerate(runs):
            work(i, a, b)
        return
    main = torch.cuda.current_stream(x.device)
    streams = [_stream(x.device, i) for i in range(len(runs))]
    for s, (i, (a, b)) in zip(streams, enumerate(runs)):
        s.wait_stream(main)
        with torch.cuda.stream(s):
            work(i, a, b)
    for s in streams:
        main.wait_stream(s)


def kept_streams(ops, x: torch.Tensor, gammas: torch.Tensor, p, out: torch.Tensor) -> torch.Tensor:
    """The forward of plan ``p`` (``grouped == "kept"``, several runs) on ``ops.kept``'s copies:
    ``y[a:b] = x[a:b] @ w13_s^T`` per run, the activation over all tokens, ``out[a:b] = act[a:b] @ w2_s^T``
    per run (``w2_s^T`` kept as ``[H, n*F]``, read transposed)."""
    T, H = x.shape
    n, F = ops.n, ops.intermediate
    kept, rows = ops.kept, p.merge_rows
    y = torch.empty(T, n * 2 * F, dtype=x.dtype, device=x.device)
    act = torch.empty(T, n * F, dtype=x.dtype, device=x.device)
    _per_run(x, p.runs, lambda i, a, b: torch.mm(x[a:b], kept.w13[rows[i]].T, out=y[a:b]))
    tb._up(ops, x, y, gammas, act, p, tb.Lora.none(x))
    _per_run(x, p.runs, lambda i, a, b: torch.mm(act[a:b], kept.w2[rows[i]].T, out=out[a:b]))
    return out
