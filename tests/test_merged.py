"""Merged weights kept per slot (``SharedSinkLoRA.keep_merged``, ``inkling_lab/merged.py``), on the sink:
each kept copy, run as the base forward of its own sink by the float64 reference, is the reference's
forward with the adapter (which reads the pool buffers, not the kit's merge), and equals PEFT's own
``merge_and_unload`` weights for an adapter PEFT saved; the copies follow the
pool through ``on_lora_slots_updated``, ``set_lora_info`` and a change of the base weights, at one
address; bad requests are refused before anything changes. Their routing in the triton backend is
``test_triton.py``'s."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inkling_lab.adapters import load_adapter
from inkling_lab.batch import SlotBatch
from inkling_lab.convert import convert
from inkling_lab.forward.reference import reference_forward
from inkling_lab.geometry import Geometry
from inkling_lab.lora import SharedSinkLoRA
from inkling_lab.operands import SinkOperands
from inkling_lab.records import relative_error
from inkling_lab.scenario import Scenario
from inkling_lab.transformers_interop import make_peft_sink_adapter, sink_from_transformers
from peers import installed


def _case(n=2, H=24, F=10, R=3, S=3, T=11, interleaved=True, seed=0, outer=1):
    g = Geometry(n=n, hidden=H, intermediate=F, max_rank=R, slots=S, outer=outer)
    return Scenario.random(g, tokens=T, seed=seed, interleaved=interleaved)


def _as_base(sink, k: int) -> SinkOperands:
    """Kept row ``k`` as the base weights of a sink with no pool (``w13 [n, 2F, H]``, ``w2 [n, H, F]``)."""
    n, F, H = sink.n_shared_experts, sink.intermediate_size, sink.hidden_size
    w13 = sink.kept.w13[k].view(n, 2 * F, H)
    w2 = sink.kept.w2[k].view(H, n, F).transpose(0, 1)  # kept as w2_lin^T [H, n*F]
    return SinkOperands(w13=w13, w2=w2, w13_lin=sink.kept.w13[k], w2_lin=sink.kept.w2[k].T,
                        interleaved=sink.interleaved)


def _one_slot(sc, s: int, scaling: float) -> SlotBatch:
    S = sc.sink.lora_buffers[0].shape[0]
    scalings = [1.0] * S
    scalings[s] = scaling
    return SlotBatch.from_segments([sc.x.shape[0]], [s], S, scalings=scalings)


def _rel(a, b):
    return relative_error(a, b, norm="fro")


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 3), F=st.integers(1, 9), R=st.integers(1, 4), S=st.integers(1, 4), interleaved=st.booleans(),
       per_expert=st.booleans(), slot=st.integers(0, 3), scaling=st.floats(-2.0, 2.0).filter(lambda c: abs(c) > 0.1),
       seed=st.integers(0, 999))
def test_a_kept_merge_is_the_base_forward_of_the_adapted_weights(n, F, R, S, interleaved, per_expert, slot, scaling,
                                                                 seed):
    """Any expert count (one: ``w2_lin`` a transposed view), features, rank, gate/up layout, outer layout
    (shared or per expert), slot and scaling (negative too): the copy's base forward is the adapter's
    forward, to float32 rounding."""
    slot %= S
    sc = _case(n=n, F=F, R=R, S=S, interleaved=interleaved, seed=seed, outer=n if per_expert else 1)
    nbytes = sc.sink.keep_merged({slot: scaling})
    assert nbytes == n * 3 * F * 24 * 4 and sc.sink.kept.slots == (slot,)
    batch = _one_slot(sc, slot, scaling)
    ref = reference_forward(sc.sink.operands(), sc.x, sc.gammas, batch)
    assert _rel(reference_forward(_as_base(sc.sink, 0), sc.x, sc.gammas, None), ref) < 1e-5
    assert _rel(sc.sink.base_forward(sc.x, sc.gammas), ref) > 1e-3  # the adapter matters here


def test_kept_merges_follow_an_in_place_slot_write_once_it_is_announced():
    """sglang writes a slot in place, then calls ``on_lora_slots_updated``: the named kept slot is
    merged again at the same address; a kept slot not named is left bit for bit."""
    sc = _case(S=3, seed=3)
    sink = sc.sink
    sink.keep_merged({0: 0.5, 2: 1.5})
    ptrs = (sink.kept.w13.data_ptr(), sink.kept.w2.data_ptr())
    before = sink.kept.w13.clone(), sink.kept.w2.clone()
    for buf in sink.lora_buffers:
        buf[2].mul_(-0.7)
    assert torch.equal(sink.kept.w13, before[0])  # not announced yet: the copies are the old pool's
    sink.on_lora_slots_updated([2])
    assert (sink.kept.w13.data_ptr(), sink.kept.w2.data_ptr()) == ptrs
    assert torch.equal(sink.kept.w13[0], before[0][0]) and torch.equal(sink.kept.w2[0], before[1][0])
    ref = reference_forward(sink.operands(), sc.x, sc.gammas, _one_slot(sc, 2, 1.5))
    assert _rel(reference_forward(_as_base(sink, 1), sc.x, sc.gammas, None), ref) < 1e-5
    assert not torch.equal(sink.kept.w13[1], before[0][1])


def test_set_lora_info_merges_the_kept_slots_again_from_the_new_pool():
    sc = _case(S=3, seed=4)
    sink = sc.sink
    sink.keep_merged({1: 2.0})
    kept, ptr = sink.kept, sink.kept.w13.data_ptr()
    other = _case(S=3, seed=5)  # the same shapes, other adapters
    sink.set_lora_info(*(b.clone() for b in other.sink.lora_buffers))
    assert sink.kept is not kept and sink.kept.w13.data_ptr() == ptr and sink.kept.scalings == (2.0,)
    ref = reference_forward(sink.operands(), sc.x, sc.gammas, _one_slot(sc, 1, 2.0))
    assert _rel(reference_forward(_as_base(sink, 0), sc.x, sc.gammas, None), ref) < 1e-5
    per_expert = _case(S=3, seed=6, outer=2)  # the same slots in the other outer layout: still merged
    sink.set_lora_info(*per_expert.sink.lora_buffers)
    ref = reference_forward(sink.operands(), sc.x, sc.gammas, _one_slot(sc, 1, 2.0))
    assert sink.kept.slots == (1,) and _rel(reference_forward(_as_base(sink, 0), sc.x, sc.gammas, None), ref) < 1e-5


def test_a_pool_that_does_not_fit_the_sink_drops_the_kept_slots_and_is_refused():
    """sglang's first wrapper adopts a per-expert pool of another F (the forward refuses it later,
    ISL-K153): the kept copies go with the old pool, and a new request names the misfit."""
    sc = _case(S=3, seed=10)
    sink = sc.sink
    sink.keep_merged({0: 1.0})
    other = _case(F=9, S=3, seed=11, outer=2)
    sink.set_lora_info(*other.sink.lora_buffers)
    assert sink.kept is None
    with pytest.raises(ValueError, match=r"keep_merged: the pool is not of the sink's F = 10 .*ISL-K153"):
        sink.keep_merged({0: 1.0})


def test_a_change_of_the_base_weights_is_merged_again_at_the_next_forward():
    sc = _case(S=2, seed=7)
    sink = sc.sink
    sink.keep_merged({1: 0.8})
    with torch.no_grad():
        sink.w13.mul_(1.5)  # in place: the linearized views' key moves with the version
    ops = sink.operands()
    assert ops.kept is sink.kept
    ref = reference_forward(ops, sc.x, sc.gammas, _one_slot(sc, 1, 0.8))
    assert _rel(reference_forward(_as_base(sink, 0), sc.x, sc.gammas, None), ref) < 1e-5


def test_keep_merged_with_nothing_releases_the_copies():
    sc = _case(S=2, seed=8)
    assert sc.sink.keep_merged({0: 1.0, 1: 1.0}) == 2 * 2 * 3 * 10 * 24 * 4
    assert sc.sink.keep_merged(None) == 0 and sc.sink.kept is None and sc.sink.operands().kept is None


@pytest.mark.parametrize("make, request_, words", [
    ("no_pool", {0: 1.0}, "the sink has no pool: call set_lora_info first"),
    ("shared", {3: 1.0}, "slot 3 is not a slot of the pool (0..2)"),
    ("shared", {-1: 1.0}, "slot -1 is not a slot of the pool (0..2)"),
    ("shared", {True: 1.0}, "slot True is not a slot of the pool"),
    ("shared", {1: math.nan}, "the scaling of slot 1 is nan: pass a finite number"),
    ("shared", {1: None}, "the scaling of slot 1 is None"),
], ids=["no_pool", "past_the_pool", "negative", "bool", "nan", "none"])
def test_keep_merged_refuses_what_it_cannot_merge_and_changes_nothing(make, request_, words):
    sc = _case(S=3, seed=9)
    sink = sc.sink
    if make == "no_pool":
        sink.clear_pool()
    elif make == "shared":
        sink.keep_merged({0: 0.5})
    kept, ops = sink.kept, sink.operands()
    with pytest.raises(ValueError) as info:
        sink.keep_merged(request_)
    said = str(info.value)
    assert said.startswith("keep_merged: ") and words in said and said.endswith("; nothing was kept or changed")
    assert sink.kept is kept and sink.operands() is ops


def test_a_pool_of_another_dtype_is_refused_by_name():
    sc = _case(S=2, seed=12)
    sink = SharedSinkLoRA(n_shared_experts=2, hidden_size=24, intermediate_size=10, dtype=torch.bfloat16)
    sink.set_lora_info(*sc.sink.lora_buffers)  # float32 buffers: adopted, as upstream's first wrapper does
    with pytest.raises(ValueError, match=r"the pool holds torch\.float32 but the sink's weights are "
                                         r"torch\.bfloat16 \(ISL-K161\)"):
        sink.keep_merged({0: 1.0})
    assert sink.kept is None


@pytest.mark.skipif(not installed("peft") or not installed("transformers.models.inkling"),
                    reason="needs peft and transformers >= 5.24 (Inkling)")
@pytest.mark.parametrize("n, H, F, r, interleaved, options", [
    (2, 8, 4, 2, True, {}),
    (3, 6, 5, 3, False, {"use_rslora": True}),
    (1, 7, 3, 1, True, {}),
], ids=["two_experts", "three_rslora_contiguous", "one_expert"])
def test_kept_copies_are_peft_s_own_merged_weights(tmp_path, n, H, F, r, interleaved, options):
    """An adapter PEFT saved (``target_parameters`` on transformers' ``InklingSharedExperts``, one A per
    expert: the per-expert pool), converted and kept: the copy is PEFT's ``merge_and_unload`` weights
    (``W + s*B@A``, float64 throughout), read through transformers' own module layout."""
    made = make_peft_sink_adapter(tmp_path / "peft", n, H, F, r, lora_alpha=r + 1.5, interleaved=interleaved,
                                  lora_options=options)
    pool = convert([load_adapter(made.folder)], n, hidden=H, intermediate=F)
    sink = made.base
    sink.set_lora_info(*pool.buffers())
    sink.keep_merged({0: 1.0})  # the pool folded each module's alpha / r into its B factors
    want13, want2 = sink_from_transformers(made.merged, interleaved=interleaved).linearized()
    torch.testing.assert_close(sink.kept.w13[0], want13, rtol=0, atol=1e-12)
    torch.testing.assert_close(sink.kept.w2[0].T, want2, rtol=0, atol=1e-12)
    assert not torch.allclose(want13, sink.linearized()[0])  # PEFT's merge changed the weights


