import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inkling_lab.geometry import Geometry
from inkling_lab.lora import LoRABackend, SharedSinkLoRA, derive_operands
from inkling_lab.pool import LoRAFactors, LoRAPool
from inkling_lab.scenario import Scenario


def _sink(interleaved=True, **kw):
    return SharedSinkLoRA(n_shared_experts=2, hidden_size=8, intermediate_size=6, interleaved=interleaved,
                          dtype=torch.float64, **kw)


def _pool(slots=3, rank=4, outer=1, F=6, H=8, seed=0):
    pool = LoRAPool(n=2, hidden=H, intermediate=F, slots=slots, max_rank=rank, outer=outer, dtype=torch.float64)
    for s in range(slots):
        pool.load(s, LoRAFactors.random(2, H, F, rank=min(rank, 1 + s), outer=outer, seed=seed + s,
                                        dtype=torch.float64))
    return pool


@settings(max_examples=30, deadline=None)
@given(S=st.integers(1, 3), n=st.integers(1, 3), F=st.integers(1, 5), R=st.integers(1, 4),
       interleaved=st.booleans(), seed=st.integers(0, 999))
def test_derived_operands_follow_the_spec_formula(S, n, F, R, interleaved, seed):
    g = torch.Generator().manual_seed(seed)
    gb, da = torch.randn(S, n, 2 * F, R, generator=g), torch.randn(S, n, R, F, generator=g)
    w1, a_cat = derive_operands(gb, da, interleaved)
    assert w1.shape == (S, n * 2 * F, 2 * R) and a_cat.shape == (S, R, n * F)
    for s in range(S):
        for e in range(n):
            for f in range(F):
                gate_row = e * 2 * F + (2 * f if interleaved else f)
                up_row = e * 2 * F + (2 * f + 1 if interleaved else F + f)
                assert torch.equal(w1[s, gate_row], torch.cat([gb[s, e, f], torch.zeros(R)]))
                assert torch.equal(w1[s, up_row], torch.cat([torch.zeros(R), gb[s, e, F + f]]))
                for r in range(R):
                    assert a_cat[s, r, e * F + f] == da[s, e, r, f]


def test_operands_keep_their_address_across_calls_and_refreshes():
    sink, pool = _sink(), _pool()
    sink.set_lora_info(*pool.buffers())
    ptrs = (sink.w1_delta.data_ptr(), sink.a_cat.data_ptr())
    other = _pool(seed=10)
    sink.set_lora_info(*other.buffers())
    assert (sink.w1_delta.data_ptr(), sink.a_cat.data_ptr()) == ptrs
    want = derive_operands(other.gate_up_b, other.down_a, True)
    assert torch.equal(sink.w1_delta, want[0]) and torch.equal(sink.a_cat, want[1])
    other.load(1, LoRAFactors.random(2, 8, 6, rank=4, seed=99, dtype=torch.float64))
    assert not torch.equal(sink.w1_delta, derive_operands(other.gate_up_b, other.down_a, True)[0])
    sink.on_lora_slots_updated({1})
    assert (sink.w1_delta.data_ptr(), sink.a_cat.data_ptr()) == ptrs
    want = derive_operands(other.gate_up_b, other.down_a, True)
    assert torch.equal(sink.w1_delta, want[0]) and torch.equal(sink.a_cat, want[1])


def test_pool_shape_change_raises_and_leaves_the_module_as_it_was():
    sink, small = _sink(), _pool(slots=3, rank=2)
    sink.set_lora_info(*small.buffers())
    before = (sink.lora_buffers, sink.w1_delta.clone(), sink.a_cat.clone(), sink.layout)
    with pytest.raises(RuntimeError) as info:
        sink.set_lora_info(*_pool(slots=4, rank=2).buffers())
    assert str(info.value) == ("Shared-sink LoRA pool shape changed after initialization: "
                               "gate-up (3, 24, 4) -> (4, 24, 4), down-A (3, 2, 12) -> (4, 2, 12)")
    assert sink.lora_buffers is before[0] and sink.layout == before[3]
    assert torch.equal(sink.w1_delta, before[1]) and torch.equal(sink.a_cat, before[2])
    sink.on_lora_slots_updated([0, 1, 2])  # still consistent


