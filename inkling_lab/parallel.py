"""Tensor parallelism on ``torch.distributed``: the sharded sink and its LoRA (docs/reference.md#tensor-parallelism).

With ``tp`` ranks each rank holds ``F/tp`` of every expert's intermediate features:
the base ``w13`` keeps the gate and up rows of those features (in the sink's layout),
``w2`` and down A are cut along F, gate/up B keeps the same slice of its gate half and
of its up half, and the outer factors (gate-up A, down B) are replicated. Each rank
runs the whole forward on its features; one all-reduce (sum) of the partial outputs
``[T, H]`` gives the unsharded result, LoRA included: the LoRA partials ride the same
all-reduce, so adapters cost no extra communication.

Backends: ``gloo`` on CPU, ``nccl`` on GPUs (one per rank). ``run_tp`` starts the
ranks with ``torch.multiprocessing`` (works from a notebook: what the ranks run lives
here, so it is importable); ``python -m inkling_lab.parallel --tp 2`` does the same
from the shell, and runs as one rank per process under ``torchrun``. The ranks are
forked from a fork server that imported torch and the kit once (``forkserver``,
where the platform has it, else ``spawn``): a run no longer pays one torch import per
rank, and the server itself never touched CUDA or a thread pool, so forking it is safe.
Each rank runs in the caller's current environment, as a spawned one would.
"""
from __future__ import annotations

import argparse
import math
import os
import queue as queue_lib
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .batch import SlotBatch
from .catalog import error
from .geometry import PRESETS, Geometry
from .lora import SharedSinkLoRA
from .records import dtype_name, relative_error
from .scenario import Scenario
from .shard import check_tp, rank_features, shard_pool, shard_w2, shard_w13

DIST_BACKENDS = ("gloo", "nccl")

TOLERANCE: dict[torch.dtype, float] = {
    torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}
"""Largest accepted ``relative_error`` of a sharded output against the float64
reference: float64 is exact up to the order of the sums; bf16 carries the one cast of
the activation and the all-reduce of bf16 partials."""


