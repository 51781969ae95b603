import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inkling_lab.sink import SharedSink, gate_up_rows, linearize, swiglu_sink


def _inputs(sink, T, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, sink.hidden_size, generator=g).to(dtype)
    gammas = torch.rand(T, sink.n_shared_experts, generator=g).to(dtype)
    return x, gammas


def _by_hand(sink, x, gammas):
    """Every expert, every token, the SPEC §1 formula written out."""
    F = sink.intermediate_size
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for e in range(sink.n_shared_experts):
            y = sink.w13[e].double() @ x[t].double()
            if sink.interleaved:
                gate, up = y[0::2], y[1::2]
            else:
                gate, up = y[:F], y[F:]
            act = torch.nn.functional.silu(gate) * up * gammas[t, e].double()
            out[t] += sink.w2[e].double() @ act
    return out


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 4), H=st.integers(1, 12), F=st.integers(1, 9), T=st.integers(0, 7),
       interleaved=st.booleans(), seed=st.integers(0, 2**16))
def test_both_forms_equal_the_formula(n, H, F, T, interleaved, seed):
    sink = SharedSink(n, H, F, interleaved=interleaved, dtype=torch.float64, seed=seed)
    x, gammas = _inputs(sink, T, seed)
    want = _by_hand(sink, x, gammas)
    for form in ("linearized", "per_expert"):
        got = sink.base_forward(x, gammas, form=form)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_layouts_are_a_row_permutation_of_each_other():
    inter = SharedSink(2, 8, 5, interleaved=True, dtype=torch.float64, seed=3)
    contig = SharedSink(2, 8, 5, interleaved=False, dtype=torch.float64)
    gate, up = gate_up_rows(5, interleaved=True)
    with torch.no_grad():
        contig.w13.copy_(torch.cat([inter.w13[:, gate], inter.w13[:, up]], dim=1))
        contig.w2.copy_(inter.w2)
    x, gammas = _inputs(inter, 6)
    torch.testing.assert_close(contig(x, gammas), inter(x, gammas), rtol=1e-12, atol=1e-12)


def test_batched_input_keeps_its_shape_and_matches_flat():
    sink = SharedSink(3, 6, 4, dtype=torch.float64)
    x, gammas = _inputs(sink, 10)
    out = sink(x.view(2, 5, 6), gammas.view(2, 5, 3))
    assert out.shape == (2, 5, 6)
    torch.testing.assert_close(out.view(10, 6), sink(x, gammas))


def test_gammas_weight_each_expert_linearly():
    sink = SharedSink(2, 6, 4, dtype=torch.float64)
    x, _ = _inputs(sink, 4)
    only0 = sink(x, torch.tensor([[1.0, 0.0]] * 4, dtype=torch.float64))
    only1 = sink(x, torch.tensor([[0.0, 1.0]] * 4, dtype=torch.float64))
    both = sink(x, torch.tensor([[2.0, 3.0]] * 4, dtype=torch.float64))
    torch.testing.assert_close(both, 2 * only0 + 3 * only1)


def test_activation_is_float32_and_cast_once():
    y = torch.randn(3, 2, 8).to(torch.bfloat16)
    act = swiglu_sink(y, torch.ones(3, 2, dtype=torch.bfloat16), interleaved=True)
    assert act.dtype == torch.bfloat16
    y32 = y.float()
    want = (torch.nn.functional.silu(y32[..., 0::2]) * y32[..., 1::2]).to(torch.bfloat16)
    assert torch.equal(act, want)


def test_linearized_weights_are_expert_major():
    w13, w2 = torch.randn(3, 4, 5), torch.randn(3, 5, 2)
    w13_lin, w2_lin = linearize(w13, w2)
    assert w13_lin.shape == (12, 5) and w2_lin.shape == (6, 5)
    assert torch.equal(w13_lin[4 + 1], w13[1, 1])
    assert torch.equal(w2_lin[1 * 2 + 1], w2[1, :, 1])


def test_spare_rows_after_the_linearized_down_weight_share_its_storage_and_outlive_a_weight_change():
    sink = SharedSink(2, 6, 4)
    w13_lin, w2_lin = sink.linearized()
    cat = sink._down_cat(3)                               # what a rank-3 pool's forward writes into
    assert cat.shape == (8 + 3, 6)
    w2_lin = sink.linearized()[1]
    assert cat.data_ptr() == w2_lin.data_ptr() and torch.equal(cat[:8], w2_lin)
    assert torch.equal(w2_lin, linearize(sink.w13.detach(), sink.w2.detach())[1])
    cat[8:] = 7.0                                          # the forward's rows: w2_lin's values stay
    assert torch.equal(sink.linearized()[1], linearize(sink.w13.detach(), sink.w2.detach())[1])
    assert sink.linearized(2)[1] is w2_lin                 # fewer rows than it has: no new copy
    with torch.no_grad():
        sink.w2.mul_(2)                                     # an in-place write: linearized again, rows kept
    again = sink.linearized()[1]
    assert again is not w2_lin and torch.equal(again, linearize(sink.w13.detach(), sink.w2.detach())[1])
    assert sink._down_cat(3).data_ptr() == again.data_ptr()
    with pytest.raises(RuntimeError):                      # never past the storage it has
        again.as_strided((8 + 9, 6), again.stride(), again.storage_offset())


def test_linearized_follows_a_parametrized_weight():
    from torch.nn.utils import parametrize

    class Doubled(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    sink = SharedSink(2, 6, 4)
    w13 = sink.w13.detach().clone()
    sink.linearized()
    parametrize.register_parametrization(sink, "w13", Doubled())  # w13 is a property from now on
    assert torch.equal(sink.linearized()[0], 2 * w13.reshape(16, 6))
    with torch.no_grad():
        sink.parametrizations.w13.original.mul_(3)
    assert torch.equal(sink.linearized()[0], 6 * w13.reshape(16, 6))


def test_bad_inputs_name_the_tensor():
    sink = SharedSink(2, 6, 4)
    with pytest.raises(ValueError, match="x must end in a dimension of size 6"):
        sink(torch.randn(3, 5), torch.rand(3, 2))
    with pytest.raises(ValueError, match="gammas has 2 tokens but x has 3"):
        sink(torch.randn(3, 6), torch.rand(2, 2))
    with pytest.raises(ValueError, match="form must be"):
        sink.base_forward(torch.randn(3, 6), torch.rand(3, 2), form="fused")


def test_a_sink_from_a_geometry_has_its_sizes():
    from inkling_lab.geometry import PRESETS
    from inkling_lab.lora import SharedSinkLoRA

    sink = SharedSinkLoRA.from_geometry(PRESETS["toy"].with_(intermediate=4), interleaved=False, seed=2)
    assert isinstance(sink, SharedSinkLoRA) and not sink.interleaved
    assert (sink.n_shared_experts, sink.hidden_size, sink.intermediate_size) == (2, 8, 4)
    assert torch.equal(sink.w13, SharedSinkLoRA(2, 8, 4, interleaved=False, seed=2).w13)
