"""Profiling the batched forward: the roofline model, the benchmark grid, a kernel
table, and JSON records (issue 4).

The roofline of one case is ``max(bytes / copy bandwidth, FLOPs / matmul rate)``,
with both ceilings measured on the device. ``case_bytes`` and ``case_flops`` state
the count so a reader can redo it by hand:

* bytes (each input read once, the output written once, element size ``es``):
  base weights ``es * (n*2F*H + n*H*F)``; for every slot some token uses, its pool
  slices ``es * (O*2R*H + n*2F*R + n*R*F + O*H*R)``; ``x`` and ``out``
  ``es * 2*T*H``; ``gammas`` ``es * T*n``.
* FLOPs (2 per multiply-add, at the pool's rank ``R``): the base ``2*T*H*n*2F``
  (up) plus ``2*T*n*F*H`` (down); the LoRA for the ``T_l`` tokens with a slot
  ``2*T_l*O*2R*H`` (gate/up shrink) ``+ 2*T_l*n*2F*R`` (expand) ``+ 2*T_l*n*F*R``
  (down shrink) ``+ 2*T_l*O*R*H`` (down expand). The SwiGLU is left out: a few
  FLOPs per feature, far under both terms.

Timing (``time_graph``): a CUDA graph of the forward, replayed with the L2 evicted
(``L2Flush``: a 256 MiB buffer read through it) before every replay, each replay
timed with CUDA events; the median is reported. The ``torch`` backend syncs with the host (it looks up each
slot's tokens), so it is timed eagerly the same way (``time_eager``).

Side by side (issue 15, ``--vs-upstream WHEEL``): at every point of the
``side_by_side_cases`` grid the kit and sglang 0.5.23's paths taken from its wheel
(``upstream_wheel``) are checked against ``reference_f64`` and timed as graphs taking
turns (``time_interleaved``) under both flush modes; ``side_by_side_rows(record)`` gives
plot-ready rows, ``side_by_side_table``/``side_by_side_summary`` the notes' tables.
``--graph-check``: the user-level forward captured with a device-resident batch.

Command line: ``inkling-lab profile --out data/profiles`` (``register_cli``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch

from . import records
from .records import environment, write_json
from .batch import SlotBatch
from .geometry import PRESETS

SHAPES = {name: (g.n, g.hidden, g.intermediate) for name, g in PRESETS.items() if name in ("A", "B")}
SHAPES.update({"Inkling": (2, 6144, 3072), "Inkling-TP8": (2, 6144, 384)})
"""The benchmark shapes ``name -> (n, H, F)``: A and B (issue 4), the real model and
its tensor-parallel-8 slice (``F = 3072 / 8`` per rank, issue 15)."""

GRID_TOKENS = tuple(2 ** i for i in range(14))  # 1 .. 8192
GRID_RANKS = (16, 64)
GRID_SLOTS = (1, 4, 8)
SIDE_SHAPES = ("A", "B", "Inkling", "Inkling-TP8")
SIDE_TOKENS = (1, 8, 32, 128, 512, 2048, 8192)
"""The side-by-side grid of issue 15 (with ``GRID_RANKS`` and ``GRID_SLOTS``)."""

UPSTREAM_ISSUE4 = Path(__file__).resolve().parents[1] / "data" / "profiles" / "upstream_issue4.json"
"""The upstream µs issue 4 printed (not measured here; the file says where they came from)."""


def issue4_upstream() -> dict:
    """``data/profiles/upstream_issue4.json``: ``ceilings``, ``multi_slot`` and ``one_slot`` rows."""
    return records.load_record(UPSTREAM_ISSUE4, ("source", "ceilings", "multi_slot"), "upstream record")


_ISSUE4 = issue4_upstream()
UPSTREAM_CEILINGS = _ISSUE4["ceilings"]
UPSTREAM = [(r["shape"], r["T"], r["S"], r["R"], r["upstream_us"], r["roofline_us"]) for r in _ISSUE4["multi_slot"]]
"""Issue 4's rows ``(shape, T, S, R, upstream µs, its roofline µs)``, read from the record."""
UPSTREAM_SINGLE_SLOT = {(r["shape"], r["T"]): r["upstream_us"] for r in _ISSUE4["one_slot"]}

TARGET_SMALL_T, TARGET_LARGE_T = 3.0, 1.2
"""Target ratio to the roofline: T <= 32 and T >= 2048 (issue 15; issue 4 had 1.3)."""
TARGET_VS_BASE_LARGE_T = 1.1
"""T >= 2048: at most this times sglang's no-LoRA base (T <= 32: faster than it)."""