# -- the sharded module (the cuts themselves are shard.py's) ---------------------------
@dataclass
class RankShard:
    """What one tensor-parallel rank holds: a ``SharedSinkLoRA`` of intermediate size
    ``F/tp`` (its own pool shards adopted through ``set_lora_info``, so the shared-outer
    ``w1_delta [S, n*2F/tp, 2R]`` and ``a_cat [S, R, n*F/tp]`` are rebuilt for the rank),
    and the global feature numbers ``features [F/tp]`` it stands for."""

    sink: SharedSinkLoRA
    tp_rank: int
    tp_size: int
    features: torch.Tensor

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes of everything the rank holds, by name (base, pool, derived)."""
        s = self.sink
        named = {"w13": s.w13, "w2": s.w2}
        if s.lora_buffers is not None:
            named.update(zip(("gate_up_a", "gate_up_b", "down_a", "down_b"), s.lora_buffers))
        if s.w1_delta is not None and s.a_cat is not None:
            named.update(w1_delta=s.w1_delta, a_cat=s.a_cat)
        return {k: tuple(v.shape) for k, v in named.items()}


def shard_sink(sink: SharedSinkLoRA, tp_rank: int, tp_size: int,
               device: torch.device | str | None = None) -> RankShard:
    """Rank ``tp_rank``'s share of ``sink`` and its pool, on ``device`` (default: the sink's).

    Base: ``w13 [n, 2F/tp, H]``, ``w2 [n, H, F/tp]``. Pool (``shard.shard_pool``):
    gate-up A ``[S, O, 2R, H]`` and down B ``[S, O, H, R]`` replicated, gate-up B
    ``[S, n, 2F/tp, R]``, down A ``[S, n, R, F/tp]``.
    The shard owns copies: ``sink`` and its pool are never written. ``tp_size=1`` gives a
    full copy (on another device, say).
    """
    features = rank_features(sink.intermediate_size, tp_rank, tp_size)
    target = torch.device(device) if device is not None else sink.device
    shard = SharedSinkLoRA(sink.n_shared_experts, sink.hidden_size, sink.intermediate_size // tp_size,
                           sink.interleaved, sink.dtype, device=target)
    with torch.no_grad():
        shard.w13.copy_(shard_w13(sink.w13.detach(), tp_rank, tp_size, sink.interleaved))
        shard.w2.copy_(shard_w2(sink.w2.detach(), tp_rank, tp_size))
    shard.backend, shard.generation = sink.backend, sink.generation
    if sink.lora_buffers is not None:
        parts = shard_pool(*sink.lora_buffers, tp_rank, tp_size)
        shard.set_lora_info(*(p.to(device=target, copy=True) for p in parts))
    return RankShard(shard, tp_rank, tp_size, features)


def shard_owners(n: int, intermediate: int, tp: int, interleaved: bool = True) -> dict[str, torch.Tensor]:
    """Which rank holds each position along the cut axis, per tensor, for drawing.

    Returns ``{"w13": [n, 2F], "gate_up_b": [n, 2F], "w2": [n, F], "down_a": [n, F]}``:
    the rank that holds each row of ``w13`` (in the sink's layout) and of gate-up B
    (``[gate ‖ up]``), and each feature column of ``w2`` and down A. Found by sharding,
    with ``shard_sink`` itself, tensors that hold their own position numbers. The outer
    factors are not in it: every rank holds all of them.
    """
    check_tp(intermediate, tp)
    F, R, H = intermediate, 1, 2
    sink = SharedSinkLoRA(n, H, F, interleaved, torch.float64)
    pos = torch.arange(n * 2 * F, dtype=torch.float64)
    with torch.no_grad():
        sink.w13.copy_(pos.view(n, 2 * F, 1).expand(n, 2 * F, H))
        sink.w2.copy_(torch.arange(n * F, dtype=torch.float64).view(n, 1, F).expand(n, H, F))
    sink.set_lora_info(torch.zeros(1, 1, 2 * R, H, dtype=torch.float64), pos.view(1, n, 2 * F, 1),
                       torch.arange(n * F, dtype=torch.float64).view(1, n, 1, F),
                       torch.zeros(1, 1, H, R, dtype=torch.float64))
    owners = {"w13": torch.full((n, 2 * F), -1), "gate_up_b": torch.full((n, 2 * F), -1),
              "w2": torch.full((n, F), -1), "down_a": torch.full((n, F), -1)}
    for r in range(tp):
        s = shard_sink(sink, r, tp).sink
        ga, gb, da, db = s.lora_buffers
        for name, held in (("w13", s.w13[:, :, 0]), ("gate_up_b", gb[0, :, :, 0]),
                           ("w2", s.w2[:, 0, :]), ("down_a", da[0, :, 0, :])):
            owners[name].view(-1)[held.flatten().long()] = r
    return owners


_HOW_CUT = {
    "w13": "the gate and up rows of the rank's F/tp features, in the sink's layout",
    "w2": "cut along F",
    "gate_up_a": "replicated",
    "gate_up_b": "cut in two places: the rank's slice of the gate half and of the up half",
    "down_a": "cut along F",
    "down_b": "replicated",
    "w1_delta": "rebuilt on the rank from its gate-up B shard (set_lora_info)",
    "a_cat": "rebuilt on the rank from its down A shard (set_lora_info)",
}


def describe_shards(geometry: Geometry, tp: int, interleaved: bool = True) -> str:
    """What each of ``tp`` ranks holds, tensor by tensor: the full shape, a rank's
    shape and how it is cut. Read off a seeded module of ``geometry`` and its shards."""
    sink = TPCase.random(geometry, interleaved, torch.float32, tokens=1).sink
    full, part = shard_sink(sink, 0, 1).shapes(), shard_sink(sink, 0, tp).shapes()
    width = max(len(str(list(v))) for v in full.values())
    lines = [f"n={geometry.n}, H={geometry.hidden}, F={geometry.intermediate}, R={geometry.rank}, "
             f"S={geometry.slots}, O={geometry.outer}, tp={tp}: each rank holds F/tp = "
             f"{geometry.intermediate // tp} features of every expert"]
    for name, shape in full.items():
        lines.append(f"  {name:9} {str(list(shape)):>{width}} -> {str(list(part[name])):>{width}}  {_HOW_CUT[name]}")
    return "\n".join(lines)


def sum_of_shards(sink: SharedSinkLoRA, tp: int, x: torch.Tensor, gammas: torch.Tensor,
                  batch: SlotBatch | None = None, backend: str = "torch") -> torch.Tensor:
    """The all-reduce done by hand, in one process: ``Σ_rank shard(x)``, ``[T, H]``.

    The arithmetic of tensor parallelism without the engine (for teaching and quick
    checks); ``run_tp`` does it for real, one process per rank.
    """
    parts = [shard_sink(sink, r, tp).sink.forward(x, gammas, batch, backend) for r in range(tp)]
    return torch.stack(parts).sum(0)


# -- one rank's forward ------------------------------------------------------------------
def tp_forward(shard: RankShard, x: torch.Tensor, gammas: torch.Tensor, batch: SlotBatch | None = None,
               backend: str = "torch", group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """This rank's forward, then the all-reduce (sum) over the group: ``x [T, H]`` ->
    the unsharded ``out [T, H]``, on every rank. Refuses a group whose size or rank is
    not the shard's."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if (world, rank) != (shard.tp_size, shard.tp_rank):
        raise ValueError(
            f"this shard is rank {shard.tp_rank} of tp={shard.tp_size}, but the process group has world size "
            f"{world} and this process is rank {rank}: shard with shard_sink(sink, {rank}, {world}) "
            f"or start {shard.tp_size} processes")
    out = shard.sink.forward(x, gammas, batch, backend).to(x.device)  # reference returns CPU float64
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


@dataclass(frozen=True)
class AllReduceCost:
    """The bytes of the one all-reduce per layer, per token: the partial output row
    ``[H]`` in the working dtype; a ring all-reduce sends ``2 (tp-1)/tp`` of it per rank."""

    hidden: int
    dtype: torch.dtype
    tp: int

    @property
    def payload(self) -> int:
        """Bytes each rank contributes per token: ``H * itemsize``."""
        return self.hidden * torch.empty(0, dtype=self.dtype).element_size()

    @property
    def sent_per_rank(self) -> float:
        """Bytes each rank sends per token in a ring all-reduce (reduce-scatter + all-gather)."""
        return 2 * (self.tp - 1) / self.tp * self.payload

    @property
    def lora_extra(self) -> int:
        """Extra bytes for the LoRA: none, its partials are summed in the same all-reduce."""
        return 0


# -- cases and results -------------------------------------------------------------------
@dataclass
class TPCase:
    """One forward to run sharded: the full module with its pool attached, the tokens
    ``x [T, H]``, ``gammas [T, n]`` and the ``SlotBatch`` (on the CPU: each rank moves
    its shard to its own device)."""

    name: str
    sink: SharedSinkLoRA
    x: torch.Tensor
    gammas: torch.Tensor
    batch: SlotBatch | None = None

    @classmethod
    def random(cls, geometry: Geometry, interleaved: bool = True, dtype: torch.dtype = torch.float64,
               tokens: int = 16, seed: int = 0, name: str | None = None) -> "TPCase":
        """A seeded sink and pool of ``geometry``: slot ``s < S-1`` holds an adapter of
        rank ``max(1, R-s)``, the last slot of a multi-slot pool stays empty, and tokens
        pick slots (or ``-1``, base only) at random: ``Scenario.random`` with those ranks
        as its adapters, on the CPU."""
        g = geometry
        ranks = [max(1, g.rank - s) for s in range(g.slots - 1)] + [0] if g.slots > 1 else [g.rank]
        case = Scenario.random(g, tokens=tokens, seed=seed, dtype=dtype, interleaved=interleaved, adapters=ranks)
        layout = "interleaved" if interleaved else "contiguous"
        outer = "shared outer" if g.shared_outer else "per-expert outer"
        default = f"{outer}, {layout}, S={g.slots}, {dtype_name(dtype)}"
        return cls(name or default, case.sink, case.x, case.gammas, case.batch)

    def reference(self) -> torch.Tensor:
        """The unsharded module's output by the float64 reference backend, ``[T, H]``."""
        return self.sink.forward(self.x, self.gammas, self.batch, backend="reference")


@dataclass
class TPResult:
    """The run of one ``TPCase`` over ``tp`` ranks.

    ``out [T, H]``: rank 0's all-reduced output (every rank's is compared with it:
    ``ranks_agree``); ``single [T, H]``: the unsharded module on rank 0's device, same
    backend and dtype; ``shapes``: what a rank holds (the same shapes on every rank);
    ``allreduce_bytes``: the payload each rank reduced.
    """

    case: str
    tp: int
    dist_backend: str
    device: str
    out: torch.Tensor
    single: torch.Tensor
    ranks_agree: bool
    shapes: dict[str, tuple[int, ...]]
    allreduce_bytes: int

    def check(self, reference: torch.Tensor) -> dict[str, Any]:
        """The equality check against the float64 reference, as a plain record."""
        tol = TOLERANCE[self.out.dtype]
        err_tp, err_single = relative_error(self.out, reference), relative_error(self.single, reference)
        tokens = max(1, self.out.numel() // self.out.shape[-1])
        return {"case": self.case, "tp": self.tp, "dist_backend": self.dist_backend, "device": self.device,
                "dtype": dtype_name(self.out.dtype), "rel_err_tp": err_tp,
                "rel_err_unsharded": err_single, "rel_err_tp_vs_unsharded": relative_error(self.out, self.single),
                "tolerance": tol, "ranks_agree": self.ranks_agree,
                "allreduce_bytes_per_token": self.allreduce_bytes // tokens,
                "passed": bool(self.ranks_agree and err_tp <= tol)}


# -- what the ranks run (top-level functions: spawned processes import them) -------------
def _rank_device(dist_backend: str, local_rank: int) -> torch.device:
    if dist_backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    torch.set_num_threads(1)  # tp processes share the machine's cores
    return torch.device("cpu")


def _plain(t: torch.Tensor) -> dict[str, Any]:
    # Plain lists cross the process boundary without shared memory that dies with the
    # rank; float64 holds every bf16/float32/float64 value exactly.
    return {"dtype": dtype_name(t.dtype), "shape": list(t.shape),
            "values": t.detach().cpu().double().flatten().tolist()}


def _tensor(p: dict[str, Any]) -> torch.Tensor:
    return torch.tensor(p["values"], dtype=torch.float64).reshape(p["shape"]).to(getattr(torch, p["dtype"]))


def _run_cases(cases: Sequence[TPCase], device: torch.device, forward_backend: str) -> list[dict[str, Any]]:
    """Every rank: shard, forward, all-reduce, and check in the group that all ranks now
    hold rank 0's output bit for bit. Rank 0 alone returns records (with the unsharded
    output on its device); the others return ``[]``."""
    rank, tp = dist.get_rank(), dist.get_world_size()
    records = []
    for case in cases:
        x, gammas = case.x.to(device), case.gammas.to(device)
        shard = shard_sink(case.sink, rank, tp, device)
        out = tp_forward(shard, x, gammas, case.batch, forward_backend)
        lead = out.clone()
        dist.broadcast(lead, src=0)
        agree = torch.tensor([float(torch.equal(lead, out))], device=device)
        dist.all_reduce(agree, op=dist.ReduceOp.MIN)
        if rank == 0:
            full = shard_sink(case.sink, 0, 1, device).sink
            records.append({"case": case.name, "out": _plain(out), "ranks_agree": bool(agree.item()),
                            "single": _plain(full.forward(x, gammas, case.batch, forward_backend)),
                            "shapes": shard.shapes(), "bytes": out.numel() * out.element_size(),
                            "device": _device_name(device)})
    return records


def _time_allreduce(shapes: Sequence[tuple[int, int]], device: torch.device, dtype: str,
                    iters: int) -> list[dict[str, Any]]:
    """Every rank: time the all-reduce of ``[tokens, hidden]`` buffers (median of
    ``iters`` after three warm-up calls). Rank 0 returns the records."""
    records = []
    for tokens, hidden in shapes:
        buf = torch.ones(tokens, hidden, dtype=getattr(torch, dtype), device=device)
        times = []
        for i in range(iters + 3):
            dist.barrier()
            if device.type == "cuda":
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                dist.all_reduce(buf)
                stop.record()
                stop.synchronize()
                seconds = start.elapsed_time(stop) / 1e3
            else:
                t0 = time.perf_counter()
                dist.all_reduce(buf)
                seconds = time.perf_counter() - t0
            if i >= 3:
                times.append(seconds)
        times.sort()
        records.append({"tokens": tokens, "hidden": hidden, "dtype": dtype,
                        "bytes": buf.numel() * buf.element_size(), "median_s": times[len(times) // 2]})
    return records if dist.get_rank() == 0 else []


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


_TASKS: dict[str, Callable[..., list[dict[str, Any]]]] = {"cases": _run_cases, "allreduce": _time_allreduce}


def _in_group(task: str, args: tuple, dist_backend: str, rank: int, tp: int, local_rank: int,
              init_method: str) -> list[dict[str, Any]]:
    device = _rank_device(dist_backend, local_rank)
    dist.init_process_group(dist_backend, init_method=init_method, rank=rank, world_size=tp,
                            timeout=timedelta(seconds=120))
    try:
        return _TASKS[task](args[0], device, *args[1:])
    finally:
        dist.destroy_process_group()


def _spawned_rank(rank: int, tp: int, task: str, args: tuple, dist_backend: str, init_method: str,
                  results: Any, environ: dict[str, str]) -> None:
    # The fork server's environment is the caller's of its first run: take today's.
    os.environ.clear()
    os.environ.update(environ)
    try:
        records = _in_group(task, args, dist_backend, rank, tp, rank, init_method)
    except BaseException:
        # When it failed, too: one rank's error makes the others fail in their collectives (a peer gone),
        # and the earliest failure is the cause (CLOCK_MONOTONIC is one clock for the whole machine).
        results.put(("error", rank, time.monotonic(), traceback.format_exc()))
        return
    results.put(("ok", rank, records))


_START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
"""How ``run_tp`` starts its ranks (see the module docstring)."""


# -- the launcher ------------------------------------------------------------------------
def resolve_dist_backend(dist_backend: str, tp: int) -> str:
    """``auto`` -> ``nccl`` when there is a GPU per rank, else ``gloo``; checks a named one."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if dist_backend == "auto":
        return "nccl" if gpus >= tp and dist.is_nccl_available() else "gloo"
    if dist_backend not in DIST_BACKENDS:
        raise ValueError(f"dist_backend must be 'auto', 'gloo' (CPU) or 'nccl' (GPUs), got {dist_backend!r}")
    if dist_backend == "nccl" and (gpus < tp or not dist.is_nccl_available()):
        raise error("ISL-K106", tp=tp, gpus=gpus,
                    detail="" if dist.is_nccl_available() else " and this torch has no NCCL")
    return dist_backend


def _spawn(task: str, args: tuple, tp: int, dist_backend: str, timeout_s: float) -> list[dict[str, Any]]:
    """Start ``tp`` ranks, run ``task`` in one process group, return rank 0's records."""
    store = tempfile.mkdtemp(prefix="inkling_tp_")
    context = mp.get_context(_START_METHOD)
    if _START_METHOD == "forkserver":  # takes effect when the server starts (its first run)
        context.set_forkserver_preload(["__main__", "inkling_lab"])
    results = context.Queue()
    ctx = None
    try:
        ctx = mp.start_processes(_spawned_rank, args=(tp, task, args, dist_backend, f"file://{store}/rendezvous",
                                                      results, dict(os.environ)),
                                 nprocs=tp, join=False, start_method=_START_METHOD)
        got: dict[int, list[dict[str, Any]]] = {}
        waited = 0.0
        # Read while the ranks live: a rank exits only once its results are taken.
        while len(got) < tp:
            try:
                message = results.get(timeout=0.5)
            except queue_lib.Empty:
                waited += 0.5
                finished = ctx.join(timeout=0)  # raises with the rank's exit if one died without a word
                if (finished and results.empty()) or waited > timeout_s:
                    raise RuntimeError(f"tensor-parallel run: {tp - len(got)} of {tp} rank(s) gave no result "
                                       f"within {timeout_s:.0f} s")
                continue
            if message[0] == "error":
                _raise_first_failure(message[1:], results, ctx, tp - len(got))
            got[message[1]] = message[2]
        while not ctx.join():
            pass
        return got[0]
    except BaseException:
        # An interrupted or failed run must not leave ranks waiting in a collective.
        for p in ctx.processes if ctx is not None else ():
            if p.is_alive():
                p.terminate()
        raise
    finally:
        shutil.rmtree(store, ignore_errors=True)


RANK_FAILURE_WAIT_S = 30.0
"""After a rank's failure, how long ``_spawn`` waits at most for the other ranks' reports (a rank stuck in a
collective gives none) before raising with the earliest failure among those it has."""


def _raise_first_failure(first: tuple, results: Any, ctx: Any, pending: int) -> None:
    """Raise with the failing rank's traceback whose failure came first: ``first`` is ``(rank, when,
    traceback)``; the ranks still ``pending`` are heard out until they have all reported or exited (or for
    ``RANK_FAILURE_WAIT_S``), so that a peer's echo (its collective broken by the failed rank's exit) is
    not reported in place of the cause."""
    failures, deadline = [first], time.monotonic() + RANK_FAILURE_WAIT_S
    heard = 1
    while heard < pending and time.monotonic() < deadline:
        try:
            message = results.get(timeout=0.2)
        except queue_lib.Empty:
            if all(not p.is_alive() for p in ctx.processes) and results.empty():
                break
            continue
        heard += 1
        if message[0] == "error":
            failures.append(message[1:])
    rank, _, text = min(failures, key=lambda f: f[1])
    others = sorted(r for r, _, _ in failures if r != rank)
    echo = f"\n(then rank(s) {others} failed too)" if others else ""
    raise RuntimeError(f"tensor-parallel rank {rank} failed:\n{text}{echo}")


def _check_cases(cases: Sequence[TPCase], tp: int) -> None:
    for case in cases:
        check_tp(case.sink.intermediate_size, tp)
        if case.sink.device.type != "cpu" or case.x.device.type != "cpu":
            raise ValueError(f"TPCase {case.name!r} is on {case.sink.device}: give run_tp CPU cases; "
                             "each rank moves its own shard to its device")


def _collect(records: list[dict[str, Any]], tp: int, dist_backend: str) -> list[TPResult]:
    return [TPResult(r["case"], tp, dist_backend, r["device"], _tensor(r["out"]), _tensor(r["single"]),
                     r["ranks_agree"], r["shapes"], r["bytes"]) for r in records]


def run_tp(cases: Sequence[TPCase], tp: int, dist_backend: str = "auto", forward_backend: str = "torch",
           timeout_s: float = 300) -> list[TPResult]:
    """Run every case sharded over ``tp`` processes (one process group for all of them).

    ``dist_backend``: ``gloo`` (CPU), ``nccl`` (one GPU per rank) or ``auto``. Works
    from a notebook and from scripts. Raises before starting anything when ``F`` does
    not split over ``tp`` or NCCL lacks GPUs; the traceback of the rank that failed first is re-raised
    (the ranks that failed after it, often because it left their collective, are named).
    """
    dist_backend = resolve_dist_backend(dist_backend, tp)
    _check_cases(cases, tp)
    records = _spawn("cases", (list(cases), forward_backend), tp, dist_backend, timeout_s)
    return _collect(records, tp, dist_backend)


def measure_allreduce(tp: int, shapes: Sequence[tuple[int, int]], dtype: torch.dtype = torch.bfloat16,
                      dist_backend: str = "auto", iters: int = 20) -> list[dict[str, Any]]:
    """Time the all-reduce of a ``[tokens, hidden]`` partial output, for each shape.

    Returns rank 0's records: ``tokens``, ``hidden``, ``bytes`` (payload), ``median_s``,
    ``busbw_GBps`` (the ring's bytes per rank over time, nccl-tests' bus bandwidth).
    """
    dist_backend = resolve_dist_backend(dist_backend, tp)
    records = _spawn("allreduce", (list(shapes), dtype_name(dtype), iters), tp, dist_backend, 300)
    for r in records:
        r["bytes_per_token"] = r["bytes"] // r["tokens"]
        r["busbw_GBps"] = 2 * (tp - 1) / tp * r["bytes"] / r["median_s"] / 1e9 if r["median_s"] else math.inf
    return records


# -- the shell entry: python -m inkling_lab.parallel [under torchrun] --------------------
def demo_cases(geometry: Geometry, dtype: torch.dtype = torch.float64, tokens: int = 16,
               seed: int = 0) -> list[TPCase]:
    """Both outer layouts (shared, per expert) x both gate/up layouts of ``geometry``."""
    return [TPCase.random(geometry.with_(outer=outer), interleaved, dtype, tokens, seed)
            for outer in (1, geometry.n) for interleaved in (True, False)]


def check_world_size(tp: int, world_size: int | None = None) -> None:
    """Under ``torchrun``: refuse a world size (default: ``$WORLD_SIZE``) other than ``tp``."""
    world = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
    if world != tp:
        raise error("ISL-K105", world=world, tp=tp)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m inkling_lab.parallel",
        description="Shard a seeded shared sink and its LoRA pool over tp ranks, run the forward with an "
                    "all-reduce, and check it against the unsharded module and the float64 reference. "
                    "Starts its own processes, or runs as one rank under torchrun.")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size (default 2)")
    p.add_argument("--dist-backend", default="auto", choices=("auto",) + DIST_BACKENDS)
    p.add_argument("--forward-backend", default="torch", help="forward backend on each rank (default torch)")
    p.add_argument("--preset", default="toy", choices=sorted(PRESETS), help="geometry preset (default toy)")
    p.add_argument("--slots", type=int, default=None, help="override the preset's slot count")
    p.add_argument("--dtype", default="float64", choices=("float64", "float32", "bfloat16", "float16"))
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    return p


def format_checks(checks: Sequence[dict[str, Any]]) -> str:
    """One line per check: the case, the errors, pass or FAIL."""
    lines = []
    for c in checks:
        mark = "ok" if c["passed"] else "FAIL"
        lines.append(f"{mark:4} tp={c['tp']} {c['dist_backend']:4} {c['case']:45} rel err vs reference "
                     f"{c['rel_err_tp']:.1e} (unsharded {c['rel_err_unsharded']:.1e}, tol {c['tolerance']:.0e}), "
                     f"ranks agree: {c['ranks_agree']}, all-reduce {c['allreduce_bytes_per_token']} B/token")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(_parser().parse_args(argv))
    except ValueError as exc:  # a bad tp, world size or backend: the message says what to change
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    geometry = PRESETS[args.preset] if args.slots is None else PRESETS[args.preset].with_(slots=args.slots)
    cases = demo_cases(geometry, getattr(torch, args.dtype), args.tokens, args.seed)
    if "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ:  # one rank of torchrun
        check_world_size(args.tp)
        dist_backend = resolve_dist_backend(args.dist_backend, int(os.environ.get("LOCAL_WORLD_SIZE", args.tp)))
        _check_cases(cases, args.tp)
        rank = int(os.environ["RANK"])
        records = _in_group("cases", (cases, args.forward_backend), dist_backend, rank, args.tp,
                            int(os.environ["LOCAL_RANK"]), "env://")
        if rank != 0:  # rank 0 holds the records and reports
            return 0
        results = _collect(records, args.tp, dist_backend)
    else:
        results = run_tp(cases, args.tp, args.dist_backend, args.forward_backend)
    checks = [r.check(c.reference()) for r, c in zip(results, cases)]
    print(format_checks(checks))
    return 0 if all(c["passed"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
