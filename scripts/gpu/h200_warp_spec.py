"""Does Triton 3.6's Hopper warp specialization stream the base weights faster than cuBLAS at
2-32 tokens? (issue 26 target 1; a measurement, no backend routes it)

Every kit kernel so far fed its MMAs from one group of warps that both issues the loads and
runs the products. Triton 3.6 also compiles ``tl.range(..., warp_specialize=True)`` for sm_90
(its ``add_hopper_warpspec`` pass: a producer warp group issuing TMA loads into a ring of
shared-memory buffers, consumer warp groups running wgmma, ``setmaxnreg`` between them).
This times the weight stream alone, as swap-AB GEMMs (the weight rows on the MMA's M side,
the tokens on N, padded to ``BT``), with and without it, against cuBLAS's two base GEMMs:

* ``up``: ``y [T, n*2F] = x [T, H] @ w13_lin.T`` (``w13_lin [n*2F, H]``);
* ``down``: ``out [T, H] = act [T, n*F] @ w2_lin`` (``w2 [n, H, F]`` read in place: K step
  ``kk`` is expert ``kk // F``, feature ``kk % F``).

Where a shape has fewer 64-row tiles than multiprocessors, K is split over a second grid axis;
each split stores its float32 partial sums and one torch reduction adds them, in the same graph
(atomics into a zeroed output would save nothing: one small launch either way; and Triton 3.6's
Hopper warp-specialization pass fails on a loop whose epilogue is an atomic add, compiled here). No LoRA,
no activation: the question is only whether the stream itself beats cuBLAS's, the margin a
LoRA forward faster than sglang's base would live in (KERNEL_NOTES.md, the v16 outcome).

Correctness first: every variant against the float64 reference on fresh random inputs.

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=. python3 scripts/gpu/h200_warp_spec.py --out $OUT/h200_warp_spec.json
"""
from __future__ import annotations

import itertools
import sys
import time
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from h200_stream_ceiling import SHAPES, median_us, start  # this folder's (the script's own, first on sys.path)
from inkling_lab import records

TOKENS = (8, 32)
BM = 64
"""Weight rows per program: one warp group's wgmma M."""


@dataclass(frozen=True)
class Variant:
    """One way to run a swap-AB GEMM: K step ``bk``, ``stages`` buffers, warp specialization
    ``ws``, K cut in ``splits``, ``warps`` per consumer (Triton adds the producer's)."""

    bk: int = 128
    stages: int = 4
    ws: bool = False
    splits: int = 1
    warps: int = 4

    @property
    def name(self) -> str:
        return f"k{self.bk}s{self.stages}x{self.splits}" + ("_ws" if self.ws else "")


