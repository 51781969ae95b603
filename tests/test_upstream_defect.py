"""sglang 0.5.23's per-expert outer computation (SPEC §8), its report, warning and the
collapse to shared outer."""
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import inkling_lab as il
from inkling_lab.errors import UpstreamDefectWarning, expect_error
from inkling_lab.scenario import Scenario
from inkling_lab.sink import gate_up_rows
from inkling_lab.upstream_defect import (GATE_SHRINK, UP_SHRINK, collapse_identical_outer, defect_report,
                                         doctor_finding, gate_up_routing, sglang_0_5_23_equivalent_buffers,
                                         sglang_0_5_23_per_expert_forward)


def spec_8_literally(sink, x, gammas, token_slots):
    """SPEC §8's formula read literally, one token and one expert at a time, float64."""
    f64 = torch.float64
    n, F = sink.n_shared_experts, sink.intermediate_size
    w13, w2 = sink.w13.detach().to(f64), sink.w2.detach().to(f64)
    ga, gb, da, db = (b.to(f64) for b in sink.lora_buffers)
    R = gb.shape[-1]
    gate_rows, up_rows = gate_up_rows(F, sink.interleaved)
    x, gammas = x.to(f64), gammas.to(f64)
    out = torch.zeros(x.shape, dtype=f64)
    for t, s in enumerate(token_slots):
        for e in range(n):
            y = w13[e] @ x[t]                                 # raw columns of y, the sink's layout
            if s >= 0:
                g = ga[s, e, 0:R] @ x[t]                      # the gate shrink only
                y[0:F] += gb[s, e, 0:F] @ g
                y[F:2 * F] += gb[s, e, F:2 * F] @ g
            act = torch.nn.functional.silu(y[gate_rows]) * y[up_rows] * gammas[t, e]
            out[t] += w2[e] @ act
            if s >= 0:                                        # the down delta, which upstream gets right
                out[t] += db[s, e] @ (da[s, e] @ act)
    return out


def per_expert_setup(n=2, H=8, F=6, R=4, slots=2, interleaved=True, seed=0, ranks=None, tokens=None):
    """A per-expert outer ``Scenario`` (the one factory), unpacked: slot ``s`` at rank
    ``ranks[s]`` (default ``R``), each slot's tokens in a run of 3 and one base-only token
    unless ``tokens`` are given."""
    tokens = tokens if tokens is not None else [s for s in range(slots) for _ in range(3)] + [-1]
    sc = Scenario.random(il.Geometry(n, H, F, R, slots, outer=n), tokens=len(tokens), seed=seed,
                         interleaved=interleaved, adapters=ranks, token_slots=tokens)
    return sc.sink, sc.pool, sc.x, sc.gammas, sc.batch, tokens


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 3), F=st.integers(1, 5), R=st.integers(1, 3), slots=st.integers(1, 3),
       interleaved=st.booleans(), seed=st.integers(0, 2**16), data=st.data())
def test_the_forward_is_spec_8_to_rounding(n, F, R, slots, interleaved, seed, data):
    ranks = data.draw(st.lists(st.integers(0, R), min_size=slots, max_size=slots))
    tokens = data.draw(st.lists(st.integers(-1, slots - 1), min_size=1, max_size=6))
    sink, _, x, gammas, batch, tokens = per_expert_setup(n, 5, F, R, slots, interleaved, seed, ranks, tokens)
    got = sglang_0_5_23_per_expert_forward(sink, x, gammas, batch)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, spec_8_literally(sink, x, gammas, tokens), rtol=1e-10, atol=1e-12)


