"""The kit under bad input, grouped by promise.

* State kept: a call that fails leaves the object exactly as it was.
* Clear error: bad input gives a ``TypeError``/``ValueError`` that names the argument
  and the bad element, never a silent truncation or a raw torch error.
"""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inkling_lab.batch import SlotBatch
from inkling_lab.lora import LoRABackend, SharedSinkLoRA
from inkling_lab.pool import LoRAFactors, LoRAPool
from inkling_lab.sink import SharedSink

F64 = torch.float64


def _snapshot(pool: LoRAPool):
    return [b.clone() for b in pool.buffers()], pool.names, pool.lora_ranks, pool.adapter_scalings


def _assert_unchanged(pool: LoRAPool, before) -> None:
    buffers, names, ranks, scalings = before
    assert all(torch.equal(a, b) for a, b in zip(pool.buffers(), buffers))
    assert (pool.names, pool.lora_ranks, pool.adapter_scalings) == (names, ranks, scalings)


# -- state kept ----------------------------------------------------------------------------

def _loaded_pool() -> LoRAPool:
    pool = LoRAPool(n=2, hidden=8, intermediate=6, slots=2, max_rank=4, dtype=F64)
    pool.load(0, LoRAFactors.random(2, 8, 6, rank=3, seed=1, dtype=F64), name="sql")
    return pool


def _meta_gate_up_a(f: LoRAFactors) -> LoRAFactors:
    f.gate_up_a = f.gate_up_a.to("meta")  # passes every shape check, fails at the copy
    return f


@pytest.mark.parametrize("bad, error", [
    (lambda: LoRAFactors.random(2, 8, 6, rank=8, seed=2, dtype=F64), AssertionError),       # r > R
    (lambda: LoRAFactors.random(2, 9, 6, rank=2, seed=2, dtype=F64), AssertionError),       # another H
    (lambda: LoRAFactors.random(2, 8, 5, rank=2, seed=2, dtype=F64), AssertionError),       # another F
    (lambda: LoRAFactors.random(2, 8, 6, rank=2, outer=2, seed=2, dtype=F64), ValueError),  # per-expert
    (lambda: _meta_gate_up_a(LoRAFactors.random(2, 8, 6, rank=2, seed=2, dtype=F64)), NotImplementedError),
], ids=["rank_too_large", "other_hidden", "other_intermediate", "per_expert_into_shared", "uncopyable"])
def test_state_kept_a_failed_load_leaves_the_slot_and_its_adapter(bad, error):
    pool = _loaded_pool()
    before = _snapshot(pool)
    with pytest.raises(error):
        pool.load(0, bad(), name="chat")
    _assert_unchanged(pool, before)
    assert pool.names == ["sql", None] and pool.slot_of("sql") == 0


@settings(max_examples=30, deadline=None)
@given(rank=st.integers(0, 7), hidden=st.sampled_from([8, 9]), intermediate=st.sampled_from([5, 6]),
       slot=st.integers(0, 1), seed=st.integers(0, 1000))
def test_state_kept_any_load_either_succeeds_or_changes_nothing(rank, hidden, intermediate, slot, seed):
    pool = _loaded_pool()
    before = _snapshot(pool)
    factors = LoRAFactors.random(2, hidden, intermediate, rank=rank, seed=seed, dtype=F64)
    try:
        pool.load(slot, factors, name="new")
    except AssertionError:
        _assert_unchanged(pool, before)
        assert rank > 4 or (hidden, intermediate) != (8, 6)
    else:
        assert pool.names[slot] == "new" and pool.lora_ranks[slot] == rank


# -- clear error: SlotBatch ----------------------------------------------------------------

BAD_IDS = [
    ([0.7, 1.2, 2.9], r"token_slots\[0\] is 0\.7 \(float\)"),
    ([0, True, 1], r"token_slots\[1\] is True \(bool\)"),
    ([0, "1"], r"token_slots\[1\] is '1' \(str\)"),
    ([0, math.nan], r"token_slots\[1\] is nan \(NaN\)"),
    ("012", r"token_slots must be a sequence of integers, got the string '012'"),
    (torch.tensor([0.0, 1.0]), r"token_slots must be an integer tensor, got torch.float32"),
    (torch.tensor([True, False]), r"token_slots must be an integer tensor, got torch.bool"),
]


@pytest.mark.parametrize("ids, message", BAD_IDS, ids=[m.split(" ")[0] for _, m in BAD_IDS])
def test_clear_error_token_slots_that_are_not_integers_are_refused(ids, message):
    with pytest.raises(TypeError, match=message):
        SlotBatch.from_token_slots(ids, num_slots=3)


