"""The one-launch kernel (``single_launch.py`` beside this file) in Triton's CPU interpreter,
against the float64 reference.

SPEC §9: the interpreter mishandles bf16, so these run in float32 at small odd sizes
(bf16 and fp16 are checked on the H200 by ``experiments/single_launch/h200_single_launch.py``). Every
check draws fresh random inputs, poisons the output with NaN, launches twice against
the same workspace (what a CUDA graph replay does) and checks that the launch left
the workspace as it found it.

Triton decides at decoration time whether a kernel is interpreted, so this module
imports a private copy of ``single_launch`` with ``TRITON_INTERPRET=1`` set only for
that import, and restores ``sys.modules``, the package attribute and the environment.
"""
import signal
import sys

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

from interpreted import import_interpreted
from inkling_lab.batch import SlotBatch
from inkling_lab.forward.reference import reference_forward
from inkling_lab.geometry import Geometry
from inkling_lab.lora import SharedSinkLoRA
from inkling_lab.records import relative_error
from inkling_lab.scenario import Scenario

sl = import_interpreted("single_launch")

# Tiny tiles so that the odd sizes below span several feature blocks, down chunks and
# tasks, shrink slices, K splits and rank chunks.
TINY = dict(bf=16, bk=16, sk_chunk=16, bn=16, bkd=16, kc=32, rc=16)


