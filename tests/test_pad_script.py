"""``scripts/gpu/h200_pad.py`` on the CPU (``interpreted.sweep_script``: a tiny A in float32): every padded GEMM gives
the unpadded product (zero rows of ``w13_lin`` add columns nobody reads, zero columns of ``act`` against zero rows of
``w2_lin`` add nothing), so the GPU call cannot die of a typo; a contender whose product is wrong is left out of the
timing."""
import torch

from interpreted import recording_timer, sweep_fixture
from inkling_lab import profile as pr


script = sweep_fixture("h200_pad")


def test_every_pad_gives_the_unpadded_products(script):
    module, _ = script
    seen = []
    row = module.point("A", 40, None, 1, device="cpu", timer=recording_timer(seen), pads=(0, 8, 64))
    names = {f"{side}+{p}" for side in ("up", "down") for p in (0, 8, 64)}
    assert seen == [names] and set(row["rel_err"]) == names
    assert max(row["rel_err"].values()) < 1e-6, row["rel_err"]
    # the products themselves, against the sink's weights read here, not by the script
    sc = pr.Case.of("A", 16, 1, 40).scenario("cpu")
    ops = sc.sink.operands()
    act = torch.randn(40, ops.n * ops.intermediate)
    fns = module.contenders(ops, sc.x, act, pads=(0, 8))
    for p in (0, 8):
        assert torch.allclose(fns[f"up+{p}"]().double(), sc.x.double() @ ops.w13_lin.double().T, atol=1e-4), p
        assert torch.allclose(fns[f"down+{p}"]().double(), act.double() @ ops.w2_lin.double(), atol=1e-4), p


def test_a_pad_that_changes_the_product_is_not_timed(script, monkeypatch):
    module, _ = script
    contenders = module.contenders

    def wrong(ops, x, act, pads):  # the padded down GEMM reads ones where the zeros belong
        fns = contenders(ops, x, act, pads)
        fns["down+8"] = lambda: torch.cat([act, act.new_ones(act.shape[0], 8)], 1) @ torch.cat(
            [ops.w2_lin, ops.w2_lin.new_ones(8, ops.hidden)])
        return fns

    monkeypatch.setattr(module, "contenders", wrong)
    seen = []
    row = module.point("A", 40, None, 1, device="cpu", timer=recording_timer(seen), pads=(0, 8))
    assert seen == [{"up+0", "up+8", "down+0"}] and row["rel_err"]["down+8"] > 1e-2