def test_it_differs_from_the_intended_math_and_the_torch_backend_agrees():
    sink, _, x, gammas, batch, _ = per_expert_setup()
    upstream = sglang_0_5_23_per_expert_forward(sink, x, gammas, batch)
    intended = sink(x, gammas, batch=batch, backend="reference")
    assert (upstream - intended).norm() / intended.norm() > 0.1
    fast = sglang_0_5_23_per_expert_forward(sink, x, gammas, batch, backend="torch")
    torch.testing.assert_close(fast.double(), upstream, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(upstream[-1], intended[-1])  # a base-only token is right


def test_fault_1_the_up_half_of_gate_up_a_is_never_read():
    sink, pool, x, gammas, batch, _ = per_expert_setup()
    before = sglang_0_5_23_per_expert_forward(sink, x, gammas, batch)
    intended_before = sink(x, gammas, batch=batch, backend="reference")
    R = pool.max_rank
    pool.gate_up_a[:, :, R:] = torch.randn_like(pool.gate_up_a[:, :, R:])
    torch.testing.assert_close(sglang_0_5_23_per_expert_forward(sink, x, gammas, batch), before)
    assert not torch.allclose(sink(x, gammas, batch=batch, backend="reference"), intended_before)


def test_the_down_delta_is_right():
    sink, pool, x, gammas, batch, _ = per_expert_setup()
    pool.gate_up_b.zero_()
    torch.testing.assert_close(sglang_0_5_23_per_expert_forward(sink, x, gammas, batch),
                               sink(x, gammas, batch=batch, backend="reference"))


def test_on_a_contiguous_base_only_fault_1_remains():
    for interleaved in (False, True):
        sink, pool, x, gammas, batch, _ = per_expert_setup(interleaved=interleaved)
        R = pool.max_rank
        pool.gate_up_a[:, :, R:] = pool.gate_up_a[:, :, :R]  # up A = gate A: fault 1 cannot show
        same = torch.allclose(sglang_0_5_23_per_expert_forward(sink, x, gammas, batch),
                              sink(x, gammas, batch=batch, backend="reference"))
        assert same == (not interleaved)


def test_equivalent_buffers_leave_inputs_alone_and_reorder_b_for_the_interleaved_base():
    ga, gb = torch.randn(2, 2, 4, 8), torch.arange(2 * 2 * 6 * 2.0).reshape(2, 2, 6, 2)
    ga0, gb0 = ga.clone(), gb.clone()
    eq_a, eq_b = sglang_0_5_23_equivalent_buffers(ga, gb, interleaved=True)
    assert torch.equal(ga, ga0) and torch.equal(gb, gb0)
    assert torch.equal(eq_a[..., 2:, :], ga[..., :2, :]) and torch.equal(eq_a[..., :2, :], ga[..., :2, :])
    # F=3: intended places B rows [g0 g1 g2 u0 u1 u2] on y columns [0 2 4 1 3 5]
    assert torch.equal(eq_b, gb[..., [0, 2, 4, 1, 3, 5], :])
    assert torch.equal(sglang_0_5_23_equivalent_buffers(ga, gb, interleaved=False)[1], gb)


def test_routing_maps():
    up = gate_up_routing(2, interleaved=True, computed_by="sglang_0_5_23")
    assert torch.equal(up, torch.eye(4, dtype=torch.long))
    intended = gate_up_routing(2, interleaved=True, computed_by="intended")
    G, U = GATE_SHRINK, UP_SHRINK
    # y columns g0 u0 g1 u1 (rows) from B rows gB0 gB1 uB0 uB1 (columns)
    assert intended.tolist() == [[G, 0, 0, 0], [0, 0, U, 0], [0, G, 0, 0], [0, 0, 0, U]]
    contiguous = gate_up_routing(2, interleaved=False, computed_by="intended")
    assert contiguous.tolist() == [[G, 0, 0, 0], [0, G, 0, 0], [0, 0, U, 0], [0, 0, 0, U]]
    with pytest.raises(ValueError, match="computed_by must be"):
        gate_up_routing(2, True, "sglang")


def test_the_sink_and_its_pool_are_left_as_they_were():
    sink, pool, x, gammas, batch, _ = per_expert_setup()
    buffers, layout = sink.lora_buffers, sink.layout
    copies = [b.clone() for b in buffers]
    sglang_0_5_23_per_expert_forward(sink, x, gammas, batch)
    assert sink.lora_buffers is buffers and sink.layout is layout
    assert all(torch.equal(a, b) for a, b in zip(buffers, copies))


def test_refuses_a_sink_without_a_pool_or_with_a_shared_outer_pool():
    sink = il.SharedSinkLoRA(2, 8, 6)
    x, gammas = torch.randn(2, 8), torch.rand(2, 2)
    with pytest.raises(ValueError, match="call sink.set_lora_info"):
        sglang_0_5_23_per_expert_forward(sink, x, gammas, None)
    sink.set_lora_info(*il.LoRAPool(2, 8, 6, slots=1, max_rank=2).buffers())
    with pytest.raises(ValueError, match="shared outer layout .* computes as intended"):
        sglang_0_5_23_per_expert_forward(sink, x, gammas, None)


# -- the report --------------------------------------------------------------------------

def test_report_for_a_per_expert_adapter():
    factors = il.LoRAFactors.random(n=2, hidden=8, intermediate=6, rank=4, outer=2, seed=3, name="tuned")
    report = defect_report(factors, seed=1)
    assert report.affected and report.outer == 2 and report.tokens == 8
    diff = report.upstream - report.intended
    assert report.relative_error == pytest.approx(float(diff.norm() / report.intended.norm()))
    assert report.relative_error > 0.1 and report.delta_error > 0.1
    assert list(report.slot_errors) == [0] and report.slot_errors[0] == pytest.approx(report.relative_error)
    text = str(report)
    assert "ISL-W001" in text and "'tuned'" in text and f"{report.relative_error:.2g}" in text
    assert "never read" in text and "no shared outer form is exact" in text and not report.collapsible
    assert defect_report(factors, seed=1).relative_error == report.relative_error  # seeded
    contiguous = defect_report(factors, interleaved=False)
    assert "does not arise on a contiguous base" in str(contiguous) and contiguous.relative_error > 0


def test_report_for_a_pool_and_its_buffers():
    sink, pool, *_ = per_expert_setup(slots=3, ranks=[4, 0, 2])
    report = defect_report(pool, tokens_per_slot=4)
    assert sorted(report.slot_errors) == [0, 2] and report.tokens == 8 and "slot 2:" in str(report)
    from_buffers = defect_report(pool.buffers(), tokens_per_slot=4)  # an all-zero slot is empty
    assert from_buffers.slot_errors == pytest.approx(report.slot_errors)
    empty = defect_report(il.LoRAPool(2, 8, 6, slots=2, max_rank=2, outer=2))
    assert empty.affected and empty.relative_error == 0 and "holds no adapter" in str(empty)
    with pytest.raises(ValueError, match="four 4D pool buffers"):
        defect_report(pool.buffers()[:3])


def test_a_shared_outer_source_is_not_affected_and_does_not_warn():
    report = defect_report(il.LoRAFactors.random(n=2, hidden=8, intermediate=6, rank=2, seed=0))
    assert not report.affected and report.relative_error == 0 and report.intended is None
    assert "Nothing to do" in str(report)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report.warn()


def test_the_warning_is_catalogued_and_expect_error_checks_it():
    report = defect_report(il.LoRAFactors.random(n=3, hidden=8, intermediate=4, rank=2, outer=3, seed=0))
    with pytest.warns(UpstreamDefectWarning, match=r"per-expert outer LoRA layout \(O = 3\)") as caught:
        report.warn()
    assert il.explain(str(caught[0].message)).code == "ISL-W001"
    with expect_error("ISL-W001", show=False) as demo:
        report.warn()
    assert isinstance(demo.exception, UpstreamDefectWarning)
    with pytest.raises(AssertionError, match="nothing was raised"):
        with expect_error("ISL-W001", show=False):
            defect_report(il.LoRAFactors.random(n=2, hidden=8, intermediate=6, rank=2)).warn()
    with pytest.warns(UpstreamDefectWarning):  # the block's filter does not outlive it
        report.warn()


# -- the collapse ------------------------------------------------------------------------

def as_per_expert(shared: il.LoRAFactors, n: int) -> il.LoRAFactors:
    return il.LoRAFactors(shared.gate_up_a.expand(n, -1, -1), shared.gate_up_b, shared.down_a,
                          shared.down_b.expand(n, -1, -1), shared.lora_alpha)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(2, 4), rank=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_identical_outer_factors_collapse_back_exactly(n, rank, seed):
    shared = il.LoRAFactors.random(n=n, hidden=5, intermediate=3, rank=rank, seed=seed)
    ga, db, collapsed = collapse_identical_outer(*(as_per_expert(shared, n).gate_up_a,
                                                   as_per_expert(shared, n).down_b))
    assert collapsed and torch.equal(ga, shared.gate_up_a) and torch.equal(db, shared.down_b)


def test_the_collapse_computes_the_same_function_and_avoids_the_defect():
    per_expert = as_per_expert(il.LoRAFactors.random(n=2, hidden=8, intermediate=6, rank=3, seed=5), 2)
    ga, db, collapsed = collapse_identical_outer(per_expert.gate_up_a, per_expert.down_b)
    assert collapsed and ga.shape == (1, 6, 8) and db.shape == (1, 8, 3)
    shared = il.LoRAFactors(ga, per_expert.gate_up_b, per_expert.down_a, db, per_expert.lora_alpha)
    outputs = [Scenario.random(il.Geometry(2, 8, 6, 3, 1, outer=factors.outer), tokens=4, adapters=[factors],
                               token_slots=[0] * 4).forward("reference") for factors in (per_expert, shared)]
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-12, atol=1e-12)
    report = defect_report(per_expert)
    assert report.relative_error > 0.1 and report.collapsible and "inkling-lab convert" in str(report)
    assert not defect_report(shared).affected
    ga[0, 0, 0] = 123.0  # a copy: the adapter's own factors are untouched
    assert per_expert.gate_up_a[0, 0, 0] != 123.0


