import pytest
import torch

from inkling_lab.pool import LoRAFactors, LoRAPool


def _pool(**kw):
    args = dict(n=2, hidden=8, intermediate=6, slots=3, max_rank=4)
    args.update(kw)
    return LoRAPool(**args, dtype=torch.float64)


def test_buffers_have_the_spec_shapes_in_set_lora_info_order():
    ga, gb, da, db = _pool(outer=2).buffers()
    assert [tuple(t.shape) for t in (ga, gb, da, db)] == [(3, 2, 8, 8), (3, 2, 12, 4), (3, 2, 4, 6), (3, 2, 8, 4)]
    assert all((t == 0).all() for t in (ga, gb, da, db))


def test_load_places_halves_at_max_rank_offsets_and_scales_b():
    pool = _pool()
    f = LoRAFactors.random(n=2, hidden=8, intermediate=6, rank=2, lora_alpha=6.0, seed=1, dtype=torch.float64)
    pool.load(1, f, name="a")
    R, r, scale = 4, 2, 3.0
    ga, gb, da, db = (t[1] for t in pool.buffers())
    assert torch.equal(ga[:, :r], f.gate_up_a[:, :r]) and torch.equal(ga[:, R:R + r], f.gate_up_a[:, r:])
    assert (ga[:, r:R] == 0).all() and (ga[:, R + r:] == 0).all()
    torch.testing.assert_close(gb[..., :r], f.gate_up_b * scale)
    torch.testing.assert_close(db[..., :r], f.down_b * scale)
    assert torch.equal(da[:, :r], f.down_a)
    assert (gb[..., r:] == 0).all() and (da[:, r:] == 0).all() and (db[..., r:] == 0).all()
    assert pool.lora_ranks == [0, 2, 0] and pool.adapter_scalings == [0.0, 3.0, 0.0]
    assert all((t[0] == 0).all() and (t[2] == 0).all() for t in pool.buffers())


def test_reloading_a_slot_zeroes_what_the_larger_adapter_left():
    pool = _pool()
    pool.load(0, LoRAFactors.random(2, 8, 6, rank=4, seed=1, dtype=torch.float64))
    pool.load(0, LoRAFactors.random(2, 8, 6, rank=1, seed=2, dtype=torch.float64))
    assert (pool.down_a[0, :, 1:] == 0).all() and (pool.gate_up_a[0, :, 1:4] == 0).all()
    assert pool.lora_ranks[0] == 1


def test_clear_and_evict():
    pool = _pool()
    pool.load(2, LoRAFactors.random(2, 8, 6, rank=3, seed=1, dtype=torch.float64), name="sql")
    assert pool.slot_of("sql") == 2
    assert pool.evict("sql") == 2
    assert all((t == 0).all() for t in pool.buffers()) and pool.names == [None, None, None]
    with pytest.raises(KeyError, match="no adapter named 'sql'"):
        pool.evict("sql")


def test_a_shared_outer_adapter_fills_every_expert_of_a_per_expert_pool():
    pool = _pool(outer=2)
    f = LoRAFactors.random(2, 8, 6, rank=4, seed=3, dtype=torch.float64)
    pool.load(0, f)
    assert torch.equal(pool.gate_up_a[0, 0], pool.gate_up_a[0, 1])
    assert torch.equal(pool.down_b[0, 0], pool.down_b[0, 1])


@pytest.mark.parametrize("which,field", [("gate_up_proj_moe lora_A", "gate_up_a"), ("down_proj_moe lora_B", "down_b")])
def test_per_expert_factors_are_refused_by_a_shared_outer_pool(which, field):
    f = LoRAFactors.random(2, 8, 6, rank=4, outer=2, seed=0, dtype=torch.float64)
    if field == "down_b":
        f.gate_up_a = f.gate_up_a[:1]
    with pytest.raises(ValueError) as info:
        _pool().load(0, f)
    assert str(info.value) == f"experts_shared_outer_loras is enabled but {which} has expert_dim=2 (expected 1)."


@pytest.mark.parametrize("kw", [dict(rank=8), dict(hidden=9), dict(intermediate=5)])
def test_an_adapter_that_does_not_fit_fails_upstreams_assertion(kw):
    args = dict(n=2, hidden=8, intermediate=6, rank=4)
    args.update(kw)
    pool = _pool()
    with pytest.raises(AssertionError, match=r"LoRA buffer shape torch\.Size\(\[.*\]\) does not match weight shape torch\.Size\(\[.*\]\)\."):
        pool.load(0, LoRAFactors.random(**args, seed=0, dtype=torch.float64))


def test_slots_out_of_range_are_refused():
    with pytest.raises(IndexError, match=r"LoRAPool slot 3 is outside the pool: use a slot in 0..2"):
        _pool().load(3, LoRAFactors.random(2, 8, 6, rank=4))


def test_rank_zero_adapter_is_an_empty_slot():
    f = LoRAFactors.random(2, 8, 6, rank=0)
    assert f.scaling == 0.0
    pool = _pool()
    pool.load(0, f)
    assert pool.lora_ranks[0] == 0 and all((t == 0).all() for t in pool.buffers())
