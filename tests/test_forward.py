"""The reference and torch backends, and the dispatcher (SPEC §4, §5).

The reference is the ground truth; it is checked here against the SPEC §4 formula
written with the derived operands (an independent path), and the torch backend is
checked against the reference on random inputs of every layout.
"""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inkling_lab.batch import SlotBatch
from inkling_lab.forward import BACKENDS, TRITON_ON_CUDA, pick_backend
from inkling_lab.forward.reference import reference_forward
from inkling_lab.forward.torch_backend import torch_forward
from inkling_lab.lora import SharedSinkLoRA
from inkling_lab.sink import swiglu_sink

F64 = torch.float64


def make_sink(n=2, H=12, F=6, R=3, S=3, outer=1, interleaved=True, seed=0, dtype=F64):
    """A sink with a random pool (every slot full, not PEFT-zero, so deltas show)."""
    g = torch.Generator().manual_seed(seed)
    sink = SharedSinkLoRA(n, H, F, interleaved=interleaved, dtype=dtype, seed=seed)
    O = 1 if outer == 1 else n
    shapes = [(S, O, 2 * R, H), (S, n, 2 * F, R), (S, n, R, F), (S, O, H, R)]
    sink.set_lora_info(*(torch.randn(s, generator=g, dtype=F64).to(dtype) for s in shapes))
    return sink


def inputs(sink, T, seed=0):
    g = torch.Generator().manual_seed(seed + 17)
    x = torch.randn(T, sink.hidden_size, generator=g, dtype=F64).to(sink.dtype)
    gammas = torch.rand(T, sink.n_shared_experts, generator=g, dtype=F64).to(sink.dtype)
    return x, gammas


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def spec_formula(sink, x, gammas, batch):
    """SPEC §4 for the shared outer, token by token, with ``w1_delta`` and ``a_cat``."""
    n, F = sink.n_shared_experts, sink.intermediate_size
    w13_lin, w2_lin = (w.double() for w in sink.linearized())
    ga, _, _, db = (b.double() for b in sink.lora_buffers)
    slots = batch.token_slots()
    out = []
    for t in range(x.shape[0]):
        xt = x[t:t + 1].double()
        y = xt @ w13_lin.T
        s = int(slots[t])
        lora = s >= 0 and int(batch.lora_ranks[s]) != 0
        if lora:
            y = y + (xt @ ga[s, 0].T) @ sink.w1_delta[s].double().T
        act = swiglu_sink(y.view(1, n, 2 * F), gammas[t:t + 1].double(), sink.interleaved).reshape(1, n * F)
        o = act @ w2_lin
        if lora:
            o = o + (act @ sink.a_cat[s].double().T) @ db[s, 0].T
        out.append(o)
    return torch.cat(out)


@pytest.mark.parametrize("interleaved", [True, False])
def test_reference_is_the_spec_formula_with_derived_operands(interleaved):
    sink = make_sink(interleaved=interleaved, seed=3)
    x, gammas = inputs(sink, 9, seed=3)
    batch = SlotBatch.from_token_slots([0, 0, 2, -1, 1, 1, 2, 0, -1], 3)
    assert rel(reference_forward(sink.operands(), x, gammas, batch), spec_formula(sink, x, gammas, batch)) < 1e-12


@pytest.mark.parametrize("outer", [1, 2])
@pytest.mark.parametrize("interleaved", [True, False])
def test_torch_matches_reference_on_mixed_slots(outer, interleaved):
    sink = make_sink(outer=outer, interleaved=interleaved, seed=outer + 2 * interleaved)
    x, gammas = inputs(sink, 11, seed=5)
    batch = SlotBatch.from_token_slots([2, 2, -1, 0, 1, 1, 1, -1, 0, 2, 0], 3)
    ref = reference_forward(sink.operands(), x, gammas, batch)
    assert ref.dtype == F64
    assert rel(torch_forward(sink.operands(), x, gammas, batch), ref) < 1e-12
    # The LoRA terms are not lost in rounding: without them the output moves a lot.
    assert rel(sink.base_forward(x, gammas), ref) > 0.05


def test_rank_zero_and_empty_slots_are_the_base_model():
    sink = make_sink(S=3, seed=7)
    with torch.no_grad():
        for buf in sink.lora_buffers:
            buf[1].zero_()                                  # slot 1: empty (all zeros)
    x, gammas = inputs(sink, 6, seed=7)
    batch = SlotBatch.from_token_slots([0, 1, 2, 1, 2, 0], 3, lora_ranks=[3, 3, 0])  # slot 2: rank 0
    base = sink.base_forward(x, gammas)
    for fn in (reference_forward, torch_forward):
        out = fn(sink.operands(), x, gammas, batch)
        no_lora = torch.tensor([1, 2, 3, 4])
        assert rel(out[no_lora], base[no_lora]) < 1e-12
        assert rel(out[[0, 5]], base[[0, 5]]) > 0.05     # slot 0 is a real adapter


