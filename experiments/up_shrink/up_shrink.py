"""v58 (issue 26 target 3, a probe): the up GEMM of many tokens in Triton, with one slot's gate/up shrink as more
column tiles of the same launch.

At 2048 tokens the kit's one-slot chain runs ``y = x w13_lin^T`` ``[T, n*2F]`` on cuBLAS and the shrink
``sh = x A_s^T`` ``[T, 2R]`` beside it on a side stream (``triton_backend._launch_single``). v56's probe
(``h100_up_cat_v56.json``) found cuBLAS's up GEMM alone at 304-361 TFLOP/s on A and the TP-8 slice at 2048 tokens
(``[2048, 768]`` by ``K = 6144``: 48-96 of cuBLAS's tiles for 132 multiprocessors), and the shrink beside it 5-16 µs
more. ``up_shrink`` is one grid of ``[BM, BN]`` tiles over ``[T, n*2F + 2R]``: the first ``cdiv(n*2F, BN)`` column tiles
stream ``w13_lin`` into ``y``, the rest stream ``A_s`` into ``sh``, each tile its own pipelined ``K`` loop over ``x``.
The shrink's tiles are more programs on a grid that leaves multiprocessors idle, not a second kernel beside it.

Nothing routes to it: ``h200_up_shrink.py`` times it beside cuBLAS's paths first.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def up_shrink_kernel(x_ptr, w_ptr, a_ptr, y_ptr, sh_ptr, T, N, R2, H,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    """``y [T, N] = x [T, H] w [N, H]^T`` and ``sh [T, R2] = x a [R2, H]^T`` (``H % BK == 0``), grouped tile order:
    ``GROUP_M`` token tiles walk the same column tiles while their weight rows sit in L2."""
    pid = tl.program_id(0)
    n_m = tl.cdiv(T, BM)
    n_w = tl.cdiv(N, BN)
    n_cols = n_w + tl.cdiv(R2, BN)
    group = GROUP_M * n_cols
    first_m = (pid // group) * GROUP_M
    size_m = tl.minimum(n_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    if pid_n < n_w:
        src, dst, cols_n, col0 = w_ptr, y_ptr, N, pid_n * BN
    else:
        src, dst, cols_n, col0 = a_ptr, sh_ptr, R2, (pid_n - n_w) * BN
    rows = pid_m * BM + tl.arange(0, BM)
    cols = col0 + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    row_ok, col_ok = rows < T, cols < cols_n
    xp = x_ptr + rows[:, None].to(tl.int64) * H + ks[None, :]
    wp = src + cols[:, None].to(tl.int64) * H + ks[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, H, BK):
        xt = tl.load(xp, mask=row_ok[:, None], other=0.0)
        wt = tl.load(wp, mask=col_ok[:, None], other=0.0)
        acc = tl.dot(xt, tl.trans(wt), acc)
        xp += BK
        wp += BK
    out = dst + rows[:, None].to(tl.int64) * cols_n + cols[None, :]
    tl.store(out, acc.to(dst.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def up_shrink(x: torch.Tensor, w: torch.Tensor, a: torch.Tensor | None, y: torch.Tensor | None = None,
              sh: torch.Tensor | None = None, *, bm: int = 128, bn: int = 128, bk: int = 64, group_m: int = 8,
              stages: int = 4, warps: int = 8) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(y [T, N], sh [T, 2R])``: ``x [T, H]`` times ``w [N, H]^T`` and ``a [2R, H]^T`` (``a`` None: ``y`` alone), one
    launch. ``H`` must be a multiple of ``bk``."""
    T, H = x.shape
    N, R2 = w.shape[0], 0 if a is None else a.shape[0]
    if H % bk:
        raise ValueError(f"up_shrink: H = {H} is not a multiple of the step bk = {bk}")
    y = x.new_empty(T, N) if y is None else y
    sh = (x.new_empty(T, R2) if sh is None else sh) if R2 else None
    grid = (triton.cdiv(T, bm) * (triton.cdiv(N, bn) + triton.cdiv(R2, bn)),)
    up_shrink_kernel[grid](x, w, w if a is None else a, y, y if sh is None else sh, T, N, R2, H,
                           BM=bm, BN=bn, BK=bk, GROUP_M=group_m, num_stages=stages, num_warps=warps)
    return y, sh