def test_the_collapse_refuses_what_differs_and_keeps_what_is_shared():
    ga, db = torch.randn(2, 4, 8), torch.randn(2, 8, 2)
    a, b, collapsed = collapse_identical_outer(ga, db)
    assert a is ga and b is db and not collapsed
    same_a = ga[:1].expand(2, -1, -1).clone()
    same_b = db[:1].expand(2, -1, -1).clone()
    assert not collapse_identical_outer(same_a, db)[2]       # both factors must agree
    nudged = same_b.clone()
    nudged[1] += 1e-7
    assert not collapse_identical_outer(same_a, nudged)[2]
    assert collapse_identical_outer(same_a, nudged, atol=1e-6)[2]
    one_a, one_b = ga[:1], db[:1]
    a, b, collapsed = collapse_identical_outer(one_a, one_b)
    assert a is one_a and b is one_b and not collapsed
    pool_a, pool_b = same_a.expand(3, -1, -1, -1), same_b.expand(3, -1, -1, -1)  # [S, O, ...] buffers
    a, b, collapsed = collapse_identical_outer(pool_a, pool_b)
    assert collapsed and a.shape == (3, 1, 4, 8) and b.shape == (3, 1, 8, 2)
    with pytest.raises(ValueError, match="2 outer experts but down B has 1"):
        collapse_identical_outer(ga, db[:1])
    with pytest.raises(ValueError, match=r"needs gate-up A \[..., O, 2R, H\]"):
        collapse_identical_outer(ga[0], db[0])


