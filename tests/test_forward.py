"""The reference and torch backends, and the dispatcher (SPEC §4, §5).

The reference is the ground truth; it is checked here against the SPEC §4 formula
written with the derived operands (an independent path), and the torch backend is
checked against the reference on random inputs of every layout.
"""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inkling_lab.batch import SlotBatch
from inkling_lab.forward import BACKENDS, pick_backend
from inkling_lab.forward.triton_backend import TRITON_ON_CUDA
from inkling_lab.forward.reference import reference_forward
from inkling_lab.forward.torch_backend import torch_forward
from inkling_lab.geometry import Geometry
from inkling_lab.records import relative_error
from inkling_lab.sink import swiglu_sink

F64 = torch.float64
SMALL = Geometry(n=2, hidden=12, intermediate=6, max_rank=3, slots=3)


def rel(a, b):
    return relative_error(a, b, norm="fro")


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
def test_reference_is_the_spec_formula_with_derived_operands(scenario, interleaved):
    sc = scenario(SMALL, tokens=9, seed=3, interleaved=interleaved, token_slots=[0, 0, 2, -1, 1, 1, 2, 0, -1])
    ref = reference_forward(sc.operands(), sc.x, sc.gammas, sc.batch)
    assert rel(ref, spec_formula(sc.sink, sc.x, sc.gammas, sc.batch)) < 1e-12


@pytest.mark.parametrize("outer", [1, 2])
@pytest.mark.parametrize("interleaved", [True, False])
def test_torch_matches_reference_on_mixed_slots(scenario, outer, interleaved):
    sc = scenario(SMALL.with_(outer=outer), tokens=11, seed=outer + 2 * interleaved, interleaved=interleaved,
                  token_slots=[2, 2, -1, 0, 1, 1, 1, -1, 0, 2, 0])
    ref = reference_forward(sc.operands(), sc.x, sc.gammas, sc.batch)
    assert ref.dtype == F64
    assert rel(torch_forward(sc.operands(), sc.x, sc.gammas, sc.batch), ref) < 1e-12
    # The LoRA terms are not lost in rounding: without them the output moves a lot.
    assert rel(sc.sink.base_forward(sc.x, sc.gammas), ref) > 0.05


def test_rank_zero_and_empty_slots_are_the_base_model(scenario):
    sc = scenario(SMALL, tokens=6, seed=7, adapters=[3, 0, 3])                # slot 1: empty (all zeros)
    x, gammas = sc.x, sc.gammas
    # Slot 2 holds an adapter but the batch says rank 0: skipped although its buffers are not zero.
    batch = SlotBatch.from_token_slots([0, 1, 2, 1, 2, 0], 3, lora_ranks=[3, 3, 0])
    base = sc.sink.base_forward(x, gammas)
    for fn in (reference_forward, torch_forward):
        out = fn(sc.operands(), x, gammas, batch)
        no_lora = torch.tensor([1, 2, 3, 4])
        assert rel(out[no_lora], base[no_lora]) < 1e-12
        assert rel(out[[0, 5]], base[[0, 5]]) > 0.05     # slot 0 is a real adapter


def test_grouping_tokens_by_slot_changes_nothing(scenario):
    ids = [2, 0, 1, 0, -1, 2, 2, 1, 0, -1]
    sc = scenario(SMALL, tokens=10, seed=11, token_slots=ids)
    grouped = SlotBatch.from_token_slots(ids, 3, group=True)
    assert grouped.permutation is not None
    ref = reference_forward(sc.operands(), sc.x, sc.gammas, sc.batch)
    for fn in (reference_forward, torch_forward):
        assert rel(fn(sc.operands(), sc.x, sc.gammas, grouped), ref) < 1e-12


def test_per_expert_pool_with_equal_outer_factors_is_the_shared_outer(scenario):
    shared = scenario(SMALL.with_(n=3), tokens=7, seed=13, token_slots=[0, 1, 2, -1, 2, 1, 0])
    per_expert = scenario(SMALL.with_(n=3, outer=3), seed=13)              # same weights (same seed)
    ga, gb, da, db = shared.sink.lora_buffers
    per_expert.sink.set_lora_info(ga.expand(-1, 3, -1, -1).contiguous(), gb, da, db.expand(-1, 3, -1, -1).contiguous())
    args = (shared.x, shared.gammas, shared.batch)
    assert rel(reference_forward(per_expert.operands(), *args), reference_forward(shared.operands(), *args)) < 1e-12


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 3), H=st.integers(1, 9), F=st.integers(1, 6), R=st.integers(1, 4), S=st.integers(1, 4),
       outer_shared=st.booleans(), interleaved=st.booleans(), seed=st.integers(0, 10_000),
       ids=st.lists(st.integers(-1, 3), min_size=1, max_size=12), group=st.booleans())
