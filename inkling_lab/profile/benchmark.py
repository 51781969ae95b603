"""The benchmark grid: each case checked against the float64 reference, then timed per
backend against its roofline (issue 4), the profiler's kernel tables, and the records'
summary table."""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import torch

from .. import records
from ..batch import SlotBatch
from ..forward.reference import reference_forward
from ..lora import SharedSinkLoRA
from .roofline_model import GRID_RANKS, GRID_SLOTS, GRID_TOKENS, Case, roofline, target_ratio, upstream_us
from .timing import L2Flush, quantile, time_eager, time_graph


# -- backends as the benchmark runs them ------------------------------------------------

def backend_runner(backend: str, sink, x, gammas, batch, tiles=None) -> tuple[Callable[[], object], bool]:
    """``(fn, capturable)``: ``triton`` plans once and captures the launches;
    ``cublas_base`` is the base sink alone through cuBLAS (no LoRA work at all: our
    stand-in for upstream's plain path, and a lower bound for any cuBLAS-based LoRA
    forward); ``torch`` runs eagerly (it syncs with the host)."""
    if backend == "triton":
        from ..forward.triton_backend import launch, plan

        ops = sink.operands()
        p = plan(ops, x.shape[0], batch, x.device, tiles)
        out = torch.empty_like(x)
        return (lambda: launch(ops, x, gammas, p, out)), True
    if backend == "cublas_base":
        return (lambda: sink.base_forward(x, gammas)), True
    if backend == "torch":
        from ..forward.torch_backend import torch_forward

        ops = sink.operands()
        return (lambda: torch_forward(ops, x, gammas, batch)), False
    raise ValueError(f"unknown benchmark backend {backend!r}; choose triton, torch or cublas_base")


def check_correctness(cases: Iterable[Case], device: str = "cuda", seed: int = 1) -> list[dict]:
    """Relative error ``‖out - ref‖ / ‖ref‖`` of the triton backend against the float64
    reference (``forward.reference``, on the device; mixed and base-only tokens, a rank-0
    slot), output poisoned with NaN, the launch run twice (the second is the repeat
    path a graph captures)."""
    from ..forward.triton_backend import launch, plan

    rows = []
    for c in cases:
        sc = c.scenario(device, seed)
        sink, x, gammas = sc.sink, sc.x, sc.gammas
        R, S = c.geometry.max_rank, c.geometry.slots
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(-1, S, (c.T,), generator=gen)
        ranks = [R] * S
        ranks[-1] = 0 if S > 1 else R
        batch = SlotBatch.from_token_slots(ids, S, lora_ranks=ranks)
        ops = sink.operands()
        p = plan(ops, c.T, batch, x.device)
        launch(ops, x, gammas, p, torch.empty_like(x))
        out = torch.full_like(x, float("nan"))
        launch(ops, x, gammas, p, out)
        err = records.relative_error(out, reference_forward(ops, x, gammas, batch), "fro")
        rows.append({**c.record(), "rel_err": err, "ok": bool(err < 1e-2)})
    return rows


def correctness_cases(shapes: Sequence[str]) -> list[Case]:
    """Every layout and dtype at a few tokens on the first shape, each tile regime of
    ``pick_tiles`` (by token count; the cuBLAS path per-expert too), and two token
    counts on each other shape."""
    layouts = [(o, i, d) for o in (1, 2) for i in (True, False) for d in ("bfloat16", "float16")]
    cases = [Case.of(shapes[0], 16, 3, 37, outer=o, interleaved=i, dtype=d) for o, i, d in layouts]
    # every other shape at few tokens too: its weight-streaming split differs (TP8 splits K)
    cases += [Case.of(s, 16, 3, 9, outer=o, interleaved=i, dtype=d) for s in shapes[1:] for o, i, d in layouts]
    cases += [Case.of(shapes[0], 64, 4, T) for T in (5, 300, 1100, 4500)]
    cases += [Case.of(shapes[0], 16, 3, 300, outer=2, interleaved=False, dtype="float16")]
    cases += [Case.of(s, 64, 4, T) for s in shapes[1:] for T in (37, 100)]
    return cases


@dataclass
class Record:
    """One timed grid point."""

    case: dict
    backend: str
    median_us: float
    p10_us: float
    p90_us: float
    reps: int
    roofline_us: float
    ratio: float
    bound: str
    bytes: int
    flops: int
    target: float | None = None
    upstream_us: float | None = None
    extra: dict = field(default_factory=dict)


