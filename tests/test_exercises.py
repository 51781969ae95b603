"""The exercise checks: right answers pass, typical mistakes are named with a hint,
an unanswered ``...`` is neither right nor an error."""
import pytest
import torch

import inkling_lab as il
from inkling_lab import exercises as ex
from inkling_lab.adapters import normalize_shared_sink
from inkling_lab.profile import Case, case_bytes, roofline


def _right(verdict):
    assert verdict.right is True, str(verdict)
    assert verdict.assert_right() is verdict and str(verdict).startswith("✓")


def _wrong(verdict, *words):
    assert verdict.right is False, str(verdict)
    text = str(verdict)
    assert text.startswith("✗") and "hint:" in text and all(w in text for w in words), text
    with pytest.raises(AssertionError, match="not yet"):
        verdict.assert_right()


@pytest.fixture
def pool():
    pool = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=4, dtype=torch.float64)
    pool.load(0, il.LoRAFactors.random(2, 8, 6, rank=4, seed=1, dtype=torch.float64))
    return pool


def test_unanswered_is_neither_right_nor_an_error(pool):
    sink = il.SharedSink(3, 16, 5)
    for verdict in (ex.sink_shapes(..., ..., sink), ex.pool_shapes({"gate_up_a": ...}, pool),
                    ex.segments(..., [0], [0], 1), ex.collapses(..., il.LoRAFactors.random(2, 8, 6, 2, outer=2))):
        assert verdict.right is None and not verdict and "not answered yet" in str(verdict)
        with pytest.raises(AssertionError):
            verdict.assert_right()


def test_sink_shapes():
    sink = il.SharedSink(3, 16, 5)
    _right(ex.sink_shapes((3, 10, 16), (3, 16, 5), sink))
    _wrong(ex.sink_shapes((3, 5, 16), (3, 16, 5), sink), "one F")
    _wrong(ex.sink_shapes((3, 16, 10), (3, 5, 16), sink), "swapped")


def test_gate_up_split():
    sink = il.SharedSink(2, 8, 4, dtype=torch.float64)
    y = torch.randn(3, 8, dtype=torch.float64) @ sink.linearized()[0].T
    per_expert = y.view(3, 2, 8)
    _right(ex.gate_up_split(per_expert[..., 0::2], per_expert[..., 1::2], y, sink))
    _wrong(ex.gate_up_split(per_expert[..., :4], per_expert[..., 4:], y, sink), "other layout")
    _wrong(ex.gate_up_split(per_expert[..., 1::2], per_expert[..., 0::2], y, sink), "up, not gate")


def test_pool_shapes(pool):
    right = {k: tuple(v) for k, v in pool.geometry.buffer_shapes().items()}
    _right(ex.pool_shapes(right, pool))
    _wrong(ex.pool_shapes({**right, "down_a": (3, 2, 6, 4)}, pool), "down_a [3, 2, 6, 4]", "wrong order")
    _wrong(ex.pool_shapes({**right, "down_a": (3, 2, 5, 6)}, pool), "down_a [3, 2, 5, 6]: axis 2 is off")
    _wrong(ex.pool_shapes({**right, "gate_up_b": (3, 12, 4)}, pool), "3 axes; every buffer has 4")