def test_torch_matches_reference_on_random_inputs(scenario, n, H, F, R, S, outer_shared, interleaved, seed, ids,
                                                  group):
    g = Geometry(n=n, hidden=H, intermediate=F, max_rank=R, slots=S, outer=1 if outer_shared else n)
    ids = [min(i, S - 1) for i in ids]
    ranks = [(seed >> s) % 3 and R for s in range(S)]   # some slots rank 0
    sc = scenario(g, tokens=len(ids), seed=seed, interleaved=interleaved, token_slots=ids)
    batch = SlotBatch.from_token_slots(ids, S, lora_ranks=ranks, group=group)
    ref = reference_forward(sc.operands(), sc.x, sc.gammas, batch)
    assert torch.allclose(torch_forward(sc.operands(), sc.x, sc.gammas, batch).double(), ref, rtol=1e-10, atol=1e-10)


def test_dispatcher_runs_every_cpu_backend_and_keeps_the_input_shape(scenario):
    sc = scenario(SMALL, tokens=6, seed=19, token_slots=[0, 1, 2, -1, 0, 1])
    sink, x, gammas, batch = sc.sink, sc.x, sc.gammas, sc.batch
    ref = reference_forward(sc.operands(), x, gammas, batch)
    assert sorted(BACKENDS) == ["reference", "torch", "triton"]
    for name in ("reference", "torch"):  # triton runs on CUDA (or in test_triton's interpreter)
        out = sink(x.view(2, 3, -1), gammas.view(2, 3, -1), batch=batch, backend=name)
        assert out.shape == (2, 3, sink.hidden_size)
        assert rel(out.reshape(6, -1), ref) < 1e-12
    assert pick_backend(x) == "torch"                # CPU: no Triton
    assert rel(sink(x, gammas, batch=batch), ref) < 1e-12   # "auto"
    assert rel(sc.forward("torch"), ref) < 1e-12


def test_dispatcher_errors_name_the_problem(scenario, monkeypatch):
    sc = scenario(SMALL, tokens=4, seed=23)
    sink, x, gammas = sc.sink, sc.x, sc.gammas
    with pytest.raises(ValueError, match="unknown backend 'cuda'.*reference"):
        sink(x, gammas, batch=SlotBatch.from_token_slots([0] * 4, 3), backend="cuda")
    with pytest.raises(ValueError, match="describes 5 tokens but x has 4"):
        sink(x, gammas, batch=SlotBatch.from_token_slots([0] * 5, 3))
    with pytest.raises(ValueError, match="for 2 slots but the pool has 3"):
        sink(x, gammas, batch=SlotBatch.from_token_slots([0] * 4, 2))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match=TRITON_ON_CUDA):
        sink(x, gammas, batch=SlotBatch.from_token_slots([0] * 4, 3), backend="triton")


def test_operands_for_computes_with_another_pool_and_adopts_nothing(scenario):
    sc = scenario(SMALL, tokens=5, seed=29, token_slots=[0, 1, 2, 0, -1])
    other = scenario(SMALL.with_(max_rank=2), seed=31)                    # another R: set_lora_info would refuse
    before = sc.sink.lora_buffers, sc.sink.w1_delta.clone(), sc.sink.a_cat.clone()
    ops = sc.sink.operands_for(*other.pool.buffers())
    assert ops.max_rank == 2 and ops.w1_delta.shape == other.sink.w1_delta.shape
    assert rel(torch_forward(ops, sc.x, sc.gammas, sc.batch),
               reference_forward(other.operands(), sc.x, sc.gammas, sc.batch)) > 0.05  # other base weights
    with torch.no_grad():
        other.sink.w13.copy_(sc.sink.w13)
        other.sink.w2.copy_(sc.sink.w2)
    assert rel(torch_forward(ops, sc.x, sc.gammas, sc.batch),
               reference_forward(other.operands(), sc.x, sc.gammas, sc.batch)) < 1e-12
    assert sc.sink.lora_buffers is before[0]
    assert torch.equal(sc.sink.w1_delta, before[1]) and torch.equal(sc.sink.a_cat, before[2])


def test_operands_are_handed_out_again_until_something_is_replaced(scenario):
    sc = scenario(SMALL, seed=37)
    ops = sc.sink.operands()
    assert sc.sink.operands() is ops                                      # nothing changed
    sc.sink.on_lora_slots_updated([0])                                    # writes in place: same record
    assert sc.sink.operands() is ops
    sc.sink.set_lora_info(*(b.clone() for b in sc.pool.buffers()))        # new buffers: a new record
    assert sc.sink.operands() is not ops and sc.sink.operands().buffers is sc.sink.lora_buffers
    ops = sc.sink.operands()
    with torch.no_grad():
        sc.sink.w13.mul_(2)                                               # new weights: a new record
    assert sc.sink.operands() is not ops
    torch.testing.assert_close(sc.sink.operands().w13_lin, sc.sink.linearized()[0])