def time_case(c: Case, backend: str, ceilings: dict[str, float], flush: L2Flush, reps: int = 50,
              device: str = "cuda", base=None) -> Record:
    """Time one backend on one case (``base``: a sink whose weights to reuse, see ``Case.scenario``)."""
    sc = c.scenario(device, sink=base)
    fn, capturable = backend_runner(backend, sc.sink, sc.x, sc.gammas, sc.batch)
    times = (time_graph if capturable else time_eager)(fn, flush, reps)
    roof = roofline(c, **ceilings)
    med = statistics.median(times)
    return Record(c.record(), backend, med, quantile(times, 0.1), quantile(times, 0.9), reps, roof.us,
                  med / roof.us, roof.bound, roof.bytes, roof.flops, target_ratio(c.T),
                  upstream_us(c.shape, c.T, c.geometry.slots, c.geometry.max_rank))


def grid(shapes: Sequence[str] = ("A", "B"), ranks: Sequence[int] = GRID_RANKS,
         slots: Sequence[int] = GRID_SLOTS, tokens: Sequence[int] = GRID_TOKENS) -> list[Case]:
    return [Case.of(s, R, S, T) for s in shapes for R in ranks for S in slots for T in tokens]


def run_grid(cases: Sequence[Case], backends: Sequence[str], ceilings: dict[str, float],
             reps: int = 50, device: str = "cuda") -> list[Record]:
    """Time every case with every backend (tqdm progress)."""
    from tqdm.auto import tqdm

    flush = L2Flush(device)
    bases: dict[tuple, SharedSinkLoRA] = {}
    out = []
    for c, b in tqdm([(c, b) for c in cases for b in backends], desc="grid"):
        key = (c.shape, c.dtype, c.interleaved)
        if key not in bases:  # one shape's weights, drawn once
            bases[key] = SharedSinkLoRA.from_geometry(c.geometry, c.interleaved, getattr(torch, c.dtype), device)
        out.append(time_case(c, b, ceilings, flush, reps, device, base=bases[key]))
    return out


def kernel_table(c: Case, backend: str, device: str = "cuda", top: int = 12, tiles=None) -> list[dict]:
    """Which kernels take the time: ``torch.profiler`` over 10 forwards of case ``c``,
    CUDA time per kernel name (µs per forward), largest first. ``tiles``: the triton
    backend's ``Tiles`` (default: its own pick)."""
    sc = c.scenario(device)
    fn, _ = backend_runner(backend, sc.sink, sc.x, sc.gammas, sc.batch, tiles)
    return kernel_rows(fn, top)


def kernel_rows(fn: Callable[[], object], top: int = 12, forwards: int = 10) -> list[dict]:
    """``kernel_table``'s rows for any forward ``fn`` (warmed three times, then ``forwards`` profiled): each
    CUDA kernel's name, calls and device µs per forward, largest first, side streams' time counted whole."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(forwards):
            fn()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None)
        if us is None:
            us = ev.cuda_time_total
        if us > 0:
            rows.append({"kernel": ev.key[:90], "calls_per_forward": ev.count / forwards,
                         "us_per_forward": us / forwards})
    rows.sort(key=lambda r: -r["us_per_forward"])
    return rows[:top]


def load_record(path: str | os.PathLike) -> dict:
    """A record written by ``inkling-lab profile``; says which keys are missing if any."""
    return records.load_record(path, ("environment", "ceilings", "correctness", "records"), "profile record",
                               "`inkling-lab profile`")


def summary_table(records: Sequence[dict], backend: str = "triton") -> str:
    """Markdown: each grid point of ``backend`` against the roofline, the target and
    upstream (and the best other measured backend)."""
    by_case: dict[tuple, dict[str, dict]] = {}
    for r in records:
        c = r["case"]
        by_case.setdefault((c["shape"], c["R"], c["S"], c["T"]), {})[r["backend"]] = r
    lines = ["| shape | R | S | T | triton µs | roofline µs | ratio | target | met | best other µs | upstream µs |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(by_case):
        rows = by_case[key]
        if backend not in rows:
            continue
        r = rows[backend]
        others = [o["median_us"] for b, o in rows.items() if b != backend]
        met = "" if r["target"] is None else ("yes" if r["ratio"] <= r["target"] else "NO")
        other = f"{min(others):.1f}" if others else "-"
        up = "" if r.get("upstream_us") is None else f"{r['upstream_us']:.0f}"
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {r['median_us']:.1f} | {r['roofline_us']:.1f} "
                     f"| {r['ratio']:.2f} | {r['target'] or '-'} | {met} | {other} | {up} |")
    return "\n".join(lines)