def test_the_doctors_finding():
    per_expert = il.LoRAFactors.random(n=2, hidden=8, intermediate=6, rank=2, outer=2, seed=4)
    finding = doctor_finding(per_expert, what="adapter 'x'")
    assert finding.code == "ISL-W001" and not finding.upstream
    assert il.explain(finding.message).code == "ISL-W001"
    error = defect_report(per_expert, what="adapter 'x'").relative_error
    assert f"relative error {error:.2g}" in finding.message and "adapter 'x'" in finding.message
    assert "no shared outer form is exact" in finding.fix and "never read" in finding.consequence
    shared = il.LoRAFactors.random(n=2, hidden=8, intermediate=6, rank=2, seed=4)
    assert doctor_finding(shared) is None
    assert "inkling-lab convert" in doctor_finding(as_per_expert(shared, 2)).fix


# -- the doctor and the converter -------------------------------------------------------

def identical_outer_adapter():
    """A per-expert export whose outer factors are the same for both experts."""
    from inkling_lab.adapters import Adapter, FactorName, synthetic_adapter

    ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4, per_expert=True, seed=2)
    weights = dict(ad.weights)
    for key in ad.weights:
        fn = FactorName.parse(key)
        if fn.expert == 1 and fn.is_outer:
            weights[key] = weights[fn.with_(expert=0).key].clone()
    return Adapter.from_state(ad.config, weights, name="same_outer")