def test_a_change_of_h_alone_keeps_the_operand_shapes():
    sink = _sink()
    sink.set_lora_info(*_pool().buffers())
    sink.set_lora_info(*_pool(H=5).buffers())  # H is not part of w1_delta or a_cat


def test_a_per_expert_call_in_between_resets_the_operands():
    sink = _sink()
    sink.set_lora_info(*_pool(slots=3).buffers())
    sink.set_lora_info(*_pool(slots=2, outer=2).buffers())
    assert sink.w1_delta is None and not sink.shared_outer
    sink.set_lora_info(*_pool(slots=4).buffers())
    assert sink.w1_delta.shape[0] == 4


def test_slot_refresh_out_of_range_lists_every_requested_id():
    sink = _sink()
    sink.set_lora_info(*_pool().buffers())
    with pytest.raises(IndexError) as info:
        sink.on_lora_slots_updated([7, 0, -1, 2])
    assert str(info.value) == "Shared-sink LoRA slot out of range: [-1, 0, 2, 7]"


def test_per_expert_pools_and_fresh_modules_accept_any_slot_id():
    sink = _sink()
    sink.on_lora_slots_updated([99])
    sink.set_lora_info(*_pool(outer=2).buffers())
    sink.on_lora_slots_updated([-5, 99])


def test_raw_errors_from_the_operand_step_leave_the_module_untouched():
    sink, pool = _sink(), _pool()
    ga, gb, da, db = pool.buffers()
    # upstream's view of w1_delta [S, n*2F, 2R] = [3, 22, 8] as [S, n, F, 2, 2R]
    with pytest.raises(RuntimeError, match=r"^shape '\[3, 2, 5, 2, 8\]' is invalid for input of size 528$"):
        sink.set_lora_info(ga, gb[:, :, :11], da, db)
    with pytest.raises(IndexError, match="index 2 is out of bounds for dimension 0 with size 2"):
        sink.set_lora_info(ga, gb, da[:2], db)
    assert sink.lora_buffers is None and sink.w1_delta is None


def test_initialize_lora_lists_every_problem():
    with pytest.raises(ValueError) as info:
        _sink().initialize_lora(LoRABackend("csgmv", 4))
    assert str(info.value) == ("InklingBatchDenseMLPWithLoRA is ineligible: multi-slot dense LoRA requires the "
                               "Triton backend; the shared sink does not use linearized BF16 weights")
    bf16 = SharedSinkLoRA(2, 8, 6, interleaved=True, dtype=torch.bfloat16)
    bf16.initialize_lora(LoRABackend("csgmv", 1))  # one slot needs no Triton
    contiguous = SharedSinkLoRA(2, 8, 6, interleaved=False, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="ineligible: the shared sink does not use linearized BF16 weights$"):
        contiguous.initialize_lora(LoRABackend("triton", 4))
    contiguous.initialize_lora(LoRABackend("triton_v2", 4), generation="v2")
    assert contiguous.generation == "v2"


@pytest.mark.parametrize("interleaved,dtype,backend,message", [
    (False, torch.bfloat16, "triton", "InklingBatchDenseMLPWithLoRAV2 needs a backend with the dense engine"),
    (True, torch.float32, "csgmv", "InklingBatchDenseMLPWithLoRAV2 needs a backend with the dense engine"),
    (False, torch.float32, "triton_v2", "InklingBatchDenseMLPWithLoRAV2 needs the linearized BF16 shared sink"),
    (True, torch.float16, "triton_v2", "InklingBatchDenseMLPWithLoRAV2 needs the linearized BF16 shared sink"),
    (True, torch.bfloat16, "triton_v2", "The V2 shared sink must select contiguous W13 before loading"),
])
def test_v2_initialize_lora_raises_the_first_of_its_three_errors(interleaved, dtype, backend, message):
    sink = SharedSinkLoRA(2, 8, 6, interleaved=interleaved, dtype=dtype)
    with pytest.raises(ValueError) as info:
        sink.initialize_lora(LoRABackend(backend, 4), generation="v2")
    assert str(info.value) == message
    assert sink.generation == "v1" and sink.backend is None  # a failed call changes nothing