@dataclass(frozen=True)
class Case:
    """One grid point: shape ``(n, H, F)``, pool rank ``R``, ``S`` slots (the tokens
    split evenly into ``S`` segments, segment ``i`` on slot ``i``), ``T`` tokens."""

    shape: str
    n: int
    H: int
    F: int
    R: int
    S: int
    T: int
    outer: int = 1
    dtype: str = "bfloat16"
    interleaved: bool = True

    @classmethod
    def of(cls, shape: str, R: int, S: int, T: int, **kw) -> "Case":
        if shape not in SHAPES:
            raise ValueError(f"unknown shape {shape!r}; choose one of {sorted(SHAPES)}")
        return cls(shape, *SHAPES[shape], R=R, S=S, T=T, **kw)

    @property
    def O(self) -> int:
        return self.n if self.outer != 1 else 1

    def segment_lengths(self) -> list[int]:
        """``T`` split evenly over ``S`` segments, the first ones one longer."""
        return [self.T // self.S + (i < self.T % self.S) for i in range(self.S)]

    @property
    def slots_used(self) -> int:
        return sum(1 for length in self.segment_lengths() if length)

    @property
    def element_size(self) -> int:
        return torch.empty(0, dtype=getattr(torch, self.dtype)).element_size()


def case_bytes(c: Case) -> int:
    """The fewest bytes one forward must move (module docstring)."""
    n, H, F, R, O, T = c.n, c.H, c.F, c.R, c.O, c.T
    weights = n * 2 * F * H + n * H * F
    pool = c.slots_used * (O * 2 * R * H + n * 2 * F * R + n * R * F + O * H * R)
    io = 2 * T * H + T * n
    return c.element_size * (weights + pool + io)


def case_flops(c: Case) -> int:
    """Useful FLOPs of one forward (module docstring); every token has a slot here."""
    n, H, F, R, O, T = c.n, c.H, c.F, c.R, c.O, c.T
    base = 2 * T * H * n * 2 * F + 2 * T * n * F * H
    lora = 2 * T * O * 2 * R * H + 2 * T * n * 2 * F * R + 2 * T * n * F * R + 2 * T * O * R * H
    return base + lora


@dataclass(frozen=True)
class Roofline:
    bytes: int
    flops: int
    memory_us: float
    compute_us: float

    @property
    def us(self) -> float:
        return max(self.memory_us, self.compute_us)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_us >= self.compute_us else "compute"


def roofline(c: Case, copy_TBps: float, matmul_TFLOPs: float) -> Roofline:
    """Bytes over the copy bandwidth and FLOPs over the matmul rate, in µs."""
    b, f = case_bytes(c), case_flops(c)
    return Roofline(b, f, b / (copy_TBps * 1e12) * 1e6, f / (matmul_TFLOPs * 1e12) * 1e6)


def target_ratio(T: int) -> float | None:
    """The issue's ceiling on measured/roofline at ``T`` (none between 32 and 2048)."""
    if T <= 32:
        return TARGET_SMALL_T
    if T >= 2048:
        return TARGET_LARGE_T
    return None


def upstream_us(shape: str, T: int, S: int, R: int) -> float | None:
    """Issue 4's upstream µs at this point, if it printed one."""
    for row in UPSTREAM:
        if row[:4] == (shape, T, S, R):
            return row[4]
    return None


# -- building a case --------------------------------------------------------------------

def build_case(c: Case, device: torch.device | str, seed: int = 0, base=None):
    """``(sink, x [T, H], gammas [T, n], batch)`` for case ``c``: seeded random base
    weights and pool (every slot at rank ``R``), unit-normal ``x``, gammas in (0, 1).

    ``base``, a ``SharedSinkLoRA`` of the same ``n, H, F``, layout and dtype, is reused
    (its weights kept, a new pool adopted) so a grid does not rebuild the weights."""
    from .lora import SharedSinkLoRA

    dtype = getattr(torch, c.dtype)
    n, H, F, R, S, O = c.n, c.H, c.F, c.R, c.S, c.O
    if base is not None and (base.n_shared_experts, base.hidden_size, base.intermediate_size,
                             base.interleaved, base.dtype) == (n, H, F, c.interleaved, dtype):
        sink = base
        sink.w1_delta = sink.a_cat = None  # a pool of another rank or slot count on the same weights
    else:
        sink = SharedSinkLoRA(n, H, F, interleaved=c.interleaved, dtype=dtype, device=device, seed=seed)
    gen = torch.Generator(device=device).manual_seed(seed + 1000 * c.T + 10 * c.R + c.S)

    def rnd(*shape: int, fan_in: int) -> torch.Tensor:
        return (torch.randn(shape, generator=gen, device=device) / fan_in ** 0.5).to(dtype)

    sink.set_lora_info(rnd(S, O, 2 * R, H, fan_in=H), rnd(S, n, 2 * F, R, fan_in=R),
                       rnd(S, n, R, F, fan_in=F), rnd(S, O, H, R, fan_in=R))
    x = rnd(c.T, H, fan_in=1)
    gammas = torch.rand(c.T, n, generator=gen, device=device).to(dtype)
    batch = SlotBatch.from_segments(c.segment_lengths(), list(range(S)), S, lora_ranks=[R] * S)
    return sink, x, gammas, batch


# -- timing -----------------------------------------------------------------------------

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
    return _timed(_capture(fn).replay, flush, reps)


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


# -- backends as the benchmark runs them ------------------------------------------------

def backend_runner(backend: str, sink, x, gammas, batch, tiles=None) -> tuple[Callable[[], object], bool]:
    """``(fn, capturable)``: ``triton`` plans once and captures the launches;
    ``cublas_base`` is the base sink alone through cuBLAS (no LoRA work at all: our
    stand-in for upstream's plain path, and a lower bound for any cuBLAS-based LoRA
    forward); ``torch`` runs eagerly (it syncs with the host)."""
    if backend == "triton":
        from .forward.triton_backend import launch, plan

        ops = sink.operands()
        p = plan(ops, x.shape[0], batch, x.device, tiles)
        out = torch.empty_like(x)
        return (lambda: launch(ops, x, gammas, p, out)), True
    if backend == "cublas_base":
        return (lambda: sink.base_forward(x, gammas)), True
    if backend == "torch":
        from .forward.torch_backend import torch_forward

        ops = sink.operands()
        return (lambda: torch_forward(ops, x, gammas, batch)), False
    raise ValueError(f"unknown benchmark backend {backend!r}; choose triton, torch or cublas_base")


def check_correctness(cases: Iterable[Case], device: str = "cuda", seed: int = 1) -> list[dict]:
    """Relative error ``‖out - ref‖ / ‖ref‖`` of the triton backend against the float64
    reference (``reference_f64``, on the device; mixed and base-only tokens, a rank-0
    slot), output poisoned with NaN, the launch run twice (the second is the repeat
    path a graph captures)."""
    from .forward.triton_backend import launch, plan

    rows = []
    for c in cases:
        sink, x, gammas, _ = build_case(c, device, seed)
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(-1, c.S, (c.T,), generator=gen)
        ranks = [c.R] * c.S
        ranks[-1] = 0 if c.S > 1 else c.R
        batch = SlotBatch.from_token_slots(ids, c.S, lora_ranks=ranks)
        ops = sink.operands()
        p = plan(ops, c.T, batch, x.device)
        launch(ops, x, gammas, p, torch.empty_like(x))
        out = torch.full_like(x, float("nan"))
        launch(ops, x, gammas, p, out)
        err = records.relative_error(out, reference_f64(ops, x, gammas, batch), "fro")
        rows.append({**asdict(c), "rel_err": err, "ok": bool(err < 1e-2)})
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


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def time_case(c: Case, backend: str, ceilings: dict[str, float], flush: L2Flush, reps: int = 50,
              device: str = "cuda", base=None) -> Record:
    """Time one backend on one case (``base``: a sink to reuse, see ``build_case``)."""
    sink, x, gammas, batch = build_case(c, device, base=base)
    fn, capturable = backend_runner(backend, sink, x, gammas, batch)
    times = (time_graph if capturable else time_eager)(fn, flush, reps)
    roof = roofline(c, **ceilings)
    med = statistics.median(times)
    return Record(asdict(c), backend, med, _quantile(times, 0.1), _quantile(times, 0.9), reps, roof.us,
                  med / roof.us, roof.bound, roof.bytes, roof.flops, target_ratio(c.T),
                  upstream_us(c.shape, c.T, c.S, c.R))


def grid(shapes: Sequence[str] = ("A", "B"), ranks: Sequence[int] = GRID_RANKS,
         slots: Sequence[int] = GRID_SLOTS, tokens: Sequence[int] = GRID_TOKENS) -> list[Case]:
    return [Case.of(s, R, S, T) for s in shapes for R in ranks for S in slots for T in tokens]


def run_grid(cases: Sequence[Case], backends: Sequence[str], ceilings: dict[str, float],
             reps: int = 50, device: str = "cuda") -> list[Record]:
    """Time every case with every backend (tqdm progress)."""
    from tqdm.auto import tqdm

    flush = L2Flush(device)
    bases: dict[tuple, object] = {}
    out = []
    for c, b in tqdm([(c, b) for c in cases for b in backends], desc="grid"):
        key = (c.shape, c.dtype, c.interleaved)
        if key not in bases:
            bases[key] = build_case(c.__class__(**{**asdict(c), "T": 1}), device)[0]
        out.append(time_case(c, b, ceilings, flush, reps, device, base=bases[key]))
    return out


def kernel_table(c: Case, backend: str, device: str = "cuda", top: int = 12, tiles=None) -> list[dict]:
    """Which kernels take the time: ``torch.profiler`` over 10 forwards of case ``c``,
    CUDA time per kernel name (µs per forward), largest first. ``tiles``: the triton
    backend's ``Tiles`` (default: its own pick)."""
    from torch.profiler import ProfilerActivity, profile

    sink, x, gammas, batch = build_case(c, device)
    fn, _ = backend_runner(backend, sink, x, gammas, batch, tiles)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None)
        if us is None:
            us = ev.cuda_time_total
        if us > 0:
            rows.append({"kernel": ev.key[:90], "calls_per_forward": ev.count / 10, "us_per_forward": us / 10})
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