def _new_parameter(t):
    return torch.nn.Parameter(t, requires_grad=False)


def _unload_pool(sink, scenario):
    from inkling_lab.lora import LoRABackend
    sink.initialize_lora(LoRABackend("triton", 3))


# (mutation(sink, scenario), a new record?): every way the module's weights, layout or pool change.
MUTATIONS = {
    "slot refresh": (lambda s, sc: s.on_lora_slots_updated(None), False),
    "pool written in place": (lambda s, sc: s.lora_buffers[3].mul_(2), False),
    "pool storage swapped": (lambda s, sc: setattr(s.lora_buffers[0], "data", s.lora_buffers[0] * 2), False),
    "set_lora_info, new buffers": (lambda s, sc: s.set_lora_info(*(b.clone() for b in s.lora_buffers)), True),
    "set_lora_info, per-expert pool": (
        lambda s, sc: s.set_lora_info(*sc(SMALL.with_(outer=SMALL.n), seed=43).pool.buffers()), True),
    "initialize_lora drops the pool": (_unload_pool, True),
    "w2 written in place": (lambda s, sc: s.w2.detach().mul_(2), True),  # w2_lin is a copy
    "w2 storage swapped": (lambda s, sc: setattr(s.w2, "data", s.w2.detach() * 2), True),
    "w13 reassigned": (lambda s, sc: setattr(s, "w13", _new_parameter(s.w13.detach() + 1)), True),
    "load_state_dict": (lambda s, sc: s.load_state_dict({"w13": s.w13 * 3, "w2": s.w2 * 3}), True),
    "moved to another dtype": (lambda s, sc: s.to(torch.float32), True),
    "layout flag changed": (lambda s, sc: setattr(s, "interleaved", not s.interleaved), True),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_every_change_of_the_module_shows_in_its_operands(scenario, name):
    mutate, fresh = MUTATIONS[name]
    sc = scenario(SMALL, seed=41, dtype=torch.bfloat16 if name == "initialize_lora drops the pool" else F64)
    sink = sc.sink
    ops = sink.operands()
    mutate(sink, scenario)
    now = sink.operands()
    assert (now is not ops) == fresh
    assert sink.operands() is now                                          # and reused from then on
    # what a record made now holds, the linearized weights computed apart from any cache
    for mine, theirs in ((now.w13, sink.w13), (now.w2, sink.w2)):
        assert (mine.data_ptr(), mine.shape, mine.dtype) == (theirs.data_ptr(), theirs.shape, theirs.dtype)
    H = SMALL.hidden
    assert torch.equal(now.w13_lin, sink.w13.detach().reshape(-1, H))
    assert torch.equal(now.w2_lin, sink.w2.detach().transpose(1, 2).reshape(-1, H))
    assert (now.n, now.hidden, now.intermediate, now.dtype, now.device) == (
        SMALL.n, H, SMALL.intermediate, sink.dtype, sink.device)
    assert now.interleaved == sink.interleaved
    assert now.buffers is sink.lora_buffers and now.w1_delta is sink.w1_delta and now.a_cat is sink.a_cat


def test_a_batch_rewritten_in_place_after_a_forward_is_checked_again():
    """``check_batch_slots`` skips ids it passed unchanged, and no write gets past it."""
    from inkling_lab.forward import check_batch_slots

    batch = SlotBatch.from_token_slots([0, 1], num_slots=2)
    check_batch_slots(batch, 2)
    check_batch_slots(batch, 2)  # the same ids again: passed
    with pytest.raises(ValueError, match="segment 1 uses slot 1, but the pool has slots 0..0"):
        check_batch_slots(batch, 1)  # another pool: checked
    batch.weight_indices[1] = 5  # in place, after it passed
    with pytest.raises(ValueError, match="segment 1 uses slot 5, but the pool has slots 0..1"):
        check_batch_slots(batch, 2)


# -- out= and static_io (the caller's own output, tensors read and written in place) -------------

@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(T=st.integers(0, 7), rows=st.sampled_from([1, 2]), backend=st.sampled_from(["torch", "reference"]),
       seed=st.integers(0, 1000))
def test_out_receives_the_result_and_is_returned(scenario, T, rows, backend, seed):
    sc = scenario(SMALL, tokens=2 * T, seed=seed)
    sink, batch = sc.sink, sc.batch
    x, gammas = sc.x.view(rows, -1, SMALL.hidden), sc.gammas.view(rows, -1, SMALL.n)   # [T, H] or [B, L, H]
    want = sink(x, gammas, batch=batch, backend=backend)
    out = torch.full_like(want, float("nan"))
    got = sink(x, gammas, batch=batch, backend=backend, out=out)
    assert got is out and torch.equal(out, want)


def test_a_refused_out_names_it_and_writes_nothing(scenario):
    sc = scenario(SMALL, tokens=4, seed=47)
    sink, x, gammas, batch = sc.sink, sc.x, sc.gammas, sc.batch
    x_before = x.clone()
    cases = {
        "out has shape \\(4, 13\\) but x has \\(4, 12\\)": (ValueError, torch.zeros(4, 13, dtype=x.dtype)),
        "out is torch.float32 but this forward returns torch.float64": (TypeError, torch.zeros(4, 12)),
        "out is on meta, the sink on cpu": (ValueError, torch.zeros(4, 12, dtype=x.dtype,
                                                                                 device="meta")),
        "out is not contiguous": (ValueError, torch.zeros(12, 4, dtype=x.dtype).T),
        "out must be a torch.Tensor": (TypeError, [0.0] * 48),
    }
    for match, (kind, out) in cases.items():
        before = out.clone() if isinstance(out, torch.Tensor) and out.device.type != "meta" else None
        with pytest.raises(kind, match=match):
            sink(x, gammas, batch=batch, backend="torch", out=out)
        if before is not None:
            assert torch.equal(out, before)
    out = torch.zeros(4, 12, dtype=x.dtype)
    with pytest.raises(ValueError, match="describes 5 tokens but x has 4"):   # any refusal: out untouched
        sink(x, gammas, batch=SlotBatch.from_token_slots([0] * 5, 3), out=out)
    assert not out.any() and torch.equal(x, x_before)
    f32 = scenario(SMALL, tokens=4, seed=47, dtype=torch.float32)
    with pytest.raises(TypeError, match="out is torch.float32 but this forward returns torch.float64"):
        f32.sink(f32.x, f32.gammas, batch=f32.batch, backend="reference", out=torch.zeros_like(f32.x))  # float64


def test_out_on_a_sink_of_another_activation_is_its_base_forward(scenario):
    from inkling_lab.lora import SharedSinkLoRA

    sink = SharedSinkLoRA(2, 12, 6, dtype=F64, seed=5, activation="gelu")
    x, gammas = torch.randn(3, 12, dtype=F64), torch.rand(3, 2)
    out = torch.empty_like(x)
    assert sink(x, gammas, out=out) is out and torch.equal(out, sink.base_forward(x, gammas))
    with pytest.raises(ValueError, match="out has shape"):
        sink(x, gammas, out=out[:2])


def test_static_io_off_the_graph_path_are_ordinary_tensors_for_the_forward(scenario):
    sc = scenario(SMALL, tokens=5, seed=53)
    sink, batch = sc.sink, sc.batch
    io = sink.static_io(batch)
    assert (io.x.shape, io.gammas.shape, io.out.shape) == ((5, 12), (5, 2), (5, 12))
    assert (io.x.dtype, io.gammas.dtype, io.out.dtype) == (sink.dtype, torch.float32, sink.dtype)
    assert not io.x.any() and not io.out.any()
    io.x.copy_(sc.x)
    io.gammas.copy_(sc.gammas)
    assert sink(io.x, io.gammas, batch=batch, out=io.out) is io.out
    assert torch.equal(io.out, sink(sc.x, sc.gammas.float(), batch=batch))
    ref = sink.static_io(batch, backend="reference")
    assert ref.out.dtype == F64 and sink.static_io(tokens=3).x.shape == (3, 12)   # no batch: the base sink's


def test_static_io_errors_name_the_problem(scenario):
    sc = scenario(SMALL, tokens=4, seed=59)
    sink = sc.sink
    with pytest.raises(ValueError, match="without a batch needs tokens="):
        sink.static_io()
    with pytest.raises(ValueError, match="describes 4 tokens but tokens is 5"):
        sink.static_io(sc.batch, tokens=5)
    with pytest.raises(ValueError, match="tokens must be a whole number"):
        sink.static_io(tokens=-1)
    with pytest.raises(TypeError, match="batch must be a SlotBatch"):
        sink.static_io([0, 1], tokens=2)
    with pytest.raises(ValueError, match="for 2 slots but the pool has 3"):
        sink.static_io(SlotBatch.from_token_slots([0] * 4, 2))
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        sink.static_io(sc.batch, backend="cuda")