def test_grouping_tokens_by_slot_changes_nothing():
    sink = make_sink(seed=11)
    x, gammas = inputs(sink, 10, seed=11)
    ids = [2, 0, 1, 0, -1, 2, 2, 1, 0, -1]
    plain = SlotBatch.from_token_slots(ids, 3)
    grouped = SlotBatch.from_token_slots(ids, 3, group=True)
    assert grouped.permutation is not None
    ref = reference_forward(sink.operands(), x, gammas, plain)
    for fn in (reference_forward, torch_forward):
        assert rel(fn(sink.operands(), x, gammas, grouped), ref) < 1e-12


def test_per_expert_pool_with_equal_outer_factors_is_the_shared_outer():
    shared = make_sink(outer=1, n=3, seed=13)
    per_expert = make_sink(outer=3, n=3, seed=13)
    ga, gb, da, db = shared.lora_buffers
    per_expert.set_lora_info(ga.expand(-1, 3, -1, -1).contiguous(), gb, da, db.expand(-1, 3, -1, -1).contiguous())
    with torch.no_grad():
        per_expert.w13.copy_(shared.w13)
        per_expert.w2.copy_(shared.w2)
    x, gammas = inputs(shared, 7, seed=13)
    batch = SlotBatch.from_token_slots([0, 1, 2, -1, 2, 1, 0], 3)
    assert rel(reference_forward(per_expert.operands(), x, gammas, batch), reference_forward(shared.operands(), x, gammas, batch)) < 1e-12


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 3), H=st.integers(1, 9), F=st.integers(1, 6), R=st.integers(1, 4), S=st.integers(1, 4),
       outer_shared=st.booleans(), interleaved=st.booleans(), seed=st.integers(0, 10_000),
       ids=st.lists(st.integers(-1, 3), min_size=1, max_size=12), group=st.booleans())
def test_torch_matches_reference_on_random_inputs(n, H, F, R, S, outer_shared, interleaved, seed, ids, group):
    sink = make_sink(n=n, H=H, F=F, R=R, S=S, outer=1 if outer_shared else n, interleaved=interleaved, seed=seed)
    ids = [min(i, S - 1) for i in ids]
    ranks = [(seed >> s) % 3 and R for s in range(S)]   # some slots rank 0
    batch = SlotBatch.from_token_slots(ids, S, lora_ranks=ranks, group=group)
    x, gammas = inputs(sink, len(ids), seed=seed)
    ref = reference_forward(sink.operands(), x, gammas, batch)
    assert torch.allclose(torch_forward(sink.operands(), x, gammas, batch).double(), ref, rtol=1e-10, atol=1e-10)


def test_dispatcher_runs_every_cpu_backend_and_keeps_the_input_shape():
    sink = make_sink(seed=19)
    x, gammas = inputs(sink, 6, seed=19)
    batch = SlotBatch.from_token_slots([0, 1, 2, -1, 0, 1], 3)
    ref = reference_forward(sink.operands(), x, gammas, batch)
    for name in BACKENDS:
        out = sink(x.view(2, 3, -1), gammas.view(2, 3, -1), batch=batch, backend=name)
        assert out.shape == (2, 3, sink.hidden_size)
        assert rel(out.reshape(6, -1), ref) < 1e-12
    assert pick_backend(x) == "torch"                # CPU: no Triton
    assert rel(sink(x, gammas, batch=batch), ref) < 1e-12   # "auto"


def test_dispatcher_errors_name_the_problem(monkeypatch):
    sink = make_sink(seed=23)
    x, gammas = inputs(sink, 4, seed=23)
    with pytest.raises(ValueError, match="unknown backend 'cuda'.*reference"):
        sink(x, gammas, batch=SlotBatch.from_token_slots([0] * 4, 3), backend="cuda")
    with pytest.raises(ValueError, match="describes 5 tokens but x has 4"):
        sink(x, gammas, batch=SlotBatch.from_token_slots([0] * 5, 3))
    with pytest.raises(ValueError, match="for 2 slots but the pool has 3"):
        sink(x, gammas, batch=SlotBatch.from_token_slots([0] * 4, 2))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match=TRITON_ON_CUDA):
        sink(x, gammas, batch=SlotBatch.from_token_slots([0] * 4, 3), backend="triton")