@pytest.mark.parametrize("lengths, slots, message", [
    ([1.5, 2], [0, 1], r"lengths\[0\] is 1\.5 \(float\)"),
    ([1, 2], [0, 1.0], r"slots\[1\] is 1\.0 \(float\)"),
    ([True, 2], [0, 1], r"lengths\[0\] is True \(bool\)"),
])
def test_clear_error_segments_that_are_not_integers_are_refused(lengths, slots, message):
    with pytest.raises(TypeError, match=message):
        SlotBatch.from_segments(lengths, slots, num_slots=3)


@pytest.mark.parametrize("kw, error, message", [
    (dict(scalings=[1.0, math.nan, 1.0]), ValueError, r"scalings\[1\] is nan: a scaling must be finite"),
    (dict(scalings=[1.0, "2", 1.0]), TypeError, r"scalings\[1\] is '2' \(str\)"),
    (dict(lora_ranks=[4, 0.5, 4]), TypeError, r"lora_ranks\[1\] is 0\.5 \(float\)"),
    (dict(lora_ranks=[4, -2, 4]), ValueError, r"lora_ranks\[1\] is -2"),
    (dict(num_slots=3.0), TypeError, r"num_slots must be an integer .* got 3\.0"),
])
def test_clear_error_per_slot_arguments_are_checked(kw, error, message):
    args = dict(num_slots=3)
    args.update(kw)
    with pytest.raises(error, match=message):
        SlotBatch.from_token_slots([0, 1], **args)


def test_integer_ids_of_any_integer_kind_are_still_accepted():
    np = pytest.importorskip("numpy")
    for ids in ([0, 2], torch.tensor([0, 2], dtype=torch.int32), np.array([0, 2]), [np.int64(0), torch.tensor(2)]):
        assert SlotBatch.from_token_slots(ids, num_slots=3).token_slots().tolist() == [0, 2]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.integers(-3, 5), st.floats(allow_nan=True), st.booleans(), st.text(max_size=2),
                          st.none()), max_size=8))
def test_clear_error_random_ids_give_a_batch_of_exactly_those_ints_or_a_documented_error(ids):
    try:
        batch = SlotBatch.from_token_slots(ids, num_slots=3)
    except (TypeError, ValueError) as exc:
        assert str(exc).startswith("SlotBatch: ")
    else:
        assert all(type(v) is int and -1 <= v < 3 for v in ids)
        assert batch.token_slots().tolist() == ids


DTYPES = [torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, torch.float32, torch.bool,
          torch.complex64]


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), shape=st.lists(st.integers(0, 4), max_size=3), seed=st.integers(0, 99),
       num_slots=st.integers(0, 4), segments=st.booleans())
def test_clear_error_random_tensors_give_a_batch_or_a_documented_error(dtype, shape, seed, num_slots, segments):
    gen = torch.Generator().manual_seed(seed)
    values = (torch.randn(shape, generator=gen) * 3).to(dtype) if dtype.is_floating_point or dtype.is_complex \
        else torch.randint(-2, 5, shape, generator=gen).to(dtype)
    try:
        if segments:
            batch = SlotBatch.from_segments(values, values, num_slots=num_slots)
        else:
            batch = SlotBatch.from_token_slots(values, num_slots=num_slots)
    except (TypeError, ValueError) as exc:
        assert str(exc).startswith("SlotBatch: ")
    else:
        assert not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
        if not segments:
            assert batch.token_slots().tolist() == values.flatten().long().tolist()


# -- clear error: the forward's inputs -----------------------------------------------------

def _sink_and_inputs(cls=SharedSinkLoRA):
    sink = cls(2, 8, 6, dtype=torch.float32)
    return sink, torch.randn(3, 8), torch.rand(3, 2)


