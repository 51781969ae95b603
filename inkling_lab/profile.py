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

Command line: ``inkling-lab profile --out data/profiles`` (``register_cli``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch

from . import records
from .records import environment, write_json
from .batch import SlotBatch
from .geometry import PRESETS

SHAPES = {name: (g.n, g.hidden, g.intermediate) for name, g in PRESETS.items() if name in ("A", "B")}
"""The issue's benchmark shapes: ``name -> (n, H, F)``."""

GRID_TOKENS = tuple(2 ** i for i in range(14))  # 1 .. 8192
GRID_RANKS = (16, 64)
GRID_SLOTS = (1, 4, 8)

# Upstream sglang 0.5.23 on one H200, 2026-11-29 (issue 4): full forward, median µs.
UPSTREAM_CEILINGS = {"copy_TBps": 4.25, "matmul_TFLOPs": 700.0}
UPSTREAM = [
    # shape, T, S, R, upstream µs, its roofline µs
    ("A", 1, 4, 64, 53.0, 3.6), ("A", 32, 4, 64, 56.0, 4.5), ("A", 8192, 4, 64, 728.0, 179.0),
    ("B", 1, 4, 64, 93.0, 24.4), ("B", 32, 4, 64, 96.0, 26.8), ("B", 8192, 4, 64, 2511.0, 1214.0),
]
UPSTREAM_SINGLE_SLOT = {("A", 1): 41.0, ("B", 8192): 1849.0}
"""Upstream's single-slot path (plain cuBLAS), µs, at the two points the issue gives."""

TARGET_SMALL_T, TARGET_LARGE_T = 3.0, 1.3
"""Target ratio to the roofline: T <= 32 and T >= 2048."""


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
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up (compile, allocate) off the capture
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return _timed(graph.replay, flush, reps)


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
    reference (mixed and base-only tokens, a rank-0 slot), output poisoned with NaN."""
    from .forward.reference import reference_forward
    from .forward.triton_backend import launch, plan

    rows = []
    for c in cases:
        sink, x, gammas, _ = build_case(c, device, seed)
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(-1, c.S, (c.T,), generator=gen)
        ranks = [c.R] * c.S
        ranks[-1] = 0 if c.S > 1 else c.R
        batch = SlotBatch.from_token_slots(ids, c.S, lora_ranks=ranks)
        out = torch.full_like(x, float("nan"))
        ops = sink.operands()
        launch(ops, x, gammas, plan(ops, c.T, batch, x.device), out)
        ref = reference_forward(ops, x, gammas, batch)
        err = float((out.double().cpu() - ref).norm() / ref.norm())
        rows.append({**asdict(c), "rel_err": err, "ok": bool(err < 1e-2)})
    return rows


def correctness_cases(shapes: Sequence[str]) -> list[Case]:
    """Every layout and dtype at a few tokens on the first shape, each tile regime of
    ``pick_tiles`` (by token count; the cuBLAS path per-expert too), and two token
    counts on each other shape."""
    cases = [Case.of(shapes[0], 16, 3, 37, outer=o, interleaved=i, dtype=d)
             for o in (1, 2) for i in (True, False) for d in ("bfloat16", "float16")]
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
    p.add_argument("--shapes", default="A,B", help="comma-separated of A,B (default A,B)")
    p.add_argument("--ranks", type=_ints, default=list(GRID_RANKS), help="default 16,64")
    p.add_argument("--slots", type=_ints, default=list(GRID_SLOTS), help="default 1,4,8")
    p.add_argument("--tokens", type=_ints, default=list(GRID_TOKENS), help="default 1,2,4,...,8192")
    p.add_argument("--backends", default="triton,torch,cublas_base",
                   help="comma-separated of triton, torch, cublas_base")
    p.add_argument("--reps", type=int, default=50, help="timed replays per point (median reported)")
    p.add_argument("--out", default="data/profiles", help="folder for the JSON record")
    p.add_argument("--name", default=None, help="file name (default: <device>_<date>.json)")
    p.add_argument("--check-only", action="store_true", help="run the correctness check alone and record it")
    p.add_argument("--show", metavar="RECORD", default=None,
                   help="print the table of a recorded run (e.g. data/profiles/h200_grid.json) and exit; no GPU needed")
    p.set_defaults(func=profile_command)
    return p


def profile_command(args: argparse.Namespace) -> int:
    if args.show:
        try:
            rec = load_record(args.show)
        except (OSError, ValueError) as exc:
            print(f"cannot read the record: {exc}", file=sys.stderr)
            return 2
        env, ceil = rec["environment"], rec["ceilings"]
        print(f"{env['device']}, {env['date']}, torch {env['torch']}, triton {env['triton']}, commit {env['git_commit']}")
        print(f"ceilings: copy {ceil['copy_TBps']:.2f} TB/s, bf16 matmul {ceil['matmul_TFLOPs']:.0f} TFLOP/s\n")
        print(summary_table(rec["records"]))
        return 0
    if not torch.cuda.is_available():
        print("inkling-lab profile needs a CUDA GPU; the recorded H200 runs are in data/profiles/ "
              "(notebooks/06_profiling.ipynb plots them)", file=sys.stderr)
        return 2
    shapes = [s for s in args.shapes.split(",") if s]
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
    checks = check_correctness(correctness_cases(shapes))
    worst = max((r["rel_err"] for r in checks), default=0.0)
    print(f"correctness: {len(checks)} cases, worst rel err {worst:.2e}", flush=True)
    if not all(r["ok"] for r in checks):
        print("correctness check FAILED; not timing", file=sys.stderr)
        return 1
    records, kernels = [], []
    if not args.check_only:
        records = run_grid(grid(shapes, args.ranks, args.slots, args.tokens), backends, ceilings, args.reps)
        probe = [Case.of(s, 64, 4, T) for s in shapes for T in (1, 8192)]
        kernels = [{"case": asdict(c), "backend": b, "kernels": kernel_table(c, b)} for c in probe for b in backends]
    name = args.name or f"{env['device'].replace(' ', '_')}_{env['date'][:10]}.json"
    payload = {"environment": env, "ceilings": ceilings, "correctness": checks,
               "records": [asdict(r) for r in records], "kernel_tables": kernels}
    path = write_json(Path(args.out) / name, payload)
    for r in checks:
        print(f"  {r['shape']} T={r['T']:<5} O={r['outer']} interleaved={r['interleaved']!s:<5} {r['dtype']:<8} "
              f"rel err {r['rel_err']:.1e}")
    print(summary_table(payload["records"]))
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
