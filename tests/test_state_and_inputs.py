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
    (lambda: _meta_gate_up_a(LoRAFactors.random(2, 8, 6, rank=2, seed=2, dtype=F64)), ValueError),  # meta: named
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


# -- issue 22: nothing silent, nothing raw -------------------------------------------------------

from inkling_lab.errors import expect_error  # noqa: E402
from inkling_lab.geometry import SIZE_LIMIT, Geometry  # noqa: E402
from inkling_lab.lora import derive_operands  # noqa: E402
from inkling_lab.scenario import Scenario  # noqa: E402

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
ITERABLES = {"list": list, "tuple": tuple, "set": set, "generator": lambda ids: (s for s in ids),
             "iterator": lambda ids: iter(list(ids)), "dict keys": lambda ids: dict.fromkeys(ids).keys(),
             "tensor": lambda ids: torch.tensor(list(ids), dtype=torch.long), "map": lambda ids: map(int, ids)}


@settings(max_examples=60, deadline=None)
@given(slots=st.sets(st.integers(0, 2)), kind=st.sampled_from(sorted(ITERABLES)), seed=st.integers(0, 9))
def test_silent_any_iterable_of_slot_ids_refreshes_exactly_those_slots(slots, kind, seed):
    """A one-shot iterable used to be spent by the range check: the forward served the old slot."""
    sink = SharedSinkLoRA(2, 8, 6, dtype=F64)
    pool = LoRAPool(2, 8, 6, 3, 4, dtype=F64)
    sink.set_lora_info(*pool.buffers())
    for s in range(3):  # every slot changes in place; only the refreshed ones may show it
        pool.load(s, LoRAFactors.random(2, 8, 6, 4, seed=seed + s, dtype=F64))
    sink.on_lora_slots_updated(ITERABLES[kind](sorted(slots)))
    fresh = derive_operands(pool.gate_up_b, pool.down_a, sink.interleaved)
    for s in range(3):
        assert torch.equal(sink.w1_delta[s], fresh[0][s]) == (s in slots), (kind, s)
        assert torch.equal(sink.a_cat[s], fresh[1][s]) == (s in slots), (kind, s)


@pytest.mark.parametrize("ids", [[0.0], [True], ["0"], "01", 1, [None], torch.tensor([0.5])],
                         ids=["float", "bool", "str-element", "string", "int", "None-element", "float-tensor"])
def test_clear_error_slot_ids_that_are_no_integers_are_named(ids):
    sink = SharedSinkLoRA(2, 8, 6, dtype=F64)
    sink.set_lora_info(*LoRAPool(2, 8, 6, 3, 4, dtype=F64).buffers())
    with pytest.raises(TypeError, match="on_lora_slots_updated: slot_ids"):
        sink.on_lora_slots_updated(ids)


@pytest.mark.parametrize("alpha", [math.nan, math.inf, -math.inf, True, "8", None])
def test_silent_a_lora_alpha_that_is_no_finite_number_is_refused(alpha):
    with pytest.raises(ValueError, match="lora_alpha must be a finite number"):
        LoRAFactors(*LoRAFactors.random(2, 8, 6, 2).tensors().values(), lora_alpha=alpha)


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.complex64, torch.float8_e4m3fn, torch.uint8])
def test_clear_error_factors_pools_and_sinks_of_no_working_dtype_are_refused(dtype):
    f = LoRAFactors.random(2, 8, 6, 2)
    with pytest.raises(TypeError, match="not a working dtype"):
        LoRAFactors(f.gate_up_a.to(dtype), *list(f.tensors().values())[1:])
    with pytest.raises(TypeError, match="LoRAPool: dtype"):
        LoRAPool(2, 8, 6, 2, 4, dtype=dtype)
    with pytest.raises(TypeError, match="SharedSink: dtype"):
        SharedSink(2, 8, 6, dtype=dtype)


def test_clear_error_factors_of_mixed_dtypes_are_refused():
    f = LoRAFactors.random(2, 8, 6, 2)
    with pytest.raises(TypeError, match="share one dtype"):
        LoRAFactors(f.gate_up_a.half(), f.gate_up_b, f.down_a, f.down_b)


