"""``scripts/gpu/h200_warp_spec.py``'s swap-AB GEMMs in Triton's CPU interpreter (float32):
both mappings (``up`` over ``w13_lin``, ``down`` over ``w2 [n, H, F]`` read in place), split K
and not, warp specialization asked for or not (the interpreter runs the same program), token
counts below, at and past the 16-wide tile, against the float64 product. A stream that read
a wrong expert's rows, dropped a split or a padded token would time the wrong GEMM."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from interpreted import gpu_script


@pytest.fixture(scope="module")
def script():
    with gpu_script("h200_warp_spec") as module:
        yield module


@settings(max_examples=12, deadline=None)
@given(kind=st.sampled_from(["up", "down"]), n=st.integers(1, 3), H=st.sampled_from([64, 128, 192]),
       F=st.sampled_from([64, 128]), T=st.integers(1, 33), splits=st.sampled_from([1, 2]), ws=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_the_swap_ab_gemm_is_the_float64_product(script, kind, n, H, F, T, splits, ws, seed):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n * 2 * F, H, generator=gen) if kind == "up" else torch.randn(n, H, F, generator=gen)
    x = torch.randn(T, H if kind == "up" else n * F, generator=gen)
    K = x.shape[1]
    if K % (splits * 64):
        splits = 1
    out, launch = script.swap_gemm(w, x, kind, n, script.Variant(bk=64, stages=2, ws=ws, splits=splits))
    launch()
    w64, x64 = w.double(), x.double()  # the product written out here, not the script's own reference
    want = x64 @ (w64.T if kind == "up" else torch.cat(list(w64.permute(0, 2, 1)), dim=0))
    assert out.shape == want.shape
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-4)


def test_a_split_that_does_not_divide_k_is_refused(script):
    with pytest.raises(ValueError, match="does not split"):
        script.swap_gemm(torch.zeros(2, 64, 96), torch.zeros(4, 192), "down", 2, script.Variant(bk=64, splits=1))


def test_the_sweep_splits_only_where_tiles_are_fewer_than_the_multiprocessors(script):
    small = script.variants(rows=3072, K=1536, kw=1536, sms=132)  # shape A's up: 48 tiles
    big = script.variants(rows=12288, K=6144, kw=6144, sms=132)   # Inkling's up: 192 tiles
    assert {v.splits for v in small} == {1, 3} and {v.splits for v in big} == {1}
    assert {v.ws for v in small} == {False, True} and {(v.bk, v.stages) for v in big} == {(128, 4), (128, 6), (256, 3)}
    tp8_down = script.variants(rows=6144, K=768, kw=384, sms=132)  # F 384: no 256-wide step fits an expert
    assert {v.bk for v in tp8_down} == {128}