def test_no_wrong_answer_is_told_the_right_one(pool):
    """A check says what is wrong and hints at how, but never prints the answer: not in
    its verdict for a wrong answer, not in its hint (shown before any attempt)."""
    right = {k: tuple(v) for k, v in pool.geometry.buffer_shapes().items()}
    for wrong in ({**right, "down_a": (3, 2, 6, 4)}, {**right, "gate_up_a": (3, 1, 4, 8)},
                  {k: (1, 1, 1, 1) for k in right}):
        text = str(ex.pool_shapes(wrong, pool))
        leaked = [k for k, shape in right.items() if wrong[k] != shape and str(list(shape)) in text]
        assert not leaked, f"the verdict gives away {leaked}: {text}"
    flat = pool.gate_up_b.reshape(3, 1, 24, 4)
    assert str(list(pool.gate_up_b.shape)) not in str(ex.fixed_gate_up_b(..., pool))
    x = torch.randn(8, dtype=torch.float64)
    assert "@" not in ex.gate_delta(..., pool, x, slot=0, expert=1).hint  # no formula to copy
    assert str(list(pool.gate_up_b.shape)) not in str(ex.fixed_gate_up_b(flat, pool))
    g = torch.randn(12, 4)
    assert "torch." not in ex.stacked_gate_up_b(..., g, g, n=2).hint
    assert "[4, 2, 6]" not in ex.normalized_down_a(..., torch.randn(4, 12), n=2).hint


def test_gate_delta(pool):
    x = torch.randn(8, dtype=torch.float64)
    a, b = pool.gate_up_a[0, 0], pool.gate_up_b[0, 1]
    _right(ex.gate_delta(b[:6] @ (a[:4] @ x), pool, x, slot=0, expert=1))
    _wrong(ex.gate_delta(b[6:] @ (a[4:] @ x), pool, x, slot=0, expert=1), "the up delta")
    _wrong(ex.gate_delta(torch.zeros(3), pool, x, slot=0, expert=1), "shape")


def test_fixed_gate_up_b(pool):
    flat = pool.gate_up_b.reshape(3, 1, 24, 4)
    _right(ex.fixed_gate_up_b(flat.reshape(3, 2, 12, 4), pool))
    _wrong(ex.fixed_gate_up_b(flat, pool), "ISL-E004")
    _wrong(ex.fixed_gate_up_b(flat.reshape(3, 12, 2, 4).transpose(1, 2), pool), "values moved")


def test_first_error():
    shapes = [(3, 2, 8, 16), (3, 2, 12, 4), (3, 2, 4, 6), (3, 1, 16, 4)]
    _right(ex.first_error("ISL-E003", shapes, n=2))
    _wrong(ex.first_error("ISL-E002", shapes, n=2), "not the first")
    _right(ex.first_error(None, [(3, 1, 8, 16), (3, 2, 12, 4), (3, 2, 4, 6), (3, 1, 16, 4)], n=2))


def test_normalized_down_a_and_stacked_gate_up_b():
    flat = torch.arange(24.0).reshape(2, 12)
    _right(ex.normalized_down_a(flat.reshape(2, 2, 6).transpose(0, 1), flat, n=2))
    _wrong(ex.normalized_down_a(flat.reshape(2, 2, 6), flat, n=2), "mixes rank and feature")
    gate, up = torch.randn(12, 4), torch.randn(12, 4)
    _right(ex.stacked_gate_up_b(torch.cat([gate.reshape(2, 6, 4), up.reshape(2, 6, 4)], dim=1), gate, up, n=2))
    _wrong(ex.stacked_gate_up_b(torch.cat([gate, up]).reshape(2, 12, 4), gate, up, n=2), "experts mixed")
    key = "m.mlp.shared_experts.down_proj.lora_A.weight"
    assert torch.equal(normalize_shared_sink({key: flat}, 2)[key], flat.reshape(2, 2, 6).transpose(0, 1))


def test_segments_and_shrink():
    _right(ex.segments([0, 2, 3, 5, 6], [1, -1, 0, 2], [1, 1, -1, 0, 0, 2], 3))
    _wrong(ex.segments([1, 2, 3, 5, 6], [1, -1, 0, 2], [1, 1, -1, 0, 0, 2], 3), "starts at 0")
    sink = il.SharedSinkLoRA(2, 8, 6, dtype=torch.float64)
    p = il.LoRAPool(2, 8, 6, 2, 4, dtype=torch.float64)
    p.load(1, il.LoRAFactors.random(2, 8, 6, 4, seed=0, dtype=torch.float64))
    sink.set_lora_info(*p.buffers())
    x = torch.randn(3, 8, dtype=torch.float64)
    _right(ex.shrink(p.gate_up_a[1, 0] @ x[2], sink, x, [0, -1, 1], token=2))
    _wrong(ex.shrink(p.gate_up_a[0, 0] @ x[2], sink, x, [0, -1, 1], token=2), "values are not")
    with pytest.raises(ValueError, match="uses no adapter"):
        ex.shrink(..., sink, x, [0, -1, 1], token=1)


