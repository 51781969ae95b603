import pytest

from inkling_lab.geometry import BUFFER_NAMES, PRESETS, Geometry


def test_buffer_shapes_follow_the_spec_symbols():
    g = Geometry(n=3, hidden=16, intermediate=10, rank=4, slots=5, outer=3)
    assert g.buffer_shapes() == {
        "gate_up_a": (5, 3, 8, 16), "gate_up_b": (5, 3, 20, 4),
        "down_a": (5, 3, 4, 10), "down_b": (5, 3, 16, 4)}
    assert list(g.buffer_shapes()) == list(BUFFER_NAMES)
    assert (g.w13, g.w2) == ((3, 20, 16), (3, 16, 10))
    assert (g.w1_delta, g.a_cat) == ((5, 60, 8), (5, 4, 30))
    assert not g.shared_outer and g.with_(outer=1).shared_outer


@pytest.mark.parametrize("outer", [0, 2, 4])
def test_outer_must_be_one_or_n(outer):
    with pytest.raises(ValueError, match="outer must be 1"):
        Geometry(n=3, hidden=4, intermediate=4, outer=outer)


@pytest.mark.parametrize("field", ["n", "hidden", "intermediate", "slots"])
def test_sizes_must_be_positive(field):
    kwargs = dict(n=2, hidden=4, intermediate=4)
    kwargs[field] = 0
    with pytest.raises(ValueError, match=field):
        Geometry(**kwargs)


def test_presets_match_the_benchmark_shapes():
    assert (PRESETS["A"].n, PRESETS["A"].hidden, PRESETS["A"].intermediate) == (2, 1536, 768)
    assert (PRESETS["B"].n, PRESETS["B"].hidden, PRESETS["B"].intermediate) == (2, 4096, 2048)


def test_max_rank_is_the_pools_R_and_rank_still_names_it():
    g = Geometry(n=2, hidden=8, intermediate=6, max_rank=4, slots=3)
    assert g.rank == g.max_rank == 4
    assert Geometry(n=2, hidden=8, intermediate=6, rank=4, slots=3) == g == Geometry(2, 8, 6, 4, 3)
    assert g.with_(rank=2).max_rank == 2 and g.with_(max_rank=3).rank == 3
    with pytest.raises(TypeError, match="max_rank=4 and rank=2 name the same R"):
        Geometry(n=2, hidden=8, intermediate=6, max_rank=4, rank=2)
    with pytest.raises(ValueError, match="max_rank must be at least 0"):
        Geometry(n=2, hidden=8, intermediate=6, rank=-1)


def test_a_tp_shard_holds_F_over_tp_features():
    g = PRESETS["toy"]
    assert g.tp_shard(2) == g.with_(intermediate=3) and g.tp_shard(1) == g
    # The one divisibility check of the kit (geometry.check_tp, ISL-K102), naming the divisors.
    with pytest.raises(ValueError, match=r"Geometry.tp_shard: intermediate size 6 is not divisible by "
                                         r"tp_size=4; .* use a tp in \[1, 2, 3, 6\]"):
        g.tp_shard(4)
    with pytest.raises(ValueError, match="tp_size must be at least 1, got 0"):
        g.tp_shard(0)


def test_inkling_presets_are_the_real_model_and_its_tp_shards():
    ink = PRESETS["inkling"]
    assert (ink.n, ink.hidden, ink.intermediate) == (2, 6144, 3072)
    for tp in (2, 4, 8):
        assert PRESETS[f"inkling-tp{tp}"] == ink.with_(intermediate=3072 // tp)
    assert PRESETS["inkling-tp8"].intermediate == 384


def test_a_valid_pools_layout_is_its_geometry():
    from inkling_lab.validate import validate_pool

    g = Geometry(n=3, hidden=16, intermediate=10, max_rank=4, slots=5, outer=3)
    layout = validate_pool(*g.buffer_shapes().values(), n_shared_experts=3)
    assert isinstance(layout, Geometry) and layout.buffer_shapes() == g.buffer_shapes()
    assert (layout.n, layout.slots, layout.outer, layout.max_rank, layout.rank) == (3, 5, 3, 4, 4)
    assert not layout.shared_outer
    # Upstream's checks let zero extents through, and so does the layout read from them.
    empty = validate_pool((0, 1, 0, 0), (0, 2, 0, 0), (0, 2, 0, 0), (0, 1, 0, 0), n_shared_experts=2)
    assert (empty.slots, empty.max_rank, empty.hidden, empty.intermediate) == (0, 0, 0, 0)