@pytest.mark.parametrize("slot", [True, False, 0.0, "0", None])
def test_clear_error_a_slot_that_is_no_integer_is_refused_and_nothing_changes(slot):
    pool = _loaded_pool()
    before = _snapshot(pool)
    with pytest.raises(TypeError, match="LoRAPool: slot must be an integer"):
        pool.load(slot, LoRAFactors.random(2, 8, 6, rank=2, seed=2, dtype=F64))
    _assert_unchanged(pool, before)


@settings(max_examples=60, deadline=None)
@given(value=st.floats(1.0, 1e6), alpha=st.floats(0.25, 64.0), dtype=st.sampled_from(FLOATS),
       pool_dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]), nan=st.booleans())
def test_silent_a_factor_never_reaches_the_pool_as_nan_or_inf(value, alpha, dtype, pool_dtype, nan):
    """fp16's 65504: B = 40000 at scaling 2 used to load Inf without a word. Whatever the values, a
    load either writes only finite values or is refused (ISL-K160) naming the factor, slot untouched."""
    f = LoRAFactors.random(2, 8, 6, rank=2, seed=1, dtype=dtype)
    f.gate_up_b[0, 0, 0] = math.nan if nan else value
    pool = LoRAPool(2, 8, 6, 2, 4, dtype=pool_dtype)
    before = _snapshot(pool)
    scaled = (f.gate_up_b.to(pool_dtype) * (alpha / 2)).abs().max()
    try:
        pool.load(1, LoRAFactors(*f.tensors().values(), lora_alpha=alpha, name="big"))
    except ValueError as exc:
        assert "'big': gate_up_b" in str(exc) and not bool(torch.isfinite(scaled))
        _assert_unchanged(pool, before)
    else:
        assert bool(torch.isfinite(scaled)) and all(bool(torch.isfinite(b).all()) for b in pool.buffers())


def test_clear_error_the_overflow_refusal_is_catalogued():
    pool = LoRAPool(2, 8, 6, 2, 4, dtype=torch.float16)
    f = LoRAFactors.random(2, 8, 6, rank=4, seed=1, dtype=torch.float16)
    f.gate_up_b.fill_(40000.0)
    with expect_error("ISL-K160", show=False):
        pool.load(0, LoRAFactors(*f.tensors().values(), lora_alpha=8.0))


@pytest.mark.parametrize("sizes", [dict(slots=10 ** 30), dict(hidden=SIZE_LIMIT + 1), dict(max_rank=2 ** 40)])
def test_clear_error_absurd_sizes_are_refused_before_any_allocation(sizes):
    base = dict(n=2, hidden=8, intermediate=6, max_rank=4, slots=2)
    with pytest.raises(ValueError, match=f"Geometry.{next(iter(sizes))} must be in 0..{SIZE_LIMIT}"):
        Geometry(**{**base, **sizes})
    with pytest.raises(ValueError, match="must be in"):
        LoRAPool(**{**base, **sizes})


def test_clear_error_sizes_in_range_whose_tensors_no_machine_holds_are_refused_by_name_before_allocating():
    with expect_error("ISL-K164", show=False):  # each size within bounds, their product not
        Geometry(n=2, hidden=2 ** 30, intermediate=2 ** 30, max_rank=4, slots=2)
    with pytest.raises(ValueError, match=r"SharedSink: w13 \[n, 2F, H\] \[2, 2147483648, 1073741824\]"):
        SharedSink(2, 2 ** 30, 2 ** 30)
    with pytest.raises(ValueError, match=r"Geometry: gate_up_a \[2, 1, 2147483648, 8\]"):
        LoRAPool.from_geometry(Geometry(n=2, hidden=8, intermediate=6, max_rank=4, slots=2).with_(max_rank=2 ** 30))
    with pytest.raises(ValueError, match="Scenario.random: tokens"):
        Scenario.random(Geometry(n=2, hidden=8, intermediate=6), tokens=10 ** 12)


