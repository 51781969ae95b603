"""Timing on a CUDA device: the L2 evicted before each run, CUDA graphs replayed and timed
with CUDA events, the ceilings, and the host time of a call.

``time_graph``: a CUDA graph of the forward, replayed with the L2 evicted (``L2Flush``: a
256 MiB buffer read through it) before every replay, each replay timed with CUDA events;
the benchmark reports the median. The ``torch`` backend syncs with the host (it looks up
each slot's tokens), so it is timed eagerly the same way (``time_eager``).
``time_interleaved``: several graphs taking turns within every repetition.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch


class L2Flush:
    """Evicts the 60 MB L2 between timed runs by streaming a 256 MiB buffer through it.

    ``mode="read"`` (default) sums the buffer: the L2 is left holding clean lines, so
    the timed run starts cold and pays only for its own bytes. ``mode="write"``
    overwrites it instead, which leaves ~60 MB of dirty lines whose write-back the
    *timed* run then pays for (KERNEL_NOTES.md measures that artefact)."""

    def __init__(self, device: torch.device | str, mode: str = "read") -> None:
        if mode not in ("read", "write"):
            raise ValueError(f"L2Flush mode must be 'read' or 'write', got {mode!r}")
        self.mode = mode
        self.buf = torch.ones(64 << 20, dtype=torch.float32, device=device)

    def __call__(self) -> None:
        if self.mode == "read":
            self.buf.sum()
        else:
            self.buf.zero_()


def _timed(run: Callable[[], None], flush: L2Flush, reps: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        run()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush()
        start[i].record()
        run()
        end[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 for s, e in zip(start, end)]


def time_graph(fn: Callable[[], object], flush: L2Flush, reps: int = 50) -> list[float]:
    """µs of each replay of a CUDA graph of ``fn`` (L2 flushed before each)."""
    return _timed(capture(fn).replay, flush, reps)


def time_eager(fn: Callable[[], object], flush: L2Flush, reps: int = 50) -> list[float]:
    """µs of each eager call of ``fn`` (L2 flushed before each)."""
    return _timed(fn, flush, reps)


def measure_ceilings(device: torch.device | str = "cuda") -> dict[str, float]:
    """The two ceilings: a 4 GiB device-to-device copy (bytes read plus written) and
    an 8192³ bf16 matmul on random data; medians of 20 event-timed runs."""
    src = torch.randn(1 << 30, device=device)           # 4 GiB of float32
    dst = torch.empty_like(src)
    copy_ms = statistics.median(_ms(lambda: dst.copy_(src), 20))
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    mm_ms = statistics.median(_ms(lambda: a @ b, 20))
    del src, dst
    return {"copy_TBps": 2 * (4 << 30) / (copy_ms * 1e-3) / 1e12,
            "matmul_TFLOPs": 2 * 8192 ** 3 / (mm_ms * 1e-3) / 1e12}


def _ms(fn: Callable[[], object], reps: int) -> list[float]:
    for _ in range(3):
        fn()
    out = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e))
    return out



def capture(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``fn``, after two warm-up calls on a side stream (they compile and
    allocate, which a capture cannot)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile and allocate off the capture
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


def time_interleaved(graphs: dict[str, torch.cuda.CUDAGraph], flush: L2Flush, reps: int) -> dict[str, list[float]]:
    """µs of each graph's replays, the variants taking turns within every repetition
    (the order rotating), the L2 flushed before each replay."""
    names = list(graphs)
    for g in graphs.values():
        for _ in range(3):
            g.replay()
    ev = {k: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
          for k in names}
    for i in range(reps):
        for k in names[i % len(names):] + names[:i % len(names)]:
            flush()
            ev[k][i][0].record()
            graphs[k].replay()
            ev[k][i][1].record()
    torch.cuda.synchronize()
    return {k: [a.elapsed_time(b) * 1e3 for a, b in ev[k]] for k in names}



def quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def stats(times: Sequence[float]) -> dict[str, float]:
    """``median_us``, ``p10_us`` and ``p90_us`` of ``times``."""
    return {"median_us": statistics.median(times), "p10_us": quantile(times, 0.1), "p90_us": quantile(times, 0.9)}


def host_us(fn: Callable[[], object], calls: int) -> float:
    """Median host µs of ``calls`` calls of ``fn``, one after another, no sync between them."""
    per = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        per.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(per)
