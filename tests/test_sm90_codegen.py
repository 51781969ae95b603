"""The activation's reads of cuBLAS's ``y`` for sm_90 as v43 measured them best (``kernels._y_tile``), the
one-token GEMV streams at Inkling's size as v47 measured them best (pipelined 16-byte ``cp.async`` copies), and the
split's reduction ordered as v48's wrong sums showed it must be (``_split_reduce``).

With the interleaved gate/up rows (sglang's layout, the side by side's) the pair load was masked per feature
(``f0 + jj // 2 < F``), which the compiler sees constant over two elements only: 4-byte ``cp.async`` copies in
``expand_act_kernel``, where the same tile without interleaving copied 16. Masked per column (``WIDE``) it copies
16 bytes at a time (the expand 0.70-0.92x its time on the H200); ``up_kernel``'s epilogue keeps the feature's
mask and its 4-byte loads (with 16-byte ones its activation ran 0.99-1.09x the time, median 1.03x). Compiled here for an sm_90 target in a
process of its own (``tests/sm90.py``: the library's kernels compiled, not interpreted)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def widths() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "sm90.py")], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("R", [16, 64])
def test_expand_act_copies_y_16_bytes_at_a_time(widths, R):
    got = widths[f"expand_act_R{R}"]
    assert 4 not in got["cp_async"] and 16 in got["cp_async"], got
    if R == 64:  # sh's rows are 128 bytes too: nothing narrower than 16 bytes is copied
        assert got["cp_async"] == [16], got
    assert got["st"] == ["st.global.v4.b32"], got


@pytest.mark.slow
def test_up_kernels_epilogue_keeps_the_loads_v43_measured_faster(widths):
    got = widths["up_epilogue"]
    assert "ld.global.b32" in got["ld"] and "ld.global.v4.b32" not in got["ld"], got


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["gemv_up", "gemv_down"])
def test_the_routed_one_token_streams_at_inklings_size_are_16_byte_async_copies(widths, kernel):
    """v47: at Inkling's ``H`` both GEMV kernels run Triton's pipelined loop (``gemv_for``), their weight steps copied
    into shared memory 16 bytes at a time (`cp.async`), several in flight; the register double buffer before it had
    no async copy at all. An address the compiler cannot prove 16-byte aligned would fall back to narrower copies."""
    got = widths[kernel]
    assert got["stages"] > 1 and 16 in got["cp_async"], got


@pytest.mark.slow
@pytest.mark.parametrize("tile", ["v48_8x8", "few_tokens"])
def test_a_split_reads_its_whole_sum_before_any_thread_zeroes_the_workspace(widths, tile):
    """``_split_reduce``: the last program of a split reads the finished sum, then zeroes the workspace for the next
    launch. v48's 8 x 8 tile on 4 warps held the read and the zeroing store in different layouts (different threads),
    and came out wrong on an H100 (``h100_few_tiles_v48.json``); a barrier between them orders every read before any
    zero, on that tile and on ``pick_tiles``' own few-token tile."""
    assert widths["split_reduce_barrier"][tile]