# -- side by side with upstream (issue 15) ------------------------------------------------

def reference_f64(ops, x: torch.Tensor, gammas: torch.Tensor, batch: SlotBatch | None) -> torch.Tensor:
    """docs/reference.md#the-forward in float64 on ``x``'s device, from the pool buffers (not the derived
    operands): ``out [T, H]`` float64. The same sums as ``forward.reference`` (which
    loops per token on the CPU, too slow for the side-by-side grid), vectorized per slot."""
    from .sink import gate_up_rows

    f64, dev = torch.float64, x.device
    n, F = ops.n, ops.intermediate
    w13, w2 = ops.w13.detach().to(f64), ops.w2.detach().to(f64)
    xs, gs = x.detach().to(f64), gammas.detach().to(f64)
    gate_rows, up_rows = gate_up_rows(F, ops.interleaved, dev)
    y = torch.einsum("th,efh->tef", xs, w13)                       # [T, n, 2F]
    gate, up = y[..., gate_rows], y[..., up_rows]
    pool = None if batch is None or ops.buffers is None else [b.detach().to(f64) for b in ops.buffers]
    groups = []
    if pool is not None:
        slots = batch.token_slots().to(dev)
        for s in batch.active_slots():
            idx = torch.nonzero(slots == s).flatten()
            groups.append((s, idx, float(batch.scalings[s])))
        R = pool[1].shape[-1]
        for s, idx, sc in groups:
            ga, gb = pool[0][s], pool[1][s]
            for e in range(n):
                o = 0 if ga.shape[0] == 1 else e
                gate[idx, e] += sc * (xs[idx] @ ga[o, :R].T) @ gb[e, :F].T
                up[idx, e] += sc * (xs[idx] @ ga[o, R:].T) @ gb[e, F:].T
    act = torch.nn.functional.silu(gate) * up * gs[..., None]        # [T, n, F]
    out = torch.einsum("tef,ehf->th", act, w2)
    for s, idx, sc in groups:
        da, db = pool[2][s], pool[3][s]
        shrink = torch.einsum("tef,erf->ter", act[idx], da)           # [t, n, R]
        if db.shape[0] == 1:
            out[idx] += sc * shrink.sum(1) @ db[0].T
        else:
            out[idx] += sc * torch.einsum("ter,ehr->th", shrink, db)
    return out


