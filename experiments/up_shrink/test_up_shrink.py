"""v58's one-launch up GEMM and shrink (``up_shrink``) against float64 products, in Triton's interpreter (float32):
random sizes whose token and column counts leave partial tiles, with and without the shrink's tiles, both tile
orders."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from interpreted import import_interpreted, interpreter_on, without_overflow_checks
from inkling_lab import records

ups = import_interpreted("up_shrink")


def products(T, N, R2, H, seed):
    gen = torch.Generator().manual_seed(seed)
    x, w = torch.randn(T, H, generator=gen), torch.randn(N, H, generator=gen)
    a = torch.randn(R2, H, generator=gen) if R2 else None
    return x, w, a


@settings(max_examples=12, deadline=None)
@given(T=st.integers(1, 40), N=st.integers(1, 48), R2=st.sampled_from([0, 2, 8, 20]), steps=st.integers(1, 3),
       bm=st.sampled_from([16, 32]), bn=st.sampled_from([16, 32]), group_m=st.sampled_from([1, 2, 8]),
       seed=st.integers(0, 2**16))
def test_y_and_the_shrink_are_the_two_products(T, N, R2, steps, bm, bn, group_m, seed):
    H = 16 * steps
    x, w, a = products(T, N, R2, H, seed)
    with interpreter_on(), without_overflow_checks():
        y, sh = ups.up_shrink(x, w, a, bm=bm, bn=bn, bk=16, group_m=group_m, stages=2, warps=4)
    assert records.relative_error(y, x.double() @ w.double().T, "fro") < 1e-5
    if R2:
        assert records.relative_error(sh, x.double() @ a.double().T, "fro") < 1e-5
    else:
        assert sh is None


def test_every_output_element_is_written():
    """Outputs that start as NaN come back finite: no tile of ``y`` or ``sh`` is skipped (a grid short of the shrink's
    column tiles would leave ``sh`` as it was)."""
    x, w, a = products(33, 40, 36, 32, 7)
    y, sh = torch.full((33, 40), float("nan")), torch.full((33, 36), float("nan"))
    with interpreter_on(), without_overflow_checks():
        ups.up_shrink(x, w, a, y, sh, bm=16, bn=16, bk=16, group_m=2, stages=2, warps=4)
    assert torch.isfinite(y).all() and torch.isfinite(sh).all()
    assert records.relative_error(sh, x.double() @ a.double().T, "fro") < 1e-5


def test_a_hidden_size_off_the_step_is_refused():
    x, w, a = products(4, 8, 4, 24, 0)
    with pytest.raises(ValueError, match="H = 24 is not a multiple of the step bk = 16"):
        ups.up_shrink(x, w, a, bk=16)


def test_the_scripts_contenders_are_the_two_products(monkeypatch):
    """``h200_up_shrink.point`` on a tiny A in float32 (``interpreted.sweep_script``): cuBLAS's ways, the padded one and
    each Triton config (with and without the shrink's tiles) give the base product and the slot's shrink, and all of
    them are timed; a Triton launch whose shrink is wrong is not."""
    import sys
    from pathlib import Path

    from interpreted import recording_timer, sweep_script

    with sweep_script("h200_up_shrink", monkeypatch, folder=Path(__file__).resolve().parent) as (module, _):
        sys.modules.pop("h200_up_cat", None)
        monkeypatch.setattr(module, "up_shrink", ups)
        monkeypatch.setattr(module, "CONFIGS", {"small": dict(bm=16, bn=16, bk=16, stages=2, warps=4)})
        seen = []
        row = module.point("A", 16, 40, None, 1, device="cpu", timer=recording_timer(seen))
        want = {"up", "beside", "grouped_swapped", "up_cat", "up_cat_pad", "tri_small", "tri_small_up"}
        assert seen == [want] and set(row["rel_err"]) == want
        assert max(row["rel_err"].values()) < 1e-5, row["rel_err"]
        # the products themselves, against the sink's weights and its slot's factor read here, not by the script
        ops, x, p = module.h200_up_cat.slot_ordered("A", 16, 1, 40, "cpu")
        slot = int(p.slots[0])
        want_y = x.double() @ ops.w13_lin.double().T
        want_sh = x.double() @ ops.buffers[0][slot, 0].double().T
        for name, fn in module.contenders(ops, x, p).items():
            y, sh = fn()
            assert torch.allclose(y.double(), want_y, atol=1e-4, rtol=1e-4), name
            if sh is not None:
                assert torch.allclose(sh.double(), want_sh, atol=1e-4, rtol=1e-4), name

        right = ups.up_shrink

        def wrong(x, w, a, y=None, sh=None, **tiles):
            y, sh = right(x, w, a, y, sh, **tiles)
            if sh is not None:
                sh.mul_(2.0)
            return y, sh

        monkeypatch.setattr(module.up_shrink, "up_shrink", wrong)
        seen.clear()
        row = module.point("A", 16, 40, None, 1, device="cpu", timer=recording_timer(seen))
        assert seen == [want - {"tri_small"}] and row["rel_err"]["tri_small"] > 1e-2
