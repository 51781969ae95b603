"""``scripts/gpu/h200_stream_ceiling.py``'s read kernel in Triton's CPU interpreter: the sum it
writes per program must add up to the buffer's float64 sum for any size, block and grid
(a read kernel that skipped or re-read elements would time the wrong bytes)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from interpreted import gpu_script


@pytest.fixture(scope="module")
def script():
    with gpu_script("h200_stream_ceiling") as module:
        yield module


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 5000), block=st.sampled_from([16, 64, 256]), programs=st.integers(1, 9),
       seed=st.integers(0, 2 ** 16))
def test_the_read_kernel_reads_every_element_once(script, n, block, programs, seed):
    src = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    partial, launch = script.stream_sum(src, block, programs)
    launch()
    assert partial.shape == (programs,)
    torch.testing.assert_close(partial.double().sum(), src.double().sum(), rtol=1e-5, atol=1e-4)


def test_the_sweep_covers_block_sizes_and_occupancies(script):
    blocks = {b for b, _ in script.SWEEP}
    per_sm = {p for _, p in script.SWEEP}
    assert len(blocks) >= 2 and len(per_sm) >= 3 and set(script.SHAPES) == {"A", "B", "inkling", "inkling-tp8"}