def side_by_side_variants(sink, x, gammas, batch, S: int) -> dict[str, Callable[[], torch.Tensor]]:
    """The contenders at one point, each a capturable ``fn() -> out [T, H]``:
    ``kit_triton`` (this kit), ``sglang_multi`` (upstream's multi-slot Triton kernels;
    a one-slot batch gets a pool padded to two slots so they run), ``sglang_one_slot``
    (``S == 1`` only: upstream's cuBLAS path), ``sglang_base`` (upstream with no
    adapter active: the base sink alone). Upstream's paths need ``upstream_wheel.unpack`` first."""
    from .forward.triton_backend import launch, plan
    from .upstream_wheel import UpstreamSink

    ops = sink.operands()
    p = plan(ops, x.shape[0], batch, x.device)
    out = torch.empty_like(x)
    multi = UpstreamSink(sink, batch, min_slots=2)
    fns = {"kit_triton": lambda: launch(ops, x, gammas, p, out),
           "sglang_multi": lambda: multi.forward(x, gammas)}
    if S == 1:
        one = UpstreamSink(sink, batch)
        fns["sglang_one_slot"] = lambda: one.forward(x, gammas)
    fns["sglang_base"] = lambda: multi.forward(x, gammas, lora=False)
    return fns


def _capture(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
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


def side_by_side_case(c: Case, ceilings: dict[str, float], flushes: dict[str, L2Flush], reps: int,
                      device: str = "cuda", base=None, seed: int = 0) -> dict:
    """One point: every contender checked against ``reference_f64`` (with LoRA; the
    base against the reference without), then the correct ones timed interleaved
    under each flush mode. Fresh random pool, ``x`` and gammas per point."""
    sink, x, gammas, batch = build_case(c, device, seed=seed, base=base)
    fns = side_by_side_variants(sink, x, gammas, batch, c.S)
    ops = sink.operands()
    ref = reference_f64(ops, x, gammas, batch)
    ref_base = reference_f64(ops, x, gammas, None)
    errors, failures = {}, {}
    for k, fn in fns.items():
        try:
            fn()  # the first call compiles; the second takes the launch path that is timed
            out = fn()
            torch.cuda.synchronize()
        except Exception as exc:  # an upstream path that cannot run here is recorded, not fatal
            errors[k], failures[k] = float("nan"), f"{type(exc).__name__}: {exc}"[:500]
            continue
        errors[k] = records.relative_error(out, ref_base if k == "sglang_base" else ref, norm="fro")
    del ref, ref_base
    ok = {k for k, e in errors.items() if e == e and e < 1e-2}
    graphs = {k: _capture(fns[k]) for k in fns if k in ok}
    times = {mode: {k: _stats(v) for k, v in time_interleaved(graphs, fl, reps).items()}
             for mode, fl in flushes.items()}
    del graphs
    roof = roofline(c, **ceilings)
    return {"case": asdict(c), "roofline_us": roof.us, "bound": roof.bound, "bytes": roof.bytes, "flops": roof.flops,
            "rel_err": errors, "failures": failures, "times": times}


def _stats(times: Sequence[float]) -> dict[str, float]:
    return {"median_us": statistics.median(times), "p10_us": _quantile(times, 0.1), "p90_us": _quantile(times, 0.9)}


def side_by_side_cases(shapes: Sequence[str] = SIDE_SHAPES, ranks: Sequence[int] = GRID_RANKS,
                       slots: Sequence[int] = GRID_SLOTS, tokens: Sequence[int] = SIDE_TOKENS) -> list[Case]:
    return [Case.of(s, R, S, T) for s in shapes for R in ranks for S in slots for T in tokens]


def run_side_by_side(cases: Sequence[Case], ceilings: dict[str, float], reps: int = 30,
                     modes: Sequence[str] = ("read", "write"), device: str = "cuda",
                     checkpoint: Callable[[list[dict]], object] | None = None) -> list[dict]:
    """``side_by_side_case`` over ``cases``, one base sink per shape (new pool and
    inputs at every point), progress printed per shape; ``checkpoint(points so far)``
    after each shape, so a run cut short still leaves its finished shapes."""
    flushes = {m: L2Flush(device, m) for m in modes}
    bases: dict[str, object] = {}
    out = []
    for i, c in enumerate(cases):
        if c.shape not in bases:
            if checkpoint is not None and out:
                checkpoint(out)
            bases.clear()
            torch.cuda.empty_cache()
            bases[c.shape] = build_case(Case(**{**asdict(c), "T": 1}), device)[0]
            print(f"[{i}/{len(cases)}] shape {c.shape}", flush=True)
        out.append(side_by_side_case(c, ceilings, flushes, reps, device, bases[c.shape], seed=i))
    return out


UPSTREAM_VARIANTS = ("sglang_multi", "sglang_one_slot")
"""The upstream paths with LoRA the kit must beat (``sglang_base`` has none)."""


def side_by_side_rows(record: dict, flush: str = "read", kit: str = "kit_triton") -> list[dict]:
    """Viz-ready rows of a side-by-side record (pure: no GPU, no I/O): per point the
    case fields, ``roofline_us``, every contender's median µs (``None`` where it did
    not run or failed its check), the kit over the roofline (``ratio``), over the
    fastest upstream LoRA path (``vs_upstream``, < 1 is faster) and over the no-LoRA
    base (``vs_base``), and whether each of issue 15's targets is met at that point."""
    rows = []
    for p in record["points"]:
        c = p["case"]
        med = {k: v["median_us"] for k, v in p["times"][flush].items()}
        us = med.get(kit)
        ups = [med[k] for k in UPSTREAM_VARIANTS if k in med]
        best_up = min(ups) if ups else None
        base = med.get("sglang_base")
        row = {k: c[k] for k in ("shape", "n", "H", "F", "R", "S", "T")}
        row.update({"roofline_us": p["roofline_us"], "bound": p["bound"], "kit_us": us,
                    **{f"{k}_us": med.get(k) for k in ("sglang_multi", "sglang_one_slot", "sglang_base")},
                    "best_upstream_us": best_up,
                    "ratio": us / p["roofline_us"] if us else None,
                    "vs_upstream": us / best_up if us and best_up else None,
                    "vs_base": us / base if us and base else None,
                    "rel_err": p["rel_err"]})
        targets = {"beats_upstream": row["vs_upstream"] is not None and row["vs_upstream"] < 1.0}
        T = c["T"]
        if T <= 32:
            targets["roofline"] = row["ratio"] is not None and row["ratio"] <= TARGET_SMALL_T
            targets["beats_base"] = row["vs_base"] is not None and row["vs_base"] < 1.0
        elif T >= 2048:
            targets["roofline"] = row["ratio"] is not None and row["ratio"] <= TARGET_LARGE_T
            targets["beats_base"] = row["vs_base"] is not None and row["vs_base"] <= TARGET_VS_BASE_LARGE_T
        row["targets"] = targets
        row["met"] = all(targets.values())
        rows.append(row)
    return rows


def side_by_side_table(record: dict, flush: str = "read") -> str:
    """Markdown of ``side_by_side_rows``: µs per contender, the kit's ratios, the misses."""
    def f(v, fmt="{:.1f}"):
        return "-" if v is None else fmt.format(v)

    lines = [f"flush: {flush}; µs are medians of graph replays; ratio = kit / roofline; "
             "vs up = kit / fastest upstream LoRA path; vs base = kit / sglang's no-LoRA base",
             "",
             "| shape | R | S | T | kit µs | sglang multi µs | sglang 1-slot µs | sglang base µs | roofline µs "
             "| ratio | vs up | vs base | missed |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in side_by_side_rows(record, flush):
        missed = ", ".join(k for k, v in r["targets"].items() if not v)
        lines.append(f"| {r['shape']} | {r['R']} | {r['S']} | {r['T']} | {f(r['kit_us'])} | {f(r['sglang_multi_us'])} "
                     f"| {f(r['sglang_one_slot_us'])} | {f(r['sglang_base_us'])} | {f(r['roofline_us'])} "
                     f"| {f(r['ratio'], '{:.2f}')} | {f(r['vs_upstream'], '{:.2f}')} | {f(r['vs_base'], '{:.2f}')} "
                     f"| {missed} |")
    return "\n".join(lines)


def side_by_side_summary(record: dict, flush: str = "read") -> str:
    """How many points meet each target, per shape (for the notes)."""
    rows = side_by_side_rows(record, flush)
    out = ["| shape | points | beats upstream | T<=32 roofline | T<=32 beats base | T>=2048 roofline | T>=2048 vs base |",
           "|---|---|---|---|---|---|---|"]
    for shape in dict.fromkeys(r["shape"] for r in rows):
        rs = [r for r in rows if r["shape"] == shape]
        small = [r for r in rs if r["T"] <= 32]
        large = [r for r in rs if r["T"] >= 2048]

        def count(sel, key):
            return f"{sum(r['targets'][key] for r in sel)}/{len(sel)}"

        out.append(f"| {shape} | {len(rs)} | {count(rs, 'beats_upstream')} | {count(small, 'roofline')} "
                   f"| {count(small, 'beats_base')} | {count(large, 'roofline')} | {count(large, 'beats_base')} |")
    return "\n".join(out)


def load_side_by_side(path: str | os.PathLike) -> dict:
    """A side-by-side record (``inkling-lab profile --vs-upstream``)."""
    return records.load_record(path, ("environment", "ceilings", "upstream", "points"), "side-by-side record",
                               "`inkling-lab profile --vs-upstream WHEEL`")


# -- the user-level forward in a CUDA graph (issue 15 item 2) -------------------------------

def graph_check(shape: str = "A", R: int = 16, S: int = 4, tokens: Sequence[int] = (1, 8, 32, 128),
                calls: int = 300, device: str = "cuda") -> list[dict]:
    """Per token count: ``sink(x, gammas, batch=resident, backend="triton")`` with a
    device-resident batch (``SlotBatch.to``), eagerly and captured in ``torch.cuda.graph``;
    the graph replayed, then replayed again after new segments, slots and inputs are
    written in place, each output against ``reference_f64``; and the eager host time
    per call (median over ``calls`` calls, no sync between them), for the resident batch
    and for a host batch (plan cached after the first call)."""
    rows = []
    for T in tokens:
        c = Case.of(shape, R, S, T)
        sink, x, gammas, _ = build_case(c, device, seed=T)
        gen = torch.Generator().manual_seed(T)

        def segments() -> SlotBatch:  # S+1 segments with random lengths and slots (-1: base only)
            cuts = torch.sort(torch.randint(0, T + 1, (S,), generator=gen)).values
            lengths = torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([T])]))
            slots = torch.randint(-1, S, (S + 1,), generator=gen)
            return SlotBatch.from_segments(lengths.tolist(), slots.tolist(), S, lora_ranks=[R] * (S - 1) + [0])

        first = segments()
        resident = first.to(device)
        ops = sink.operands()
        row = {"shape": shape, "R": R, "S": S, "T": T}
        ref = reference_f64(ops, x, gammas, first)
        # the first eager call launches, the second captures and replays, the third replays
        row["eager_rel_err"] = max(records.relative_error(sink(x, gammas, batch=resident, backend="triton"), ref,
                                                          "fro") for _ in range(3))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                sink(x, gammas, batch=resident, backend="triton")
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = sink(x, gammas, batch=resident, backend="triton")
        graph.replay()
        torch.cuda.synchronize()
        row["replay_rel_err"] = records.relative_error(static_out, reference_f64(ops, x, gammas, first), "fro")
        second = segments()
        for name in ("seg_indptr", "weight_indices", "lora_ranks", "scalings"):
            getattr(resident, name).copy_(getattr(second, name))
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        row["updated_replay_rel_err"] = records.relative_error(static_out, reference_f64(ops, x, gammas, second),
                                                                "fro")
        for label, batch in (("host_us_resident", resident), ("host_us_host_batch", second)):
            sink(x, gammas, batch=batch, backend="triton")
            torch.cuda.synchronize()
            row[label] = _host_us(lambda: sink(x, gammas, batch=batch, backend="triton"), calls)
            torch.cuda.synchronize()
        row["host_breakdown_us"] = _host_breakdown(sink, x, gammas, resident, calls)
        row["ok"] = all(row[k] < 1e-2 for k in ("eager_rel_err", "replay_rel_err", "updated_replay_rel_err"))
        rows.append(row)
        del graph
    return rows


