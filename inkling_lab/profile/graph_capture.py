"""The user-level forward in a CUDA graph (issue 15 item 2, ``inkling-lab profile
--graph-check``): captured with a device-resident batch, replayed after in-place updates,
each output against the float64 reference; and the eager host time per call, step by step."""
from __future__ import annotations

from typing import Sequence

import torch

from .. import records
from ..batch import SlotBatch
from ..forward.reference import reference_forward
from .roofline_model import Case
from .timing import host_us


def graph_check(shape: str = "A", R: int = 16, S: int = 4, tokens: Sequence[int] = (1, 8, 32, 128),
                calls: int = 300, device: str = "cuda") -> list[dict]:
    """Per token count: ``sink(x, gammas, batch=resident, backend="triton")`` with a
    device-resident batch (``SlotBatch.to``), eagerly and captured in ``torch.cuda.graph``;
    the graph replayed, then replayed again after new segments, slots and inputs are
    written in place, each output against ``reference_forward``; and the eager host time
    per call (median over ``calls`` calls, no sync between them), for the resident batch
    and for a host batch (plan cached after the first call)."""
    rows = []
    for T in tokens:
        c = Case.of(shape, R, S, T)
        sc = c.scenario(device, seed=T)
        sink, x, gammas = sc.sink, sc.x, sc.gammas
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
        ref = reference_forward(ops, x, gammas, first)
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
        row["replay_rel_err"] = records.relative_error(static_out, reference_forward(ops, x, gammas, first), "fro")
        second = segments()
        for name in ("seg_indptr", "weight_indices", "lora_ranks", "scalings"):
            getattr(resident, name).copy_(getattr(second, name))
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        row["updated_replay_rel_err"] = records.relative_error(static_out, reference_forward(ops, x, gammas, second),
                                                                "fro")
        for label, batch in (("host_us_resident", resident), ("host_us_host_batch", second)):
            sink(x, gammas, batch=batch, backend="triton")
            torch.cuda.synchronize()
            row[label] = host_us(lambda: sink(x, gammas, batch=batch, backend="triton"), calls)
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
    from ..forward import kernels
    from ..forward.triton_backend import _replay, cached_plan, graph_key, launch
    from ..sink import check_tokens

    ops = sink.operands()
    p = cached_plan(ops, x.shape[0], batch, x.device)
    graph, io = p.fast[graph_key(ops, x)], p.fast["io"]
    xs, gs, outs = io.x, io.gammas, io.out
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
        out[name] = host_us(fn, calls)
    torch.cuda.synchronize()
    return out