def test_initialize_lora_starts_without_a_pool():
    sink = SharedSinkLoRA(2, 8, 6, interleaved=False, dtype=torch.bfloat16)
    sink.set_lora_info(*_pool().buffers())
    sink.initialize_lora(LoRABackend("triton_v2", 4), generation="v2")
    assert sink.lora_buffers is None and sink.w1_delta is None and sink.a_cat is None and sink.down_cat is None


# -- the refresh and the order inside set_lora_info (SPEC §3) ------------------------------

def test_refresh_none_is_every_slot_and_an_empty_set_none():
    sink, pool = _sink(), _pool()
    sink.set_lora_info(*pool.buffers())
    for s in range(3):
        pool.load(s, LoRAFactors.random(2, 8, 6, rank=4, seed=50 + s, dtype=torch.float64))
    stale = sink.w1_delta.clone()
    sink.on_lora_slots_updated(set())
    assert torch.equal(sink.w1_delta, stale)
    sink.on_lora_slots_updated(None)
    want = derive_operands(pool.gate_up_b, pool.down_a, True)
    assert torch.equal(sink.w1_delta, want[0]) and torch.equal(sink.a_cat, want[1])


def test_a_second_odd_2f_call_whose_shapes_change_gets_the_pool_shape_error():
    sink, pool = _sink(), _pool()
    ga, gb, da, db = pool.buffers()
    sink.set_lora_info(ga, gb, da, db)
    with pytest.raises(RuntimeError) as info:  # shapes first: not the raw view error of 2F = 11
        sink.set_lora_info(ga, gb[:, :, :11], da, db)
    assert str(info.value) == ("Shared-sink LoRA pool shape changed after initialization: "
                               "gate-up (3, 24, 8) -> (3, 22, 8), down-A (3, 4, 12) -> (3, 4, 12)")


@pytest.mark.parametrize("S,R,H,F", [(0, 2, 3, 2), (2, 0, 3, 2), (2, 2, 0, 2), (2, 2, 3, 0), (0, 0, 0, 0)])
@pytest.mark.parametrize("generation", ["v1", "v2"])
def test_zero_sizes_pass_set_lora_info_as_upstream(S, R, H, F, generation):
    sink = SharedSinkLoRA(2, 8, 6, interleaved=generation == "v1", dtype=torch.bfloat16)
    sink.initialize_lora(LoRABackend("triton_v2" if generation == "v2" else "triton", 4), generation)
    buffers = (torch.zeros(S, 1, 2 * R, H), torch.zeros(S, 2, 2 * F, R), torch.zeros(S, 2, R, F),
               torch.zeros(S, 1, H, R))
    if generation == "v2" and F == 0:  # the engine's segment offsets range(0, n*2F+1, F)
        with pytest.raises(ValueError, match=r"^range\(\) arg 3 must not be zero$"):
            sink.set_lora_info(*buffers)
        return
    sink.set_lora_info(*buffers)
    sink.on_lora_slots_updated(None)
    if generation == "v1":
        assert sink.w1_delta.shape == (S, 2 * 2 * F, 2 * R) and sink.a_cat.shape == (S, R, 2 * F)
    else:
        assert sink.down_cat.shape == (S, R, 2 * F) and sink.a_cat is sink.down_cat


def test_v2_per_expert_views_refuse_empty_pools_as_upstreams_do():
    sink = _v2_sink()
    empty = (torch.zeros(0, 2, 8, 8), torch.zeros(0, 2, 12, 4), torch.zeros(0, 2, 4, 6), torch.zeros(0, 2, 8, 4))
    with pytest.raises(RuntimeError, match=r"^cannot reshape tensor of 0 elements into shape \[0, 16, -1\]"):
        sink.set_lora_info(*empty)  # gate-up A viewed [S, n*2R, -1]: -1 is ambiguous when S = 0
    assert sink.lora_buffers is None and sink.down_cat is None


def test_a_failure_in_the_refresh_leaves_every_operand_as_it_was():
    """Issue 14: down A on the meta device after a good call (upstream copies w1_delta first)."""
    for sink in (_sink(), _v2_sink()):
        pool = _pool()
        ga, gb, da, db = pool.buffers()
        sink.set_lora_info(ga, gb, da, db)
        kept = {k: getattr(sink, k) for k in ("w1_delta", "a_cat", "down_cat")}
        copies = {k: None if t is None else t.clone() for k, t in kept.items()}
        other = _pool(seed=30)
        with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
            sink.set_lora_info(*other.buffers()[:2], other.down_a.to("meta"), other.down_b)
        assert sink.lora_buffers[2] is da
        for k, t in kept.items():
            assert getattr(sink, k) is t and (t is None or torch.equal(t, copies[k]))