def _host_breakdown(sink, x, gammas, batch, calls: int) -> dict[str, float]:
    """Median host µs of each step of one user-level call: the operands record, the
    input checks, the plan lookup, the replay of its graph (the whole of it, then its
    key, the input copies, the replay alone and the output's copy), the launches
    without a graph (and each kernel's own launch). Run after the calls that captured
    the graph."""
    from .forward import kernels
    from .forward.triton_backend import _replay, cached_plan, graph_key, launch
    from .sink import check_tokens

    ops = sink.operands()
    p = cached_plan(ops, x.shape[0], batch, x.device)
    graph, xs, gs, outs = p.fast[graph_key(ops, x)]
    steps = {"operands": lambda: sink.operands(),
             "check_tokens": lambda: check_tokens(x, gammas, n=ops.n, hidden=ops.hidden, dtype=ops.dtype,
                                                  device=ops.device),
             "cached_plan": lambda: cached_plan(ops, x.shape[0], batch, x.device),
             "replay": lambda: _replay(ops, x, gammas, p),
             "replay_graph_key": lambda: graph_key(ops, x),
             "replay_input_copies": lambda: torch._foreach_copy_([xs, gs], [x, gammas]),
             "replay_graph": graph.replay,
             "replay_clone_out": outs.clone,
             "launch": lambda: launch(ops, x, gammas, p),
             "empty_act": lambda: torch.empty(x.shape[0], ops.n * ops.intermediate, dtype=x.dtype, device=x.device)}
    one = torch.zeros(2, dtype=torch.int32, device=x.device)
    # one Triton launch alone: the slots kernel (6 arguments) at its smallest
    steps["one_small_triton_launch"] = lambda: kernels.slots_kernel[(1,)](one, one, one, one, one, HAS_PERM=False,
                                                                          BLOCK=16)
    out = {}
    for name, fn in steps.items():
        torch.cuda.synchronize()  # each step starts on an idle queue
        out[name] = _host_us(fn, calls)
    torch.cuda.synchronize()
    return out


