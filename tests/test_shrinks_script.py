"""``scripts/gpu/h200_shrinks.py`` on the CPU (``interpreted.sweep_script``: a tiny A in float32, the interpreted
backend): every contender at a point, the grouped GEMM and each tile of ``shrink_kernel``, gives each token its own
slot's product on both sides, so the GPU call cannot die of a typo; a shrink that reads another slot's factor is
left out of the timing."""
import dataclasses

import pytest
import torch

from interpreted import recording_timer, sweep_fixture
from inkling_lab import profile as pr


script = sweep_fixture("h200_shrinks")


@pytest.mark.slow
def test_every_contender_is_each_tokens_own_slot_product(script):
    module, tb = script
    seen = []
    rows = module.point("A", 16, 3, 130, {"read": None}, 1, device="cpu", timer=recording_timer(seen))
    names = {"grouped", *(module.variant_name(*v) for v in module.VARIANTS)}
    assert [r["side"] for r in rows] == ["up", "down"]
    for r, timed in zip(rows, seen):
        assert set(r["rel_err"]) == names == timed, r["rel_err"]
        assert max(r["rel_err"].values()) < 1e-5, r["rel_err"]
        assert r["kit"] in names
    # the products themselves, against the sink's factors read here, not by the script
    sc = pr.Case.of("A", 16, 3, 130).scenario("cpu")
    ops = sc.sink.operands()
    p = tb.plan(ops, 130, sc.batch, sc.x.device)
    slots = p.slots.long()
    assert (slots[1:] >= slots[:-1]).all() and slots.unique().numel() > 1  # slot order, several slots
    ga = ops.buffers[0][:, 0]
    want = torch.stack([sc.x[t].double() @ ga[s].double().T for t, s in enumerate(slots.tolist())])
    got = module.shrink_contenders(ops, sc.x, torch.zeros(130, ops.n * ops.intermediate),
                                   dataclasses.replace(p, offs=tb.segment_offsets(p.slots, ops.slots)), "up")
    for name in ("grouped", module.variant_name(128, 512, 8)):
        assert torch.allclose(got[name]().double(), want, atol=1e-4, rtol=1e-4), name


@pytest.mark.slow
def test_a_shrink_reading_another_slots_factor_is_not_timed(script, monkeypatch):
    module, tb = script
    shrink = tb._shrink

    def wrong(x, p, a, *args, **kw):  # every token on the next slot's factor
        return shrink(x, dataclasses.replace(p, slots=(p.slots + 1) % p.scalings.numel()), a, *args, **kw)

    monkeypatch.setattr(tb, "_shrink", wrong)
    seen = []
    rows = module.point("A", 16, 3, 130, {"read": None}, 1, device="cpu", timer=recording_timer(seen))
    assert all(s == {"grouped"} for s in seen)
    assert all(r["rel_err"]["grouped"] < 1e-5 for r in rows)