def test_a_per_expert_refresh_of_ids_past_the_pool_merges_only_the_slots_named():
    """sglang's first wrapper takes any ids for a per-expert pool (nothing is derived there): the kit's
    copies are merged again for the ids that are slots, and a kept slot not named stays bit for bit."""
    sc = _case(S=3, seed=13, outer=2)
    sink = sc.sink
    sink.keep_merged({0: 1.0, 1: 1.0})
    before = sink.kept.w13.clone()
    for buf in sink.lora_buffers:
        buf[1].mul_(2.0)
    sink.on_lora_slots_updated([1, 7, -9])
    assert torch.equal(sink.kept.w13[0], before[0]) and not torch.equal(sink.kept.w13[1], before[1])
    ref = reference_forward(sink.operands(), sc.x, sc.gammas, _one_slot(sc, 1, 1.0))
    assert _rel(reference_forward(_as_base(sink, 1), sc.x, sc.gammas, None), ref) < 1e-5


_STEPS = st.lists(st.one_of(
    st.tuples(st.just("keep"), st.dictionaries(st.integers(0, 2), st.floats(-1.5, 1.5), max_size=3)),
    st.tuples(st.just("write"), st.integers(0, 2), st.floats(-2.0, 2.0)),  # a slot written in place, then announced
    st.tuples(st.just("pool"), st.integers(0, 99)),                          # set_lora_info with a new pool
    st.tuples(st.just("base"), st.floats(0.5, 1.5)),                         # the base weights written in place
), min_size=1, max_size=8)