@pytest.mark.parametrize("cls", [SharedSinkLoRA, SharedSink])
def test_clear_error_an_input_of_another_dtype_is_named(cls):
    sink, x, gammas = _sink_and_inputs(cls)
    with pytest.raises(TypeError, match=r"x is torch.float64 but the sink's weights are torch.float32: "
                                        r"pass x.to\(torch.float32\)"):
        sink(x.double(), gammas)
    with pytest.raises(TypeError, match=r"gammas is torch.int64: .* pass gammas.float\(\)"):
        sink(x, torch.ones(3, 2, dtype=torch.long))


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_gammas_of_another_floating_dtype_are_read_as_sglang_reads_them(backend):
    # sglang hands the sink the router's weights, float32 next to bf16 hidden states.
    sink = SharedSinkLoRA(2, 8, 6, dtype=torch.float64)
    x, gammas = torch.randn(3, 8, dtype=F64), torch.rand(3, 2, dtype=F64)
    want = sink(x, gammas, backend=backend)
    torch.testing.assert_close(sink(x, gammas.float(), backend=backend), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(SharedSink.base_forward(sink, x, gammas.float()), want.to(F64), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cls", [SharedSinkLoRA, SharedSink])
def test_clear_error_an_input_on_another_device_is_named(cls):
    sink, x, gammas = _sink_and_inputs(cls)
    with pytest.raises(ValueError, match=r"x is on meta but the sink's weights are on cpu: pass x.to\('cpu'\)"):
        sink(x.to("meta"), gammas)
    with pytest.raises(ValueError, match=r"gammas is on meta but the sink's weights are on cpu"):
        sink(x, gammas.to("meta"))


def test_clear_error_every_backend_is_guarded_by_the_same_checks():
    sink, x, gammas = _sink_and_inputs()
    for backend in ("reference", "torch", "triton"):
        with pytest.raises(TypeError, match="x is torch.float64"):
            sink(x.double(), gammas, backend=backend)
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        sink([[0.0] * 8], gammas[:1])


@settings(max_examples=30, deadline=None)
@given(generation=st.sampled_from(["v1", "v2"]), outer=st.sampled_from([1, 2]),
       gate_up_rows=st.sampled_from([8, 12, 13]), down_features=st.sampled_from([4, 6]),
       backend=st.sampled_from(["reference", "torch"]))
def test_clear_error_a_pool_of_another_F_that_set_lora_info_adopts_is_refused_at_the_forward(
        generation, outer, gate_up_rows, down_features, backend):
    """ISL-K153: upstream's set_lora_info never compares the pool to the sink's F (the
    second generation takes an odd 2F in the shared layout and builds no w1_delta);
    where it adopts such a pool the forward names both factors and the fix, and no
    backend runs."""
    v2 = generation == "v2"
    sink = SharedSinkLoRA(2, 8, 6, interleaved=not v2, dtype=torch.bfloat16)
    sink.initialize_lora(LoRABackend("triton_v2" if v2 else "triton", 3), generation=generation)
    S, R = 3, 4
    buffers = [torch.randn(shape, dtype=torch.bfloat16) for shape in
               ((S, outer, 2 * R, 8), (S, 2, gate_up_rows, R), (S, 2, R, down_features), (S, outer, 8, R))]
    try:
        sink.set_lora_info(*buffers)
    except (RuntimeError, ValueError):
        return  # refused upstream's way already (tests/test_upstream_model.py covers which)
    x, gammas = torch.randn(3, 8, dtype=torch.bfloat16), torch.rand(3, 2)
    batch = SlotBatch.from_token_slots([0, 1, 2], num_slots=S)
    if (gate_up_rows, down_features) == (12, 6):
        assert sink(x, gammas, batch=batch, backend=backend).shape == x.shape
        return
    problems = []
    if gate_up_rows != 12:
        problems.append(rf"gate_up_b is \[3, 2, {gate_up_rows}, 4\], whose 2F = {gate_up_rows} is not 2 \* 6")
    if down_features != 6:
        problems.append(rf"down_a is \[3, 2, 4, {down_features}\], whose F = {down_features} is not 6")
    with pytest.raises(ValueError, match=rf"^the LoRA pool does not fit the sink's F = 6: {'; '.join(problems)}; "
                                         r".*gate_up_b \[S, n, 2F, R\] = \[3, 2, 12, 4\] and down_a "
                                         r"\[S, n, R, F\] = \[3, 2, 4, 6\]$"):
        sink(x, gammas, batch=batch, backend=backend)
    assert sink(x, gammas, backend=backend).shape == x.shape  # no batch: the base sink, the pool unread


# -- clear error: sizes --------------------------------------------------------------------

@pytest.mark.parametrize("make, message", [
    (lambda: LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=4.5), r"Geometry.max_rank .* got 4.5"),
    (lambda: LoRAPool(n=2, hidden="8", intermediate=6, slots=3, max_rank=4), r"Geometry.hidden .* got '8'"),
    (lambda: LoRAPool(n=True, hidden=8, intermediate=6, slots=3, max_rank=4), r"Geometry.n .* got True"),
    (lambda: SharedSinkLoRA(2, 8.0, 6), r"SharedSink: hidden_size must be an integer, got 8.0"),
    (lambda: SharedSink(2, 8, None), r"SharedSink: intermediate_size must be an integer, got None"),
], ids=["pool_rank", "pool_hidden", "pool_n", "sink_hidden", "sink_intermediate"])
def test_clear_error_sizes_that_are_not_integers_are_named(make, message):
    with pytest.raises(TypeError, match=message):
        make()