def _host_us(fn: Callable[[], object], calls: int) -> float:
    """Median host µs of ``calls`` calls of ``fn``, one after another, no sync between them."""
    per = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        per.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(per)


# -- command line -----------------------------------------------------------------------

def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,4,8, got {text!r}") from None


def register_cli(subparsers) -> argparse.ArgumentParser:
    """Add ``profile`` to an ``argparse`` subparsers object (``inkling-lab profile``)."""
    p = subparsers.add_parser(
        "profile", help="benchmark the batched forward on a CUDA GPU against the roofline",
        description="Correctness check first, then the grid (shapes x ranks x slots x tokens) per backend, "
                    "then a torch.profiler kernel table; writes one JSON record.")
    p.add_argument("--shapes", default=None,
                   help=f"comma-separated of {','.join(SHAPES)} (default A,B; with --vs-upstream all four)")
    p.add_argument("--ranks", type=_ints, default=list(GRID_RANKS), help="default 16,64")
    p.add_argument("--slots", type=_ints, default=list(GRID_SLOTS), help="default 1,4,8")
    p.add_argument("--tokens", type=_ints, default=None,
                   help="default 1,2,4,...,8192; with --vs-upstream 1,8,32,128,512,2048,8192")
    p.add_argument("--backends", default="triton,torch,cublas_base",
                   help="comma-separated of triton, torch, cublas_base")
    p.add_argument("--reps", type=int, default=50, help="timed replays per point (median reported)")
    p.add_argument("--out", default="data/profiles", help="folder for the JSON record")
    p.add_argument("--name", default=None, help="file name (default: <device>_<date>.json)")
    p.add_argument("--check-only", action="store_true", help="run the correctness check alone and record it")
    p.add_argument("--vs-upstream", metavar="WHEEL", default=None,
                   help="time the kit side by side with sglang 0.5.23's paths taken from this wheel file "
                        "(pip download --no-deps sglang==0.5.23) over the issue-15 grid; writes one record")
    p.add_argument("--graph-check", action="store_true",
                   help="capture the user-level forward with a device-resident batch in a CUDA graph, replay it "
                        "after in-place metadata updates, time the eager host cost; writes h200_graph.json")
    p.add_argument("--modes", default="read,write", help="L2 flush modes for --vs-upstream (default read,write)")
    p.add_argument("--show", metavar="RECORD", default=None,
                   help="print the table of a recorded run (e.g. data/profiles/h200_grid.json) and exit; no GPU needed")
    p.set_defaults(func=profile_command)
    return p


