import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inkling_lab.lora import LoRABackend, SharedSinkLoRA, derive_operands
from inkling_lab.pool import LoRAFactors, LoRAPool


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
    contiguous.initialize_lora(LoRABackend("triton", 4), generation="v2")
    assert contiguous.generation == "v2"


# -- tensor-parallel slicing (SPEC §7) ------------------------------------------------

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


def test_outer_factors_are_replicated():
    sink = _sink()
    a, b = torch.randn(1, 8, 8), torch.randn(1, 8, 4)
    assert sink.slice_lora_a(a, 1, "gate_up_proj", 2) is a
    assert sink.slice_lora_b(b, 1, "down_proj_moe", 2) is b


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