@pytest.fixture(autouse=True)
def _interpreter_on(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _deadlock_alarm():
    """A wrong counter makes a task wait forever (in the interpreter too): turn that hang
    into a failure. The interpreter runs Python, so the alarm interrupts the spin. The
    limit is a hang guard, not a speed check: half an hour, far beyond any slow machine
    (the slowest test takes minutes on a busy 2-core one)."""
    def fail(signum, frame):
        raise TimeoutError("the one-launch kernel did not finish: a task is waiting on a counter that never fills")

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(1800)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def make_case(n, H, F, R, S, T, shared_outer, interleaved, seed, rank0=True, token_slots=None):
    """A random scenario whose slot 1 (if any) has rank 0 in the batch (its buffers are
    not zero: the kernel must skip it) and whose scalings are random."""
    g = Geometry(n=n, hidden=H, intermediate=F, max_rank=R, slots=S, outer=1 if shared_outer else n)
    sc = Scenario.random(g, tokens=T, seed=seed, interleaved=interleaved, token_slots=token_slots)
    gen = torch.Generator().manual_seed(seed)
    ranks = [R] * S
    if rank0 and S > 1:
        ranks[1] = 0
    batch = SlotBatch.from_token_slots(sc.batch.token_slots(), S, lora_ranks=ranks,
                                       scalings=(0.5 + torch.rand(S, generator=gen)).tolist())
    return sc.sink.operands(), sc.x, sc.gammas, batch


def _base(ops, x, gammas):
    """The sink without LoRA, in float64."""
    return reference_forward(ops, x, gammas, None)


def launch_twice(ops, x, gammas, batch, config):
    """Two launches against one workspace; both outputs, and the workspace after."""
    ws = sl.make_workspace(ops, x.shape[0], config)
    slots, scalings = sl.device_slots(batch, x.shape[0], x.device)
    outs = []
    for _ in range(2):
        out = torch.full_like(x, float("nan"))
        sl.launch_single(ops, x, gammas, slots, scalings, out, ws)
        outs.append(out)
    return outs, ws


def check(ops, x, gammas, batch, config, tol=1e-5):
    ref = reference_forward(ops, x, gammas, batch)
    (first, second), ws = launch_twice(ops, x, gammas, batch, config)
    assert torch.isfinite(first).all(), "some output element was never written"
    assert relative_error(first, ref, norm="fro") < tol
    assert torch.equal(first, second) or relative_error(second, ref, norm="fro") < tol
    assert torch.count_nonzero(ws.sh) == 0 and torch.count_nonzero(ws.mid) == 0
    assert torch.count_nonzero(ws.out_acc) == 0 and torch.count_nonzero(ws.y_acc) == 0
    assert torch.count_nonzero(ws.counters) == 0, "the counters must be zero for the next launch (graph replay)"
    assert ws.clean()
    return ref


@pytest.mark.parametrize("shared_outer", [True, False], ids=["shared_outer", "per_expert_outer"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "contiguous"])
def test_one_launch_matches_the_reference(shared_outer, interleaved):
    ksplit = 3 if shared_outer == interleaved else 1   # H whole and split over 3 slices, two layouts each
    ops, x, gammas, batch = make_case(3, 37, 21, 5, 3, 19, shared_outer, interleaved,
                                      seed=ksplit + 2 * shared_outer + 4 * interleaved)
    ref = check(ops, x, gammas, batch, sl.SingleConfig(ksplit=ksplit, lag=0 if interleaved else -1, **TINY))
    # The LoRA terms matter at this size, and tokens of every kind are present.
    assert relative_error(_base(ops, x, gammas), ref, norm="fro") > 0.05
    kinds = set(sl.device_slots(batch, x.shape[0], "cpu")[0].tolist())
    assert -1 in kinds and len(kinds) > 1


@settings(max_examples=10, deadline=None)
@given(n=st.integers(2, 3), H=st.integers(16, 64), F=st.integers(8, 48), R=st.sampled_from([0, 4, 8, 20]),
       S=st.integers(1, 3), T=st.integers(1, 32), shared_outer=st.booleans(), interleaved=st.booleans(),
       tokens=st.sampled_from(["mixed", "base_only", "one_slot"]), ksplit=st.integers(0, 3),
       bk=st.sampled_from([16, 32]), bn=st.sampled_from([16, 32]), kc=st.sampled_from([16, 32, 64]),
       lag=st.integers(-1, 4), programs=st.sampled_from([0, 1, 3, 1000]), persistent=st.booleans(),
       seed=st.integers(0, 10_000))
def test_one_launch_matches_the_reference_on_random_shapes(n, H, F, R, S, T, shared_outer, interleaved, tokens,
                                                           ksplit, bk, bn, kc, lag, programs, persistent, seed):
    token_slots = {"mixed": None, "base_only": [-1] * T, "one_slot": [S - 1] * T}[tokens]
    ops, x, gammas, batch = make_case(n, H, F, R, S, T, shared_outer, interleaved, seed, token_slots=token_slots)
    config = sl.SingleConfig(bf=16, ksplit=ksplit, bk=bk, sk_chunk=bk, bn=bn, bkd=16, kc=kc, rc=16, lag=lag,
                             programs=programs if persistent else 0, persistent=persistent)
    check(ops, x, gammas, batch, config)


@pytest.mark.parametrize("programs", [1, 2, 5])
def test_a_grid_smaller_than_the_task_count(programs):
    """A persistent grid of a few programs: the first one the interpreter runs takes every
    ticket in order; the rest find none left, and the last of them to leave zeroes the workspace."""
    ops, x, gammas, batch = make_case(2, 40, 36, 4, 3, 9, True, False, seed=20 + programs)
    config = sl.SingleConfig(programs=programs, ksplit=2, **TINY)
    ws = sl.make_workspace(ops, 9, config)
    plan = sl.schedule(ops, ws, 9, True, 3)
    assert plan["programs"] == programs < plan["tasks"]
    check(ops, x, gammas, batch, config)


def test_one_program_per_task():
    """``persistent=False``: v10's grid (one ticket per program, the grid the task count)."""
    ops, x, gammas, batch = make_case(3, 40, 30, 8, 3, 11, False, False, seed=50)
    config = sl.SingleConfig(persistent=False, ksplit=2, **TINY)
    plan = sl.schedule(ops, sl.make_workspace(ops, 11, config), 11, True, 3)
    assert plan["programs"] == plan["tasks"]
    check(ops, x, gammas, batch, config)


@pytest.mark.parametrize("lag", [0, 1, 100])
def test_every_ticket_order(lag):
    """Down tasks right after their chunk's up tasks (lag 0), one chunk later, or all up tasks
    first (lag >= the chunk count: v10's order): the same numbers, no wait on a later ticket."""
    ops, x, gammas, batch = make_case(2, 33, 40, 8, 2, 7, False, True, seed=30 + lag)
    config = sl.SingleConfig(lag=lag, ksplit=3, **TINY)
    ws = sl.make_workspace(ops, 7, config)
    plan = sl.schedule(ops, ws, 7, True, 2)
    assert plan["lag"] == min(lag, plan["chunks"]) and plan["chunks"] == 4
    check(ops, x, gammas, batch, config)


def test_ticket_locations_cover_every_task_once():
    """``_locate`` maps the tickets after the shrink onto every (up or down, chunk, index)
    exactly once, and every down task comes after all up tasks of its chunk (so it waits
    only on smaller tickets)."""
    @triton.jit  # decorated here, under the interpreter (the fixture set TRITON_INTERPRET)
    def locate_all(out_ptr, total, U, NH, NG, LAG, M: tl.constexpr):
        m = tl.arange(0, M)
        is_up, g, idx = sl._locate(m, U, NH, NG, LAG)
        ok = m < total
        tl.store(out_ptr + 3 * m, is_up.to(tl.int32), mask=ok)
        tl.store(out_ptr + 3 * m + 1, g, mask=ok)
        tl.store(out_ptr + 3 * m + 2, idx, mask=ok)

    for U, NH, NG in ((3, 2, 4), (1, 5, 1), (4, 4, 3)):
        for lag in range(0, NG + 1):
            total = NG * (U + NH)
            out = torch.full((total, 3), -7, dtype=torch.int32)
            locate_all[(1,)](out, total, U, NH, NG, lag, M=64)
            rows = [tuple(r) for r in out.tolist()]
            assert sorted(rows) == sorted([(1, g, i) for g in range(NG) for i in range(U)]
                                          + [(0, g, i) for g in range(NG) for i in range(NH)])
            for g in range(NG):
                last_up = max(m for m, r in enumerate(rows) if r[:2] == (1, g))
                first_down = min(m for m, r in enumerate(rows) if r[:2] == (0, g))
                assert first_down > last_up


def test_the_largest_token_tile():
    ops, x, gammas, batch = make_case(2, 24, 20, 4, 3, sl.MAX_TOKENS, False, True, seed=11)
    check(ops, x, gammas, batch, sl.SingleConfig(ksplit=2, **TINY))


def test_one_slot_per_token_and_a_rank_of_several_chunks():
    """Every token its own slot (the flat (slot, rank chunk) loops at their longest) and a
    rank over three chunks of 16, both outer layouts."""
    for shared_outer in (True, False):
        ops, x, gammas, batch = make_case(2, 24, 20, 40, 6, 6, shared_outer, True, seed=41,
                                          token_slots=[5, 0, 3, 2, 4, 0])
        check(ops, x, gammas, batch, sl.SingleConfig(ksplit=2, **TINY))


def test_tokens_of_rank_0_slots_get_the_base_only():
    ops, x, gammas, batch = make_case(2, 24, 12, 4, 2, 6, True, True, seed=5, token_slots=[1] * 6)
    assert int(batch.lora_ranks[1]) == 0 and torch.count_nonzero(ops.buffers[0][1]) > 0
    ref = check(ops, x, gammas, batch, sl.SingleConfig(**TINY))
    assert relative_error(ref, _base(ops, x, gammas), norm="fro") == 0


def test_no_batch_no_pool_and_no_tokens():
    ops, x, gammas, batch = make_case(2, 20, 10, 2, 2, 5, True, True, seed=3)
    base = _base(ops, x, gammas)
    assert relative_error(sl.single_launch_forward(ops, x, gammas, None), base, norm="fro") < 1e-5
    bare = SharedSinkLoRA(2, 20, 10, dtype=torch.float32, seed=3).operands()
    assert relative_error(sl.single_launch_forward(bare, x, gammas, batch), _base(bare, x, gammas),
                          norm="fro") < 1e-5
    assert sl.single_launch_forward(ops, x[:0], gammas[:0], None).shape == (0, 20)


def test_a_workspace_made_for_other_shapes_or_fewer_tokens_is_refused():
    ops, x, gammas, batch = make_case(2, 20, 10, 2, 2, 5, True, True, seed=4)
    slots, scalings = sl.device_slots(batch, 5, "cpu")
    small = sl.make_workspace(ops, 4)
    with pytest.raises(ValueError, match="up to 4 tokens"):
        sl.launch_single(ops, x, gammas, slots, scalings, workspace=small)
    other = make_case(2, 20, 12, 2, 2, 5, True, True, seed=4)[0]
    with pytest.raises(ValueError, match=r"\(n, H, F, O, R\)"):
        sl.launch_single(other, x, gammas, slots, scalings, workspace=sl.make_workspace(ops, 5))
    with pytest.raises(ValueError, match="few tokens"):
        sl.make_workspace(ops, sl.MAX_TOKENS + 1)
    with pytest.raises(ValueError, match="power of two"):
        sl.SingleConfig(bf=24)
    with pytest.raises(ValueError, match="multiple of bk"):
        sl.SingleConfig(bk=32, sk_chunk=16)
    with pytest.raises(ValueError, match="multiple of bf"):
        sl.SingleConfig(bf=64, kc=32, bkd=32)
    with pytest.raises(ValueError, match="lag >= -1"):
        sl.SingleConfig(lag=-2)
    with pytest.raises(ValueError, match="needs persistent=True"):
        sl.SingleConfig(programs=8, persistent=False)