def profile_command(args: argparse.Namespace) -> int:
    if args.show:
        try:
            rec = records.load_record(args.show, ("environment", "ceilings"), "profile record", "`inkling-lab profile`")
        except (OSError, ValueError) as exc:
            print(f"cannot read the record: {exc}", file=sys.stderr)
            return 2
        env, ceil = rec["environment"], rec["ceilings"]
        if "points" in rec:  # a side-by-side record
            print(f"{env['device']}, {env['date']}, commit {env['git_commit']}; upstream {rec['upstream']['wheel']}")
            for mode in rec["modes"]:
                print(side_by_side_summary(rec, mode) + "\n\n" + side_by_side_table(rec, mode) + "\n")
            return 0
        print(f"{env['device']}, {env['date']}, torch {env['torch']}, triton {env['triton']}, commit {env['git_commit']}")
        print(f"ceilings: copy {ceil['copy_TBps']:.2f} TB/s, bf16 matmul {ceil['matmul_TFLOPs']:.0f} TFLOP/s\n")
        print(summary_table(rec["records"]))
        return 0
    if not torch.cuda.is_available():
        print("inkling-lab profile needs a CUDA GPU; the recorded H200 runs are in data/profiles/ "
              "(notebooks/06_profiling.ipynb plots them)", file=sys.stderr)
        return 2
    shapes = [s for s in (args.shapes or ",".join(SIDE_SHAPES if args.vs_upstream else ("A", "B"))).split(",") if s]
    args.tokens = args.tokens or list(SIDE_TOKENS if args.vs_upstream else GRID_TOKENS)
    bad = [s for s in shapes if s not in SHAPES]
    if bad:
        print(f"unknown shape(s) {bad}; choose from {sorted(SHAPES)}", file=sys.stderr)
        return 2
    backends = [b for b in args.backends.split(",") if b]
    command = "inkling-lab profile " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["profile"] else sys.argv[1:])
    env = environment(command)
    print(f"{env['device']}  torch {env['torch']}  triton {env['triton']}", flush=True)
    ceilings = measure_ceilings()
    print(f"ceilings: copy {ceilings['copy_TBps']:.2f} TB/s, bf16 matmul {ceilings['matmul_TFLOPs']:.0f} TFLOP/s",
          flush=True)
    if args.vs_upstream:
        return _vs_upstream_command(args, env, ceilings, shapes)
    if args.graph_check:
        rows = graph_check()
        path = write_json(Path(args.out) / (args.name or "h200_graph.json"), {"environment": env, "rows": rows})
        for r in rows:
            print(r)
        print(f"wrote {path}")
        return 0 if all(r["ok"] for r in rows) else 1
    checks = check_correctness(correctness_cases(shapes))
    worst = max((r["rel_err"] for r in checks), default=0.0)
    print(f"correctness: {len(checks)} cases, worst rel err {worst:.2e}", flush=True)
    if not all(r["ok"] for r in checks):
        print("correctness check FAILED; not timing", file=sys.stderr)
        return 1
    timed, kernels = [], []
    if not args.check_only:
        timed = run_grid(grid(shapes, args.ranks, args.slots, args.tokens), backends, ceilings, args.reps)
        probe = [Case.of(s, 64, 4, T) for s in shapes for T in (1, 8192)]
        kernels = [{"case": asdict(c), "backend": b, "kernels": kernel_table(c, b)} for c in probe for b in backends]
    name = args.name or f"{env['device'].replace(' ', '_')}_{env['date'][:10]}.json"
    payload = {"environment": env, "ceilings": ceilings, "correctness": checks,
               "records": [asdict(r) for r in timed], "kernel_tables": kernels}
    path = write_json(Path(args.out) / name, payload)
    for r in checks:
        print(f"  {r['shape']} T={r['T']:<5} O={r['outer']} interleaved={r['interleaved']!s:<5} {r['dtype']:<8} "
              f"rel err {r['rel_err']:.1e}")
    print(summary_table(payload["records"]))
    print(f"wrote {path}")
    return 0