def test_forward_bytes_and_roofline_time():
    case = Case.of("B", R=16, S=1, T=8)
    _right(ex.forward_bytes(case_bytes(case), case))
    _wrong(ex.forward_bytes(case_bytes(case) / 2, case), "0.50x")
    assert "bytes" in ex.forward_bytes(..., case).hint  # the unit is named before any attempt
    _wrong(ex.forward_bytes(case_bytes(case) / 1e6, case), "that is the answer in MB; the check takes bytes")
    ceilings = {"copy_TBps": 4.0, "matmul_TFLOPs": 700.0}
    roof = roofline(case, **ceilings)
    _right(ex.roofline_time(roof.us, roof.bound, case, ceilings))
    _wrong(ex.roofline_time(roof.us, "compute" if roof.bound == "memory" else "memory", case, ceilings), "bound")
    _wrong(ex.roofline_time(roof.us / 1e6, roof.bound, case, ceilings), "that is the answer in s; the check takes µs")


def test_tensor_parallel_checks():
    sink = il.SharedSinkLoRA(2, 8, 6)
    _right(ex.rank_gate_up_rows([4, 5, 10, 11], sink, tp_rank=2, tp_size=3))
    _wrong(ex.rank_gate_up_rows([4, 5], sink, tp_rank=2, tp_size=3), "gate half only")
    down_a = torch.randn(2, 4, 6)
    _right(ex.rank_down_a(down_a[..., :3], sink, down_a, tp_rank=0, tp_size=2))
    _wrong(ex.rank_down_a(down_a[..., 3:], sink, down_a, tp_rank=0, tp_size=2), "values are not")


def test_defect_checks():
    _right(ex.upstream_column((5, 3), intermediate=4, b_row=5))
    _wrong(ex.upstream_column((5, 5), intermediate=4, b_row=5), "intended column is not 5")
    shared = il.LoRAFactors.random(2, 8, 6, rank=2, seed=0)
    same = il.LoRAFactors(shared.gate_up_a.expand(2, -1, -1), shared.gate_up_b, shared.down_a,
                          shared.down_b.expand(2, -1, -1), shared.lora_alpha)
    _right(ex.collapses(True, same))
    _wrong(ex.collapses(False, same), "collapse_identical_outer")


def test_export_checks():
    per = il.LoRAFactors.random(2, 8, 6, rank=2, outer=2, seed=1)
    r, F = 2, 6
    shared_a = torch.cat([per.gate_up_a[0, :r], per.gate_up_a[1, :r]])
    inner_b = torch.zeros(2, F, 2 * r)
    inner_b[0, :, :r], inner_b[1, :, r:] = per.gate_up_b[0, :F], per.gate_up_b[1, :F]
    _right(ex.stacked_outer(shared_a, inner_b, per))
    swapped = inner_b.flip(0)  # each expert's B in the other's columns
    _wrong(ex.stacked_outer(shared_a, swapped, per), "expert 0")
    _wrong(ex.stacked_outer(shared_a, inner_b[:, :, :r], per), "axis 2")
    from inkling_lab.adapters import synthetic_adapter

    ad = synthetic_adapter(2, 8, 6, 4, lora_alpha=8.0)
    ad.config["use_rslora"] = True
    _right(ex.folded_scaling(4.0, ad))
    _wrong(ex.folded_scaling(2.0, ad), "ignores use_rslora")
