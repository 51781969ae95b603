"""``scripts/gpu/h200_up_cat.py`` on the CPU (``interpreted.sweep_script``: a tiny A in float32): the up GEMM with each
used slot's gate/up ``A`` as more rows gives every token the base product and its own slot's shrink, as the kit's pair
beside each other does, at one slot and at several, so the GPU call cannot die of a typo; a contender whose products
are wrong is left out of the timing."""
import dataclasses

import pytest
import torch

from interpreted import recording_timer, sweep_fixture
from inkling_lab import profile as pr


script = sweep_fixture("h200_up_cat")


@pytest.mark.parametrize("slots", [1, 3])
def test_every_contender_gives_the_base_product_and_each_tokens_own_shrink(script, slots):
    module, tb = script
    seen = []
    row = module.point("A", 16, slots, 70, {"read": None}, 1, device="cpu", timer=recording_timer(seen))
    one = {"grouped_side", "swapped", "grouped_swapped"} if slots == 1 else set()
    assert seen == [{"up", "beside", "up_cat"} | one]
    assert max(row["rel_err"].values()) < 1e-5, row["rel_err"]
    # the products themselves, against the sink's weights and factors read here, not by the script
    sc = pr.Case.of("A", 16, slots, 70).scenario("cpu")
    ops = sc.sink.operands()
    p = tb.plan(ops, 70, sc.batch, sc.x.device)
    if p.offs is None:
        p = dataclasses.replace(p, offs=tb.segment_offsets(p.slots, ops.slots))
    ids = sc.batch.weight_indices.repeat_interleave(torch.diff(sc.batch.seg_indptr)).tolist()
    assert len(set(ids)) == slots
    ga = ops.buffers[0][:, 0]
    want_y = sc.x.double() @ ops.w13_lin.double().T
    want_sh = torch.stack([sc.x[t].double() @ ga[s].double().T for t, s in enumerate(ids)])
    for name, fn in module.contenders(ops, sc.x, p).items():
        y, sh = fn()
        assert torch.allclose(y.double(), want_y, atol=1e-4, rtol=1e-4), name
        if name != "up":
            assert torch.allclose(sh.double(), want_sh, atol=1e-4, rtol=1e-4), name


def test_a_contender_reading_the_wrong_slots_rows_is_not_timed(script, monkeypatch):
    module, _ = script
    contenders = module.contenders

    def shifted(ops, x, p):  # up_cat hands each token its neighbour's shrink
        fns = contenders(ops, x, p)
        up_cat = fns["up_cat"]
        fns["up_cat"] = lambda: (up_cat()[0], up_cat()[1].roll(1, dims=0))
        return fns

    monkeypatch.setattr(module, "contenders", shifted)
    seen = []
    row = module.point("A", 16, 3, 70, {"read": None}, 1, device="cpu", timer=recording_timer(seen))
    assert seen == [{"up", "beside"}] and row["rel_err"]["up_cat"] > 1e-2