def test_the_converter_collapses_identical_outer_factors_and_says_so():
    from inkling_lab.convert import convert
    from inkling_lab.doctor import serving_findings

    ad = identical_outer_adapter()
    pool = convert([ad], 2)
    assert pool.geometry.outer == 1 and not [f for f in serving_findings([ad], pool) if f.code == "ISL-W001"]
    notes = [f for f in pool.findings if f.code == "ISL-N001"]  # a note: nothing to fix
    assert len(notes) == 1 and "collapsed to the shared outer layout (exact)" in notes[0].message
    kept = convert([ad], 2, outer=2)  # asked for per expert: left alone; the converter converts, the doctor warns
    assert not [f for f in kept.findings if f.code == "ISL-W001"]
    (warned,) = [f for f in serving_findings([ad], kept) if f.code == "ISL-W001"]
    assert kept.geometry.outer == 2 and "adapter 'same_outer'" in warned.message and "collapses" in warned.fix
    outputs = []
    for converted in (pool, kept):  # the same function, in the intended math
        sink = il.SharedSinkLoRA(2, 8, 6)
        sink.set_lora_info(*converted.buffers())
        batch = il.SlotBatch.from_token_slots([0] * 3, num_slots=1)
        x, gammas = torch.randn(3, 8, generator=torch.Generator().manual_seed(0)), torch.ones(3, 2)
        outputs.append(sink(x, gammas, batch=batch, backend="reference"))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-12, atol=1e-12)
    from inkling_lab.adapters import synthetic_adapter
    differ = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4, per_expert=True, seed=3)
    mixed = convert([ad, differ], 2)  # one adapter's experts differ: the pool stays per expert, nothing collapses
    warned = [f for f in serving_findings([ad, differ], mixed) if f.code == "ISL-W001"]
    assert mixed.geometry.outer == 2 and len(warned) == 2  # each adapter is served per expert, each is warned of
    assert not [f for f in warned if "collapsed to the shared outer layout" in f.message]


def test_the_doctor_warns_on_a_per_expert_adapter(tmp_path, capsys):
    from inkling_lab.adapters import save_adapter, synthetic_adapter
    from inkling_lab.cli import main
    from inkling_lab.doctor import doctor

    per_expert = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4, per_expert=True, seed=1, name="pe")
    report = doctor(per_expert, 2, 8, 6)
    warning = [f for f in report.findings if f.code == "ISL-W001"]
    assert not report.fails and len(warning) == 1
    assert "relative error" in warning[0].message and "no shared outer form is exact" in warning[0].fix
    assert "computes something other than the adapter's math" in str(report) and report.exit_status == 1
    same = [f for f in doctor(identical_outer_adapter(), 2, 8, 6).findings if f.code == "ISL-W001"]
    assert len(same) == 1 and "inkling-lab convert" in same[0].fix
    shared = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4, seed=1)
    assert not [f for f in doctor(shared, 2, 8, 6).findings if f.code == "ISL-W001"]

    folder = save_adapter(identical_outer_adapter(), tmp_path / "same_outer")
    # served per expert, sglang computes it wrongly (exit 1); converted, it is collapsed to shared outer
    assert main(["doctor", str(folder), "-n", "2", "--hidden", "8", "--intermediate", "6"]) == 1
    assert "[ISL-W001]" in capsys.readouterr().out
    out = tmp_path / "pool.safetensors"
    assert main(["convert", str(folder), "-o", str(out), "-n", "2", "-q"]) == 0
    printed = capsys.readouterr().out
    assert "[ISL-N001]" in printed and "collapsed to the shared outer layout" in printed and out.exists()