def test_per_expert_pools_and_fresh_modules_refresh_nothing_and_check_nothing():
    sink = _sink()
    sink.on_lora_slots_updated(None)
    sink.set_lora_info(*_pool(outer=2).buffers())
    sink.on_lora_slots_updated(None)
    assert sink.w1_delta is None


# -- the second generation (SPEC §3) ---------------------------------------------------------

def _v2_sink():
    sink = SharedSinkLoRA(2, 8, 6, interleaved=False, dtype=torch.bfloat16)
    sink.initialize_lora(LoRABackend("triton_v2", 4), generation="v2")
    return sink


def test_v2_down_cat_is_a_cat_shared_and_down_b_per_expert():
    sink, pool = _v2_sink(), _pool()
    sink.set_lora_info(*pool.buffers())
    want = derive_operands(pool.gate_up_b, pool.down_a, False)
    assert sink.down_cat.shape == (3, 4, 12) and sink.a_cat is sink.down_cat
    assert torch.equal(sink.down_cat, want[1]) and torch.equal(sink.w1_delta, want[0])
    per_expert = _v2_sink()
    p = _pool(outer=2)
    per_expert.set_lora_info(*p.buffers())
    assert per_expert.down_cat.shape == (3, 8, 8) and per_expert.w1_delta is None and per_expert.a_cat is None
    # down_cat[s, h, e*R + r] = down_B[s, e, h, r]
    assert torch.equal(per_expert.down_cat.view(3, 8, 2, 4), p.down_b.permute(0, 2, 1, 3).to(torch.float64))


@pytest.mark.parametrize("outer", [1, 2])
def test_v2_forwards_as_the_first_generation_on_the_same_weights(outer):
    """One scenario (weights, pool, tokens, batch) on a first- and a second-generation sink."""
    case = dict(tokens=5, dtype=torch.bfloat16, interleaved=False, adapters=[4, 4, 0], token_slots=[0, 0, 1, 2, -1])
    g = Geometry(2, 8, 6, 4, 3, outer=outer)
    plain, v2 = Scenario.random(g, **case), Scenario.random(g, **case, sink=_v2_sink())
    assert v2.sink.generation == "v2" and v2.sink.down_cat is not None and torch.equal(v2.sink.w13, plain.sink.w13)
    assert torch.equal(v2.forward("torch"), plain.forward("torch"))


def test_v2_pool_shape_error_names_one_pair_and_a_per_expert_call_does_not_reset():
    sink = _v2_sink()
    sink.set_lora_info(*_pool(rank=4).buffers())
    before = (sink.lora_buffers, sink.down_cat.clone())
    with pytest.raises(RuntimeError) as info:
        sink.set_lora_info(*_pool(rank=5).buffers())
    assert str(info.value) == "Shared-sink LoRA pool shape changed after initialization: (3, 4, 12) -> (3, 5, 12)"
    with pytest.raises(RuntimeError, match=r"\(3, 4, 12\) -> \(3, 8, 8\)$"):
        sink.set_lora_info(*_pool(outer=2).buffers())  # V1 would start afresh here; V2 compares down_cat
    assert sink.lora_buffers is before[0] and torch.equal(sink.down_cat, before[1])


def test_v2_gets_pythons_own_errors_where_its_unpacking_fails():
    sink, pool = _v2_sink(), _pool()
    ga, gb, da, db = pool.buffers()
    with pytest.raises(ValueError, match=r"^not enough values to unpack \(expected 4, got 3\)$"):
        sink.set_lora_info(ga[0], gb, da, db)
    with pytest.raises(ValueError, match=r"^too many values to unpack \(expected 4\)$"):
        sink.set_lora_info(ga, gb.unsqueeze(0), da, db)
    with pytest.raises(IndexError, match=r"^tuple index out of range$"):
        sink.set_lora_info(ga, gb, da, db[0, 0])
    with pytest.raises(ValueError, match="^Inkling shared-sink LoRA pool buffers do not agree: expected gate-up A "
                                         r"\[slots, 1 or 2, 2R, H\]"):
        sink.set_lora_info(ga[:, :, :4], gb, da, db)
    assert sink.lora_buffers is None


