"""``act_down.py`` (beside this file) in Triton's CPU interpreter, float32, against the float64 reference:
a few tokens of one kept slot in two launches, the activation in either GEMM (cuBLAS's up GEMM and
``act_down_kernel``, or ``up_act_kernel`` and cuBLAS's down GEMM), are the adapter's forward
(``reference_forward``, which never looks at the copies) for any expert count, both gate/up layouts, both
outer layouts, kept rows past the first, token counts below, at and past the 16-token tile, and tiles
whose K step does not divide the reduction (``F`` in every expert, or ``H``: a masked last step) or whose
rows do not divide the outputs."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from interpreted import import_interpreted, interpreter_on
from inkling_lab.batch import SlotBatch
from inkling_lab.forward.reference import reference_forward
from inkling_lab.geometry import Geometry
from inkling_lab.records import relative_error
from inkling_lab.scenario import Scenario

# The library's backend module first: act_down imports it (for the side stream), and imported only under
# TRITON_INTERPRET it would be a copy with interpreted kernels that every later test in the session sees.
import inkling_lab.forward.triton_backend  # noqa: E402,F401

ad = import_interpreted("inkling_lab.forward.kernels", "act_down")


@settings(max_examples=16, deadline=None)
@given(n=st.integers(1, 3), H=st.sampled_from([24, 40, 48]), F=st.sampled_from([16, 24, 40]), T=st.integers(2, 33),
       interleaved=st.booleans(), per_expert=st.booleans(), slot=st.integers(0, 3),
       bh=st.sampled_from([16, 32]), bk=st.sampled_from([16, 32]), fold=st.sampled_from(ad.FOLDS),
       split=st.integers(1, 4), seed=st.integers(0, 2 ** 16))
def test_two_launches_on_a_kept_slot_are_the_adapters_forward(n, H, F, T, interleaved, per_expert, slot, bh, bk, fold,
                                                              split, seed):
    """Either fold; the up fold with its ``H`` split over 1-4 programs a tile (some slices empty where the
    split outruns ``H``), its workspace left zero for the next launch, which gives the same output."""
    g = Geometry(n=n, hidden=H, intermediate=F, max_rank=8, slots=4, outer=n if per_expert else 1)
    sc = Scenario.random(g, tokens=T, seed=seed, interleaved=interleaved)
    scalings = [0.6, 1.0, 1.4, 0.8]
    kept = sorted({0, slot, 3})  # the row of the slot is its place among the kept ones
    sc.sink.keep_merged({s: scalings[s] for s in kept})
    ops = sc.sink.operands()
    batch = SlotBatch.from_segments([T], [slot], 4, scalings=scalings)
    t = ad.tiles(T, bh=bh, bk=bk, stages=2, split=split if fold == "up" else 1)
    work = ad.workspace(ops, T, t, sc.x.device)
    outs = [torch.full_like(sc.x, float("nan")) for _ in range(2)]
    with interpreter_on():
        for out in outs:
            ad.kept_forward(ops, sc.x, sc.gammas, kept.index(slot), out, t, fold, work)
    want = reference_forward(ops, sc.x, sc.gammas, batch)
    assert relative_error(outs[0], want, "fro") < 1e-5
    assert torch.equal(outs[0], outs[1]) and not work[0].any() and not work[1].any()
    assert relative_error(outs[0], sc.sink.base_forward(sc.x, sc.gammas), "fro") > 1e-2  # the copy holds the adapter


@pytest.mark.parametrize("fold, tiles, words", [
    ("down", 16, r"20 tokens do not fit its token tile of 16; make the tiles with tiles\(20\)"),
    ("sideways", 32, r"fold 'sideways' is not one of \('down', 'up'\)")])
def test_what_it_cannot_run_is_refused_by_name_before_anything_is_written(fold, tiles, words):
    g = Geometry(n=2, hidden=24, intermediate=16, max_rank=4, slots=1, outer=1)
    sc = Scenario.random(g, tokens=20, seed=3)
    sc.sink.keep_merged({0: 1.0})
    out = torch.zeros_like(sc.x)
    with pytest.raises(ValueError, match=words):
        ad.kept_forward(sc.sink.operands(), sc.x, sc.gammas, 0, out, ad.tiles(tiles), fold)
    assert bool((out == 0).all())


@pytest.mark.parametrize("tokens, tile", [(1, 16), (2, 16), (16, 16), (17, 32), (32, 32), (33, 64)])
def test_the_token_tile_is_the_next_power_of_two_from_16(tokens, tile):
    assert ad.tiles(tokens).bt == tile


@settings(max_examples=16, deadline=None)
@given(n=st.integers(1, 3), H=st.sampled_from([24, 40, 48]), F=st.sampled_from([16, 24, 40]), T=st.integers(2, 33),
       R=st.integers(1, 20), interleaved=st.booleans(), slot=st.integers(0, 3), scaling=st.floats(0.25, 2.0),
       bh=st.sampled_from([16, 32]), bk=st.sampled_from([16, 32]), seed=st.integers(0, 2 ** 16))
def test_one_slot_with_its_lora_in_the_down_gemm_is_the_adapters_forward(n, H, F, T, R, interleaved, slot, scaling,
                                                                         bh, bk, seed):
    """``slot_forward``: the pool as it is (nothing kept), any rank (a rank tile wider than it), the slot's
    scaling read from the device tensor."""
    g = Geometry(n=n, hidden=H, intermediate=F, max_rank=R, slots=4, outer=1)
    sc = Scenario.random(g, tokens=T, seed=seed, interleaved=interleaved)
    scalings = [0.6, 1.0, 1.4, 0.8]
    scalings[slot] = scaling
    batch = SlotBatch.from_segments([T], [slot], 4, scalings=scalings)
    ops = sc.sink.operands()
    out = torch.full_like(sc.x, float("nan"))
    with interpreter_on():
        ad.slot_forward(ops, sc.x, sc.gammas, slot, torch.tensor(scalings), out, ad.tiles(T, bh=bh, bk=bk, stages=2))
    assert relative_error(out, reference_forward(ops, sc.x, sc.gammas, batch), "fro") < 1e-5
    assert relative_error(out, sc.sink.base_forward(sc.x, sc.gammas), "fro") > 1e-3  # the LoRA is in it


def test_slot_forward_refuses_per_expert_outer_factors_and_a_slot_past_the_pool():
    g = Geometry(n=2, hidden=24, intermediate=16, max_rank=4, slots=2, outer=2)
    sc = Scenario.random(g, tokens=4, seed=5)
    out = torch.zeros_like(sc.x)
    with pytest.raises(ValueError, match="shared outer layout"):
        ad.slot_forward(sc.sink.operands(), sc.x, sc.gammas, 0, torch.ones(2), out, ad.tiles(4))
    shared = Scenario.random(Geometry(n=2, hidden=24, intermediate=16, max_rank=4, slots=2, outer=1), tokens=4, seed=5)
    with pytest.raises(ValueError, match="slot 2 is not in the pool of 2 slots"):
        ad.slot_forward(shared.sink.operands(), shared.x, shared.gammas, 2, torch.ones(2), out, ad.tiles(4))
    assert bool((out == 0).all())
