"""The one-launch kernel (``forward/single_launch.py``) in Triton's CPU interpreter,
against the float64 reference.

SPEC §9: the interpreter mishandles bf16, so these run in float32 at small odd sizes
(bf16 and fp16 are checked on the H200 by ``scripts/h200_single_launch.py``). Every
check draws fresh random inputs, poisons the output with NaN, launches twice against
the same workspace (what a CUDA graph replay does) and checks that the launch left
the workspace as it found it.

Triton decides at decoration time whether a kernel is interpreted, so this module
imports a private copy of ``single_launch`` with ``TRITON_INTERPRET=1`` set only for
that import, and restores ``sys.modules``, the package attribute and the environment.
"""
import importlib
import os
import signal
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inkling_lab.batch import SlotBatch
from inkling_lab.forward.reference import reference_forward
from inkling_lab.geometry import Geometry
from inkling_lab.lora import SharedSinkLoRA
from inkling_lab.records import relative_error
from inkling_lab.scenario import Scenario

_NAME = "inkling_lab.forward.single_launch"


def _interpreted_module():
    pkg = importlib.import_module("inkling_lab.forward")
    saved_module = sys.modules.pop(_NAME, None)
    saved_attr = pkg.__dict__.pop("single_launch", None)
    saved_env = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        return importlib.import_module(_NAME)
    finally:
        if saved_env is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved_env
        sys.modules.pop(_NAME, None)
        pkg.__dict__.pop("single_launch", None)
        if saved_module is not None:
            sys.modules[_NAME] = saved_module
        if saved_attr is not None:
            pkg.__dict__["single_launch"] = saved_attr


sl = _interpreted_module()

# Tiny tiles so that the odd sizes below span several feature blocks, down tasks,
# shrink slices and K splits.
TINY = dict(bf=16, bk=16, sk_chunk=16, bn=16, bkd=16)


@pytest.fixture(autouse=True)
def _interpreter_on(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _deadlock_alarm():
    """A wrong counter makes a task wait forever (in the interpreter too): turn that hang
    into a failure. The interpreter runs Python, so the alarm interrupts the spin."""
    def fail(signum, frame):
        raise TimeoutError("the one-launch kernel did not finish: a task is waiting on a counter that never fills")

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(60)
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
    assert torch.count_nonzero(ws.counters) == 0, "the counters must be zero for the next launch (graph replay)"
    return ref


@pytest.mark.parametrize("shared_outer", [True, False], ids=["shared_outer", "per_expert_outer"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "contiguous"])
def test_one_launch_matches_the_reference(shared_outer, interleaved):
    ksplit = 3 if shared_outer == interleaved else 1   # H whole and split over 3 slices, two layouts each
    ops, x, gammas, batch = make_case(3, 37, 21, 5, 3, 19, shared_outer, interleaved,
                                      seed=ksplit + 2 * shared_outer + 4 * interleaved)
    ref = check(ops, x, gammas, batch, sl.SingleConfig(ksplit=ksplit, prefetch=interleaved, **TINY))
    # The LoRA terms matter at this size, and tokens of every kind are present.
    assert relative_error(_base(ops, x, gammas), ref, norm="fro") > 0.05
    kinds = set(sl.device_slots(batch, x.shape[0], "cpu")[0].tolist())
    assert -1 in kinds and len(kinds) > 1


@settings(max_examples=10, deadline=None)
@given(n=st.integers(2, 3), H=st.integers(16, 64), F=st.integers(8, 48), R=st.sampled_from([0, 4, 8]),
       S=st.integers(1, 3), T=st.integers(1, 32), shared_outer=st.booleans(), interleaved=st.booleans(),
       tokens=st.sampled_from(["mixed", "base_only", "one_slot"]), ksplit=st.integers(0, 3),
       bk=st.sampled_from([16, 32]), bn=st.sampled_from([16, 32]), prefetch=st.booleans(),
       seed=st.integers(0, 10_000))
def test_one_launch_matches_the_reference_on_random_shapes(n, H, F, R, S, T, shared_outer, interleaved, tokens,
                                                           ksplit, bk, bn, prefetch, seed):
    token_slots = {"mixed": None, "base_only": [-1] * T, "one_slot": [S - 1] * T}[tokens]
    ops, x, gammas, batch = make_case(n, H, F, R, S, T, shared_outer, interleaved, seed, token_slots=token_slots)
    config = sl.SingleConfig(bf=16, ksplit=ksplit, bk=bk, sk_chunk=bk, bn=bn, bkd=16, prefetch=prefetch)
    check(ops, x, gammas, batch, config)


def test_the_largest_token_tile():
    ops, x, gammas, batch = make_case(2, 24, 20, 4, 3, sl.MAX_TOKENS, False, True, seed=11)
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