def test_v2_refresh_does_not_range_check():
    sink = _v2_sink()
    sink.on_lora_slots_updated({99})  # before set_lora_info: nothing happens
    pool = _pool()
    sink.set_lora_info(*pool.buffers())
    with pytest.raises(IndexError, match="^index 7 is out of bounds for dimension 0 with size 3$"):
        sink.on_lora_slots_updated({7})
    pool.load(2, LoRAFactors.random(2, 8, 6, rank=4, seed=77, dtype=torch.float64))
    sink.on_lora_slots_updated({-1})  # torch's negative index: the last slot
    want = derive_operands(pool.gate_up_b, pool.down_a, False)
    assert torch.equal(sink.down_cat, want[1]) and torch.equal(sink.w1_delta, want[0])


# -- tensor-parallel slicing (SPEC §7): the module delegates to shard.py ----------------------

def test_down_a_is_cut_along_f_and_flat_factors_gain_their_expert_axis():
    sink = _sink()
    flat = torch.arange(4 * 12, dtype=torch.float64).reshape(4, 12)      # [r, n*F]
    per_expert = flat.reshape(4, 2, 6).transpose(0, 1)                     # [n, r, F]
    shards = [sink.slice_lora_a(flat, k, "down_proj", 3) for k in range(3)]
    assert all(s.shape == (2, 4, 2) for s in shards)
    torch.testing.assert_close(torch.cat(shards, dim=-1), per_expert)
    torch.testing.assert_close(sink.slice_lora_a(per_expert, 1, "down_proj", 3), shards[1])


def test_gate_up_b_keeps_the_same_slice_of_both_halves():
    sink = _sink()
    b = torch.randn(2, 12, 4, dtype=torch.float64)                         # [n, 2F, r], F=6
    shard = sink.slice_lora_b(b, 1, "gate_up_proj", 2)
    assert shard.shape == (2, 6, 4)
    torch.testing.assert_close(shard[:, :3], b[:, 3:6])                   # gate features 3..5
    torch.testing.assert_close(shard[:, 3:], b[:, 9:12])                  # up features 3..5
    torch.testing.assert_close(sink.slice_lora_b(b.reshape(24, 4), 1, "gate_up_proj", 2), shard)


def test_outer_factors_are_replicated_and_2d_ones_gain_the_expert_axis():
    sink = _sink()
    a, b = torch.randn(1, 8, 8), torch.randn(1, 8, 4)
    assert sink.slice_lora_a(a, 1, "gate_up_proj", 2) is a
    assert sink.slice_lora_b(b, 1, "down_proj_moe", 2) is b
    assert torch.equal(sink.slice_lora_a(a[0], 1, "gate_up_proj", 2), a)      # [r, H] -> [1, r, H]
    assert torch.equal(sink.slice_lora_b(b[0], 1, "down_proj", 2), b)         # [H, r] -> [1, H, r]


def test_slicing_errors():
    sink = _sink()
    with pytest.raises(ValueError, match="^Shared-sink down LoRA-A width must be divisible by 2, got 13$"):
        sink.slice_lora_a(torch.randn(4, 13), 0, "down_proj", 1)
    with pytest.raises(ValueError, match="^Shared-sink gate/up LoRA-B height must be divisible by 2, got 25$"):
        sink.slice_lora_b(torch.randn(25, 4), 0, "gate_up_proj", 1)
    with pytest.raises(ValueError, match="tp_rank 2 is outside the tensor-parallel group of size 2"):
        sink.slice_lora_a(torch.randn(4, 12), 2, "gate_up_proj", 2)
    with pytest.raises(ValueError, match="intermediate size 6 is not divisible by tp_size=4"):
        sink.slice_lora_b(torch.randn(24, 4), 0, "gate_up_proj", 4)
    with pytest.raises(ValueError, match="target_module must be one of"):
        sink.slice_lora_a(torch.randn(4, 12), 0, "o_proj", 1)