@settings(max_examples=25, deadline=None)
@given(steps=_STEPS, per_expert=st.booleans(), seed=st.integers(0, 999))
def test_the_kept_copies_stay_the_adapters_forward_through_any_sequence_of_updates(steps, per_expert, seed):
    """Whatever keep requests, announced slot writes, new pools and base-weight writes come, in any
    order: after each, every kept copy, run as a base forward by the float64 reference, is the
    reference's forward with that slot's adapter as the pool then holds it (read from the buffers,
    never from the kit's merge), at the scaling asked for; a copy kept through writes stays at its address."""
    sc = _case(S=3, seed=seed, outer=2 if per_expert else 1)
    sink = sc.sink
    for step in steps:
        kind = step[0]
        ptr = None if sink.kept is None else sink.kept.w13.data_ptr()
        if kind == "keep":
            sink.keep_merged(step[1])
        elif kind == "write":
            for buf in sink.lora_buffers:
                buf[step[1]].mul_(step[2])
            sink.on_lora_slots_updated([step[1]])
        elif kind == "pool":
            sink.set_lora_info(*(b.clone() for b in _case(S=3, seed=step[1], outer=2 if per_expert else 1)
                                 .sink.lora_buffers))
        else:
            with torch.no_grad():
                sink.w2.mul_(step[1])
        ops = sink.operands()
        kept = sink.kept
        if kept is None:
            continue
        if kind != "keep":
            assert kept.w13.data_ptr() == ptr  # graphs captured on the copies replay the new merge
        for k, (s, c) in enumerate(zip(kept.slots, kept.scalings)):
            want = reference_forward(ops, sc.x, sc.gammas, _one_slot(sc, s, c))
            got = reference_forward(_as_base(sink, k), sc.x, sc.gammas, None)
            assert _rel(got, want) < 1e-5, (step, s)