@settings(max_examples=30, deadline=None)
@given(sink_dtype=st.sampled_from(FLOATS), pool_dtype=st.sampled_from(FLOATS))
def test_clear_error_a_pool_of_another_dtype_than_the_sink_is_named_at_the_forward(sink_dtype, pool_dtype):
    sink = SharedSinkLoRA(2, 8, 6, dtype=sink_dtype)
    sink.set_lora_info(*LoRAPool(2, 8, 6, 2, 4, dtype=pool_dtype).buffers())
    batch = SlotBatch.from_token_slots([0, 1, -1], num_slots=2)
    x, g = torch.randn(3, 8, dtype=sink_dtype), torch.rand(3, 2)
    if sink_dtype == pool_dtype:
        assert sink(x, g, batch=batch, backend="torch").shape == (3, 8)
    else:
        with expect_error("ISL-K161", show=False):
            sink(x, g, batch=batch, backend="torch")


@pytest.mark.parametrize("slot", [2, 7, -2, 10 ** 6])
def test_clear_error_a_batch_rewritten_in_place_past_the_pool_is_refused(slot):
    sink = SharedSinkLoRA(2, 8, 6)
    sink.set_lora_info(*LoRAPool(2, 8, 6, 2, 4).buffers())
    batch = SlotBatch.from_token_slots([0, 1], num_slots=2)
    batch.weight_indices[1] = slot  # frozen dataclass, mutable tensor
    for backend in ("reference", "torch"):
        with expect_error("ISL-K103", show=False):
            sink(torch.randn(2, 8), torch.rand(2, 2), batch=batch, backend=backend)


def test_clear_error_an_unknown_generation_is_named():
    with pytest.raises(ValueError, match="generation must be 'v1' or 'v2', got 'v9'"):
        SharedSinkLoRA(2, 8, 6).initialize_lora(LoRABackend(), generation="v9")


# -- exercise checks and widgets under hostile answers ---------------------------------------------

from inkling_lab import exercises as ex  # noqa: E402
from inkling_lab import widgets  # noqa: E402

HOSTILE = st.one_of(st.none(), st.booleans(), st.text(max_size=6), st.floats(allow_nan=True),
                    st.lists(st.one_of(st.integers(-3, 30), st.floats(allow_nan=True), st.text(max_size=2)),
                             max_size=5),
                    st.tuples(st.integers(0, 12), st.floats(0, 20), st.integers(0, 12)))


class _Unwalkable(torch.Tensor):
    """A tensor whose elements must not be visited one by one (a 10**7-element answer took 13 s)."""

    def __iter__(self):
        raise AssertionError("the check walked the tensor element by element")


@settings(max_examples=150, deadline=None)
@given(a=HOSTILE, b=HOSTILE)
def test_clear_error_exercise_checks_answer_any_input_with_a_verdict(a, b):
    sink = SharedSinkLoRA(2, 8, 6)
    f = LoRAFactors.random(2, 8, 6, 2, outer=2)
    verdicts = [ex.sink_shapes(a, b, sink), ex.collapses(a, f), ex.segments(a, b, [0, 0, 1], 2),
                ex.rank_gate_up_rows(a, sink, 0, 2), ex.upstream_column(a, 6, 1),
                ex.first_error(a, ((3, 1, 8, 16), (3, 2, 12, 4), (3, 2, 4, 6), (3, 1, 16, 4)), 2),
                ex.pool_shapes(a, LoRAPool(2, 8, 6, 2, 4))]
    for v in verdicts:
        assert isinstance(v, ex.Verdict) and str(v)
    right = [v.right for v in verdicts]
    # a shape or a list of rows with a fraction, a bool or a string in it is never "right"
    if isinstance(a, tuple) and not float(a[1]).is_integer():
        assert right[0] is not True
    if not isinstance(a, bool):
        assert right[1] is not True, "only True or False answers whether it collapses"


@pytest.mark.parametrize("answer", ["False", "True", 0, 1, None, [], torch.tensor(True)])
def test_silent_collapses_takes_only_a_bool(answer):
    assert ex.collapses(answer, LoRAFactors.random(2, 8, 6, 2, outer=2)).right is False


