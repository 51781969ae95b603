"""shard.py: the tensor-parallel slicing of SPEC §7, as pure functions."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inkling_lab.errors import expect_error
from inkling_lab.shard import (check_tp, cut_gate_up, rank_features, shard_pool, shard_w2, shard_w13,
                               slice_lora_a, slice_lora_b, target_module_name)
from inkling_lab.sink import gate_up_rows


def _numbered(*shape: int) -> torch.Tensor:
    return torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)


# -- upstream's slicing ----------------------------------------------------------------------
def test_2d_outer_factors_gain_the_leading_expert_axis():
    a, b = _numbered(4, 8), _numbered(8, 4)                              # gate/up A [r, H], down B [H, r]
    for tp, rank in ((1, 0), (2, 1)):                                    # never cut: the same at any tp
        got_a = slice_lora_a(a, rank, "gate_up_proj_moe", tp, 2)
        got_b = slice_lora_b(b, rank, "down_proj_moe", tp, 2)
        assert got_a.shape == (1, 4, 8) and torch.equal(got_a[0], a)
        assert got_b.shape == (1, 8, 4) and torch.equal(got_b[0], b)


def test_per_expert_dicts_are_cut_expert_by_expert_and_stay_dicts():
    down_a = {0: _numbered(3, 6), 1: _numbered(3, 6) + 100}              # {expert: [r, F]}, F = 6
    got = slice_lora_a(down_a, 1, "down_proj_moe", 2, 2)
    assert list(got) == [0, 1] and all(torch.equal(got[e], down_a[e][:, 3:6]) for e in (0, 1))
    gate_up_b = {0: _numbered(12, 3), 1: _numbered(12, 3) + 100}         # {expert: [2F, r]}
    got = slice_lora_b(gate_up_b, 1, "gate_up_proj_moe", 2, 2)
    for e in (0, 1):
        assert torch.equal(got[e], torch.cat([gate_up_b[e][3:6], gate_up_b[e][9:12]]))
    outer = {0: _numbered(6, 8)}
    assert slice_lora_a(outer, 1, "gate_up_proj_moe", 2, 2) is outer     # replicated: the same dict
    assert slice_lora_b(gate_up_b, 0, "gate_up_proj_moe", 1, 2) is gate_up_b  # tp 1: nothing to cut


def test_a_3d_gate_up_b_is_cut_expert_by_expert_and_stacked():
    b = _numbered(3, 8, 2)                                               # [n, 2F, r], F = 4
    got = slice_lora_b(b, 1, "gate_up_proj_moe", 2, 3)
    assert got.shape == (3, 4, 2)
    assert torch.equal(got, torch.cat([b[:, 2:4], b[:, 6:8]], dim=1))
    with pytest.raises(RuntimeError, match="stack expects a non-empty TensorList"):  # no experts, as upstream
        slice_lora_b(torch.zeros(0, 8, 2), 0, "gate_up_proj_moe", 2, 3)


def test_flat_inner_factors_are_split_into_experts_first():
    down_a = _numbered(2, 12)                                            # [r, n*F], n = 2, F = 6
    got = slice_lora_a(down_a, 0, "down_proj_moe", 1, 2)
    assert got.shape == (2, 2, 6) and got.is_contiguous()
    assert torch.equal(got, down_a.view(2, 2, 6).transpose(0, 1))
    gate_up_b = _numbered(24, 2)                                         # [n*2F, r]
    assert slice_lora_b(gate_up_b, 0, "gate_up_proj_moe", 1, 2).data_ptr() == gate_up_b.data_ptr()  # a view, as upstream's


def test_upstreams_divisibility_errors_and_the_kits_refusals():
    with pytest.raises(ValueError, match="^Shared-sink down LoRA-A width must be divisible by 3, got 10$"):
        slice_lora_a(torch.zeros(2, 10), 0, "down_proj_moe", 2, 3)
    with pytest.raises(ValueError, match="^Shared-sink gate/up LoRA-B height must be divisible by 3, got 10$"):
        slice_lora_b(torch.zeros(10, 2), 0, "gate_up_proj_moe", 2, 3)
    for rank, tp in ((2, 2), (-1, 2), (1, 1), (0, 0)):
        with expect_error("ISL-K101", show=False) as caught:
            slice_lora_a(torch.zeros(2, 12), rank, "down_proj_moe", tp, 2)
        assert f"tp_rank {rank} is outside the tensor-parallel group of size {tp}" in str(caught.exception)
    with expect_error("ISL-K102", show=False):
        slice_lora_a(torch.zeros(2, 12), 0, "down_proj_moe", 4, 2)       # F = 6 over 4 ranks
    with pytest.raises(ValueError, match=r"^target_module must be one of .* got 'o_proj'$"):
        slice_lora_b(torch.zeros(2, 12), 0, "o_proj", 1, 2)


def test_the_rank_is_checked_before_anything_else():
    with expect_error("ISL-K101", show=False):  # a bad rank and a width that does not split: the rank first
        slice_lora_a(torch.zeros(2, 13), 3, "down_proj_moe", 2, 2)


def test_kit_names_are_upstreams():
    assert target_module_name("gate_up_proj") == "gate_up_proj_moe"
    assert target_module_name("down_proj") == "down_proj_moe"
    a = _numbered(2, 12)
    assert torch.equal(slice_lora_a(a, 1, "down_proj", 2, 2), slice_lora_a(a, 1, "down_proj_moe", 2, 2))


def test_intermediate_size_cuts_where_upstreams_module_does():
    # A down A of F = 8 for a module of F = 4 over 2 ranks: upstream keeps features 2..3
    a = _numbered(1, 2, 8)
    assert torch.equal(slice_lora_a(a, 1, "down_proj_moe", 2, 1, intermediate_size=4), a[..., 2:4])
    assert torch.equal(slice_lora_a(a, 1, "down_proj_moe", 2, 1), a[..., 4:8])  # default: the factor's F
    b = _numbered(8, 1)                                                  # 2F = 8: the up half starts at row 4
    assert torch.equal(slice_lora_b({0: b}, 1, "gate_up_proj_moe", 2, 1, intermediate_size=2)[0],
                       b[[1, 5]])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3), F=st.integers(1, 4), tp=st.integers(1, 4), r=st.integers(0, 3))
def test_the_ranks_shards_partition_every_factor(n, F, tp, r):
    F = F * tp
    down_a, gate_up_b = torch.randn(r, n * F), torch.randn(n * 2 * F, r)
    a_parts = [slice_lora_a(down_a, k, "down_proj_moe", tp, n) for k in range(tp)]
    b_parts = [slice_lora_b(gate_up_b, k, "gate_up_proj_moe", tp, n) for k in range(tp)]
    assert torch.equal(torch.cat(a_parts, dim=-1), slice_lora_a(down_a, 0, "down_proj_moe", 1, n))
    half = F // tp
    gates = torch.cat([p[:, :half] for p in b_parts], dim=1)
    ups = torch.cat([p[:, half:] for p in b_parts], dim=1)
    assert torch.equal(torch.cat([gates, ups], dim=1), gate_up_b.view(n, 2 * F, r))


# -- the base weights and the pool ----------------------------------------------------------
@pytest.mark.parametrize("interleaved", [True, False])
def test_base_and_pool_shards_hold_the_ranks_features(interleaved):
    n, F, H, tp, S, R = 2, 6, 4, 3, 2, 2
    w13, w2 = _numbered(n, 2 * F, H), _numbered(n, H, F)
    gate, up = gate_up_rows(F, interleaved)
    local_gate, local_up = gate_up_rows(F // tp, interleaved)
    ga, gb, da, db = _numbered(S, 1, 2 * R, H), _numbered(S, n, 2 * F, R), _numbered(S, n, R, F), _numbered(S, 1, H, R)
    for k in range(tp):
        f = rank_features(F, k, tp)
        part = shard_w13(w13, k, tp, interleaved)
        assert torch.equal(part[:, local_gate], w13[:, gate[f]]) and torch.equal(part[:, local_up], w13[:, up[f]])
        assert torch.equal(shard_w2(w2, k, tp), w2[..., f])
        sga, sgb, sda, sdb = shard_pool(ga, gb, da, db, k, tp)
        assert sga is ga and sdb is db
        assert torch.equal(sgb, torch.cat([gb[:, :, f], gb[:, :, F + f]], dim=2)) and torch.equal(sda, da[..., f])


def test_one_divisibility_check():
    assert check_tp(12, 4) == 3
    with expect_error("ISL-K102", show=False) as caught:
        check_tp(6, 4, "w2")
    assert str(caught.exception).startswith("w2: intermediate size 6 is not divisible by tp_size=4") \
        and "use a tp in [1, 2, 3, 6]" in str(caught.exception)
    with pytest.raises(ValueError, match="^tp_size must be at least 1, got 0$"):
        check_tp(6, 0)
    with expect_error("ISL-K102", show=False):
        cut_gate_up(torch.zeros(12, 2), 0, 4)
