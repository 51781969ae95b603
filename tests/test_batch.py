import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inkling_lab.batch import SlotBatch


def test_runs_of_equal_slots_become_segments():
    b = SlotBatch.from_token_slots([0, 0, 2, -1, -1, 0], num_slots=3)
    assert b.seg_indptr.tolist() == [0, 2, 3, 5, 6]
    assert b.weight_indices.tolist() == [0, 2, -1, 0]
    assert b.max_len == 2 and b.num_tokens == 6 and b.permutation is None


def test_the_token_count_follows_an_in_place_rewrite_of_the_segments():
    """``num_tokens`` is kept with the ``seg_indptr`` storage and version it was read at (every forward asks for it):
    a rewrite in place, whole or through a view, is read again; an equal batch is still equal."""
    b = SlotBatch.from_token_slots([0, 0, 2, -1, -1, 0], num_slots=3)
    twin = SlotBatch.from_token_slots([0, 0, 2, -1, -1, 0], num_slots=3)
    assert b.num_tokens == 6 and b.num_tokens == 6
    b.seg_indptr[-1] = 7  # a longer last segment, written in place
    assert b.num_tokens == 7
    b.seg_indptr.copy_(torch.tensor([0, 1, 2, 3, 4]))
    assert b.num_tokens == 4
    tail = b.seg_indptr[3:]
    tail.add_(1)
    assert b.num_tokens == 5
    assert twin.num_tokens == 6 and twin.weight_indices.equal(b.weight_indices)


def test_grouping_sorts_tokens_by_slot_stably():
    b = SlotBatch.from_token_slots([1, 0, 1, -1, 0], num_slots=2, group=True)
    assert b.weight_indices.tolist() == [-1, 0, 1]
    assert b.seg_indptr.tolist() == [0, 1, 3, 5]
    assert b.permutation.tolist() == [3, 1, 4, 0, 2]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(-1, 4), max_size=40), st.booleans())
def test_token_slots_round_trip(ids, group):
    b = SlotBatch.from_token_slots(ids, num_slots=5, group=group)
    assert b.token_slots().tolist() == ids
    assert b.num_tokens == len(ids)
    lengths = torch.diff(b.seg_indptr)
    assert (lengths > 0).all() and b.max_len == (int(lengths.max()) if len(ids) else 0)


def test_out_of_range_slots_are_refused_with_the_first_culprit():
    with pytest.raises(ValueError, match=r"token 2 uses slot 3, but the pool has slots 0..2 .*1 token\(s\)"):
        SlotBatch.from_token_slots([0, 1, 3], num_slots=3)
    with pytest.raises(ValueError, match="segment 0 uses slot -2"):
        SlotBatch.from_segments([2], [-2], num_slots=3)


def test_active_slots_skip_rank_zero_and_empty_segments():
    b = SlotBatch.from_segments([2, 0, 3, 1], [0, 1, 2, -1], num_slots=3, lora_ranks=[4, 8, 0])
    assert b.active_slots() == [0]
    unknown = SlotBatch.from_segments([2, 3], [0, 2], num_slots=3)
    assert unknown.active_slots() == [0, 2]


def test_per_slot_vectors_must_match_the_pool():
    with pytest.raises(ValueError, match="lora_ranks has 2 entries but the pool has 3 slots"):
        SlotBatch.from_segments([1], [0], num_slots=3, lora_ranks=[1, 2])
    with pytest.raises(ValueError, match="2 segment lengths but 1 slots"):
        SlotBatch.from_segments([1, 2], [0], num_slots=3)