def test_silent_a_shape_with_a_fraction_is_not_the_right_shape():
    sink = SharedSinkLoRA(2, 8, 6)
    assert ex.sink_shapes((2, 12.9, 8), (2, 8, 6), sink).right is False
    assert ex.sink_shapes((2, 12.0, 8), (2, 8, 6), sink).right is False  # a size is a whole number
    assert ex.sink_shapes((2, 12, 8), (2, 8, 6), sink).right is True


def test_bounded_a_huge_tensor_answer_is_judged_without_walking_it():
    big = torch.zeros(10 ** 6, dtype=torch.long).as_subclass(_Unwalkable)
    sink = SharedSinkLoRA(2, 8, 6)
    assert ex.segments(big, big, [0, 0, 1], 2).right is False
    assert ex.rank_gate_up_rows(big, sink, 0, 2).right is False
    assert ex.upstream_column(big, 6, 1).right is False
    assert ex.normalized_down_a(big.float(), torch.zeros(2, 12), 2).right is False


@pytest.mark.parametrize("answer", [None, "12", [1, 2], math.nan, True])
def test_clear_error_number_answers_that_are_no_numbers_get_a_verdict(answer):
    from inkling_lab import profile as pr

    case = pr.Case.of("A", 64, 4, 8)
    assert ex.forward_bytes(answer, case).right is False
    assert ex.roofline_time(answer, "memory", case, pr.issue4_upstream().ceilings).right is False


@pytest.mark.parametrize("draw, kwargs, name", [
    (widgets.pool_explorer_figure, dict(slots=0, max_rank=4, rank=2, lora_alpha=4.0, per_expert_outer=False), "slots"),
    (widgets.pool_explorer_figure, dict(slots=2, max_rank=4, rank=-1, lora_alpha=4.0, per_expert_outer=False), "rank"),
    (widgets.pool_explorer_figure, dict(slots=2, max_rank=4, rank=2, lora_alpha=math.nan, per_expert_outer=False),
     "lora_alpha"),
    (widgets.tp_shard_explorer_figure, dict(n=2, intermediate=6, tp=0, layout="interleaved"), "tp"),
    (widgets.tp_shard_explorer_figure, dict(n=2, intermediate=6, tp=2, layout="diagonal"), "layout"),
    (widgets.defect_explorer_figure, dict(rank=0, intermediate=6, seed=0, interleaved=True,
                                          same_outer_for_every_expert=False), "rank"),
    (widgets.defect_explorer_figure, dict(rank=2, intermediate=6, seed=-1, interleaved=True,
                                          same_outer_for_every_expert=False), "seed"),
    (widgets.adapter_explorer_figure, dict(adapter="gate_up", n=0, max_rank=4, tp=1), "n"),
])
def test_clear_error_widget_drawings_name_a_value_outside_their_controls(draw, kwargs, name):
    with pytest.raises((ValueError, TypeError), match=f"{draw.__name__}: {name}"):
        draw(**kwargs)


def test_clear_error_the_adapter_explorer_draws_every_entry_of_its_own_dropdown():
    from pathlib import Path

    from inkling_lab.viz import detached

    folder = Path(__file__).resolve().parents[1] / "data" / "adapters"
    with detached():
        for adapter in sorted(p.name for p in folder.iterdir() if p.is_dir()):
            text, fig = widgets.adapter_explorer_figure(adapter, 2, 4, 1, folder=str(folder))
            assert text and fig is not None, adapter


@pytest.mark.parametrize("shapes", [("3, -1, 8, 16", "3, 2, 12, 4", "3, 2, 4, 6", "3, 1, 16, 4"),
                                    ("3, 1, 8, 16", "3, 2, -12, 4", "3, 2, 4, 6", "3, 1, 16, 4")])
def test_clear_error_the_error_lab_names_a_negative_size(shapes):
    assert "negative size" in widgets.error_lab_report(2, *shapes)
    assert widgets.error_lab_fixed(2, *shapes) is None