@triton.jit
def swap_gemm_kernel(w_desc, x_desc, y_ptr, N, T, KW, ROW_STEP, K_PER_SPLIT,
                     BM: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr,
                     WS: tl.constexpr, PARTIAL: tl.constexpr):
    """Program ``(m, s)``: ``y[t, m*BM + i] (+)= sum_kk W[row(kk) + i, kk % KW] * x[t, kk]`` over
    split ``s``'s K steps, where ``row(kk) = (kk // KW) * ROW_STEP + m*BM`` (up: ``KW = H``,
    one block of rows; down: ``KW = F``, ``ROW_STEP = H``, expert ``kk // F``'s rows). ``PARTIAL``:
    split ``s`` stores its float32 sums at ``y[s]`` (``y [splits, T, N]``)."""
    pid_m = tl.program_id(0)
    k_lo = tl.program_id(1) * K_PER_SPLIT
    m0 = pid_m * BM
    acc = tl.zeros((BM, BT), dtype=tl.float32)
    for kk in tl.range(k_lo, k_lo + K_PER_SPLIT, BK, num_stages=STAGES, warp_specialize=WS):
        w = w_desc.load([(kk // KW) * ROW_STEP + m0, kk % KW])
        x = x_desc.load([0, kk])
        acc = tl.dot(w, x.T, acc)
    offs_m = m0 + tl.arange(0, BM)
    offs_t = tl.arange(0, BT)
    ptrs = y_ptr + tl.program_id(1) * T * N + offs_t[None, :] * N + offs_m[:, None]
    tl.store(ptrs, acc.to(y_ptr.dtype.element_ty), mask=(offs_t[None, :] < T) & (offs_m[:, None] < N))


def token_tile(T: int) -> int:
    """The tokens' N side: at least 16 (Triton's smallest dot), a power of two."""
    return max(16, triton.next_power_of_2(T))


def swap_gemm(w: torch.Tensor, x: torch.Tensor, kind: str, n: int, v: Variant):
    """``(out, launch)`` for ``kind`` ``"up"`` (``w = w13_lin [n*2F, H]``, ``x [T, H]``, out
    ``[T, n*2F]``) or ``"down"`` (``w = w2 [n, H, F]``, ``x = act [T, n*F]``, out ``[T, H]``);
    ``launch()`` enqueues it (where K is split, the kernel and the reduction of its partials)."""
    T, K = x.shape
    if kind == "up":
        rows, kw, step = w.shape[0], K, 0
        w2d = w
    else:
        rows, kw, step = w.shape[1], w.shape[2], w.shape[1]
        w2d = w.reshape(n * w.shape[1], w.shape[2])
    if kw % v.bk or K % (v.splits * v.bk) or (K // v.splits) % v.bk:
        raise ValueError(f"{kind}: K {K} (rows of {kw}) does not split into {v.splits} x {v.bk}")
    bt = token_tile(T)
    w_desc = TensorDescriptor.from_tensor(w2d, [BM, v.bk])
    x_desc = TensorDescriptor.from_tensor(x, [bt, v.bk])
    partial = v.splits > 1
    y = torch.empty(v.splits, T, rows, device=x.device, dtype=torch.float32 if partial else x.dtype)
    out = torch.empty(T, rows, device=x.device, dtype=x.dtype) if partial else y[0]
    grid = (triton.cdiv(rows, BM), v.splits)

    def launch() -> None:
        swap_gemm_kernel[grid](w_desc, x_desc, y, rows, T, kw, step, K // v.splits, BM=BM, BT=bt, BK=v.bk,
                               STAGES=v.stages, WS=v.ws, PARTIAL=partial, num_warps=v.warps, num_stages=v.stages)
        if partial:
            torch.sum(y, dim=0, out=out)  # float32 sums of bf16: out is written in its own dtype

    return out, launch


def reference(w: torch.Tensor, x: torch.Tensor, kind: str, n: int) -> torch.Tensor:
    """The float64 product ``swap_gemm`` computes."""
    w64, x64 = w.double(), x.double()
    if kind == "up":
        return x64 @ w64.T
    return x64 @ w64.permute(0, 2, 1).reshape(n * w.shape[2], w.shape[1])


def variants(rows: int, K: int, kw: int, sms: int) -> list[Variant]:
    """The sweep for one GEMM: K steps 128/256, 3-6 stages, with and without warp
    specialization, unsplit and (where the 64-row tiles are fewer than the multiprocessors)
    split so that the grid covers them."""
    tiles = triton.cdiv(rows, BM)
    splits = {1}
    if tiles < sms:
        want = triton.cdiv(sms, tiles)
        for s in range(want, 0, -1):
            if K % (s * 128) == 0:
                splits.add(s)
                break
    out = []
    for (bk, stages), ws, s in itertools.product(((128, 4), (128, 6), (256, 3)), (False, True), sorted(splits)):
        if kw % bk or K % (s * bk):
            continue
        out.append(Variant(bk=bk, stages=stages, ws=ws, splits=s))
    return out


def main(argv: list[str] | None = None) -> int:
    t0 = time.time()
    args, env, ceilings, flush, sms = start(__doc__, argv)
    med = lambda fn: median_us(fn, flush, args.reps)  # noqa: E731
    rows_out, checks, failures = [], [], []
    for shape in args.shapes.split(","):
        n, H, F = SHAPES[shape]
        gen = torch.Generator(device="cuda").manual_seed(sum(map(ord, shape)) + int(t0))  # fresh each run
        w13_lin = (torch.randn(n * 2 * F, H, device="cuda", generator=gen) / H ** 0.5).bfloat16()
        w2 = (torch.randn(n, H, F, device="cuda", generator=gen) / F ** 0.5).bfloat16()
        w2_lin = w2.permute(0, 2, 1).reshape(n * F, H).contiguous()  # cuBLAS's operand, as the base holds it
        for T in TOKENS:
            x = torch.randn(T, H, device="cuda", generator=gen).bfloat16()
            act = torch.randn(T, n * F, device="cuda", generator=gen).bfloat16()
            row = {"shape": shape, "T": T, "us": {}, "best": {}}
            row["us"]["cublas_up"] = med(lambda: x @ w13_lin.T)
            row["us"]["cublas_down"] = med(lambda: act @ w2_lin)
            row["us"]["cublas_both"] = med(lambda: (x @ w13_lin.T, act @ w2_lin))
            launches = {}
            for kind, w, inp, rows, K, kw in (("up", w13_lin, x, n * 2 * F, H, H),
                                               ("down", w2, act, H, n * F, F)):
                want = reference(w, inp, kind, n)
                for v in variants(rows, K, kw, sms):
                    key = f"{kind}_{v.name}"
                    try:
                        out, launch = swap_gemm(w, inp, kind, n, v)
                        launch()
                        torch.cuda.synchronize()
                        err = records.relative_error(out, want)
                    except Exception as e:  # a variant that does not compile is a result, not a crash
                        failures.append({"shape": shape, "T": T, "variant": key, "error": f"{type(e).__name__}: {e}"[:400]})
                        continue
                    checks.append({"shape": shape, "T": T, "variant": key, "rel_err": err})
                    if not err <= 1e-2:
                        failures.append({"shape": shape, "T": T, "variant": key, "error": f"rel err {err:.3g}"})
                        continue
                    row["us"][key] = med(launch)
                    launches[key] = launch
                for ws in (False, True):
                    mine = {k: t for k, t in row["us"].items() if k.startswith(kind + "_k") and k.endswith("_ws") == ws}
                    if mine:
                        row["best"][f"{kind}{'_ws' if ws else ''}"] = min(mine, key=mine.get)
            for ws in ("", "_ws"):
                up, down = row["best"].get("up" + ws), row["best"].get("down" + ws)
                if up and down:
                    row["us"]["both" + ws] = med(lambda: (launches[up](), launches[down]()))
            rows_out.append(row)
            print(f"{shape:<12} T {T:>2}  " + "  ".join(f"{k} {v:6.1f}" for k, v in row["us"].items()
                                                        if not k.startswith(("up_k", "down_k"))) +
                  f"  best {row['best']}", flush=True)
    for f in failures:
        print("FAILED", f, flush=True)
    path = records.write_json(args.out, {"environment": env, "ceilings": ceilings, "flush": "read", "reps": args.reps,
                                         "bm": BM,
                                         "checks": checks, "failures": failures, "rows": rows_out,
                                         "seconds": time.time() - t0})
    print(f"wrote {path}")
    return 1 if any("rel err" in f["error"] for f in failures) else 0


if __name__ == "__main__":
    sys.exit(main())
