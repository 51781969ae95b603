"""The fused GEMMs (``forward/fused_gemm.py``, ``Tiles.tma``) in Triton's CPU interpreter,
against the float64 reference: float32 at small odd sizes (SPEC §9; bf16 and fp16 are
checked on the H200 by ``scripts/gpu/h200_fused.py``, whose record holds the errors).
Fresh random inputs, the output poisoned with NaN; both gate/up layouts, one slot (the
cuBLAS shrinks), no adapter, persistent programs looping over several tiles; what ``plan``
refuses or routes elsewhere (several slots, the per-expert outer layout)."""
import pytest
import torch

from interpreted import import_interpreted
from inkling_lab.batch import SlotBatch
from inkling_lab.forward.reference import reference_forward
from inkling_lab.geometry import Geometry
from inkling_lab.records import relative_error
from inkling_lab.scenario import Scenario

tb = import_interpreted("inkling_lab.forward.kernels", "inkling_lab.forward.fused_gemm",
                        "inkling_lab.forward.triton_backend")


@pytest.fixture(autouse=True)
def _interpreter_on(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def tiles(programs: int) -> "tb.Tiles":
    """16-row tiles: 37 tokens are three row tiles, the last partial; 2 programs loop over them."""
    return tb.Tiles(bm=16, bf=16, bn=16, bk=16, k_chunk=16, warps=4, stages=1, group_m=2, tma=True, sbm=16,
                    programs=programs)


def case(interleaved: bool, token_slots: list[int], seed: int):
    g = Geometry(n=2, hidden=40, intermediate=32, max_rank=8, slots=3, outer=1)
    sc = Scenario.random(g, tokens=len(token_slots), seed=seed, interleaved=interleaved)
    gen = torch.Generator().manual_seed(seed)
    batch = SlotBatch.from_token_slots(torch.tensor(token_slots), 3, lora_ranks=[8, 0, 8],
                                       scalings=(0.5 + torch.rand(3, generator=gen)).tolist())
    return sc.sink, sc.x, sc.gammas, batch


def run(sink, x, gammas, batch, t):
    ops = sink.operands()
    out = torch.full_like(x, float("nan"))
    p = tb.plan(ops, x.shape[0], batch, x.device, t)
    tb.launch(ops, x, gammas, p, out)
    return out, p


MIXED = [0] * 11 + [2] * 8 + [-1] * 5 + [2] * 6 + [1] * 7  # two LoRA slots, base only, rank 0
ONE = [2] * 37


@pytest.mark.parametrize("interleaved, programs", [(True, -1), (False, 2)],
                         ids=["interleaved", "contiguous-persistent"])
def test_fused_gemms_match_the_reference(interleaved, programs):
    sink, x, gammas, batch = case(interleaved, ONE, seed=programs + 3 * int(interleaved))
    ref = reference_forward(sink.operands(), x, gammas, batch)
    out, p = run(sink, x, gammas, batch, tiles(programs))
    assert p.single_slot == 2  # one slot: the cuBLAS shrinks around the two kernels
    assert torch.isfinite(out).all(), "some output element was never written"
    assert relative_error(out, ref, "fro") < 1e-5
    assert relative_error(sink.base_forward(x, gammas), ref, "fro") > 0.05  # the LoRA terms matter here


def test_fused_gemms_without_an_adapter_are_the_base_sink():
    sink, x, gammas, _ = case(True, ONE[:21], seed=3)
    out, _ = run(sink, x, gammas, None, tiles(-1))
    assert relative_error(out, reference_forward(sink.operands(), x, gammas, None), "fro") < 1e-5


def test_explicit_fused_tiles_are_refused_by_name_where_they_cannot_run():
    sink, x, gammas, batch = case(True, MIXED, seed=5)
    with pytest.raises(ValueError, match="more than one slot"):
        tb.plan(sink.operands(), x.shape[0], batch, x.device, tiles(-1))
    g = Geometry(n=2, hidden=40, intermediate=32, max_rank=8, slots=3, outer=2)
    sc = Scenario.random(g, tokens=5, seed=1)
    with pytest.raises(ValueError, match="fused_gemm.supported"):
        tb.plan(sc.sink.operands(), 5, sc.batch, sc.x.device, tiles(-1))


@pytest.mark.parametrize("rank", [tb.FUSED_MIN_RANK - 1, 64])
def test_auto_sends_only_one_slot_batches_of_the_measured_sizes_to_the_fused_gemms(rank):
    g = Geometry(n=2, hidden=64, intermediate=64, max_rank=rank, slots=3, outer=1)
    ops, (lo, hi), cpu = Scenario.random(g, tokens=1, seed=1).sink.operands(), tb.FUSED_TOKENS, torch.device("cpu")

    def tiles_for(token_slots):
        return tb.plan(ops, len(token_slots), SlotBatch.from_token_slots(torch.tensor(token_slots), 3), cpu).tiles

    routed = rank >= tb.FUSED_MIN_RANK
    assert tiles_for([2] * hi).tma == routed and tiles_for([1] * (lo + 1)).tma == routed
    assert not tiles_for([2] * lo).tma and not tiles_for([2] * (hi + 1)).tma  # outside the measured sizes
    assert not tiles_for([0, 2] * (hi // 2)).tma                              # two slots
    assert not tb.plan(ops, hi, None, cpu).tiles.tma                           # no adapter