def _vs_upstream_command(args: argparse.Namespace, env: dict, ceilings: dict, shapes: Sequence[str]) -> int:
    from .upstream_wheel import unpack

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inkling_lab" / "sglang-0.5.23"
    provenance = unpack(args.vs_upstream, cache)
    modes = [m for m in args.modes.split(",") if m]
    checks = check_correctness(correctness_cases(shapes))
    print(f"kit correctness: {len(checks)} cases, worst rel err {max(r['rel_err'] for r in checks):.2e}", flush=True)
    if not all(r["ok"] for r in checks):
        print("correctness check FAILED; not timing", file=sys.stderr)
        return 1
    path = Path(args.out) / (args.name or "h200_side_by_side.json")
    head = {"environment": env, "ceilings": ceilings, "upstream": provenance, "modes": modes, "reps": args.reps,
            "correctness": checks}
    points = run_side_by_side(side_by_side_cases(shapes, args.ranks, args.slots, args.tokens), ceilings,
                              args.reps, modes, checkpoint=lambda pts: write_json(path, {**head, "points": pts}))
    rec = {**head, "points": points}
    write_json(path, rec)
    for mode in modes:
        print(side_by_side_summary(rec, mode))
    print(f"wrote {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m inkling_lab.profile ...``: the same as ``inkling-lab profile ...``."""
    parser = argparse.ArgumentParser(prog="inkling-lab")
    register_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["profile", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
