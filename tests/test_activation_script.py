"""``scripts/gpu/h200_activation.py`` on the CPU (``interpreted.sweep_script``: a tiny A in float32, the interpreted
backend): every activation it times gives the float64 one at one slot and at several, the float64 one it checks
against is each token's own expand restated here element by element, and an activation that reads another slot's
factor is left out of the timing."""
import dataclasses

import pytest
import torch

from interpreted import recording_timer, sweep_fixture
from inkling_lab import profile as pr


script = sweep_fixture("h200_activation")


class _Sglang:
    """Stands in for ``upstream_wheel.UpstreamSink``: its layer's ``_swiglu`` takes ``y [T, n, 2F]`` of interleaved
    (gate, up) pairs and ``gammas [T, n]`` to ``[T, n, F]``, as sglang's ``silu_and_mul_triton`` with the gammas."""

    def __init__(self, sink, batch, min_slots=1):
        def swiglu(y, gammas):
            gate, up = y[..., 0::2], y[..., 1::2]
            return torch.nn.functional.silu(gate) * up * gammas[..., None]
        self.layer = type("Layer", (), {"_swiglu": staticmethod(swiglu)})()


@pytest.mark.slow
@pytest.mark.parametrize("S", [1, 3])
def test_every_activation_is_the_float64_one(script, S):
    module, _ = script
    seen = []
    row = module.point("A", 16, S, 130, {"read": None}, 1, device="cpu", timer=recording_timer(seen), upstream_cls=_Sglang)
    names = {"expand", "bare", "swiglu", *(f"expand_{k}" for k in module.TILES)}
    assert set(row["rel_err"]) == names == seen[0], row["rel_err"]
    assert max(row["rel_err"].values()) < 1e-5, row["rel_err"]


@pytest.mark.slow
def test_the_float64_activation_is_each_tokens_own_expand(script):
    module, tb = script
    sc = pr.Case.of("A", 16, 3, 40).scenario("cpu")
    ops = sc.sink.operands()
    p = tb.plan(ops, 40, sc.batch, sc.x.device)
    n, F, R = ops.n, ops.intermediate, 16
    assert ops.interleaved and ops.buffers[0].shape[1] == 1  # the layout sglang's kernel reads, shared outer
    g = torch.Generator().manual_seed(3)
    y, sh = torch.randn(40, n * 2 * F, generator=g), torch.randn(40, 2 * R, generator=g)
    got = module.reference(ops, y, sh, sc.gammas, p.slots.long(), p.scalings)
    gb = ops.buffers[1].double()  # [S, n, 2F, R]: gate rows, then up rows
    slots = p.slots.tolist()
    assert len(set(slots)) > 1
    for t, s in enumerate(slots):
        for e in range(n):
            for f in (0, F // 2, F - 1):
                gate, up = y[t, e * 2 * F + 2 * f].double(), y[t, e * 2 * F + 2 * f + 1].double()
                if s >= 0:
                    c = float(p.scalings[s])
                    gate = gate + c * sum(sh[t, r].double() * gb[s, e, f, r] for r in range(R))
                    up = up + c * sum(sh[t, R + r].double() * gb[s, e, F + f, r] for r in range(R))
                want = gate * torch.sigmoid(gate) * up * sc.gammas[t, e].double()
                assert torch.allclose(got[t, e * F + f], want, rtol=1e-9, atol=1e-12), (t, e, f)


@pytest.mark.slow
def test_an_activation_reading_another_slots_factor_is_not_timed(script, monkeypatch):
    module, tb = script
    expand_act = tb._expand_act

    def wrong(ops, y, gammas, act, sh, gb, t, slot=0, scale=1.0, runs=None, scalings=None):
        if runs is not None:  # every run on the next slot's factor
            runs = dataclasses.replace(runs, slots=(runs.slots + 1) % gb.shape[0])
        return expand_act(ops, y, gammas, act, sh, gb, t, (slot + 1) % gb.shape[0], scale, runs, scalings)

    monkeypatch.setattr(tb, "_expand_act", wrong)
    seen = []
    row = module.point("A", 16, 3, 130, {"read": None}, 1, device="cpu", timer=recording_timer(seen))
    assert seen == [{"bare"}], row["rel_err"]


def test_against_puts_each_contender_over_its_own_in_the_other_record(script):
    module, _ = script
    before = [{"shape": "B", "R": 16, "S": 1, "T": 2048, "us": {"expand@read": 25.0, "bare@read": 20.0,
                                                                "swiglu@read": 18.0, "expand@write": 30.0}},
              {"shape": "B", "R": 64, "S": 1, "T": 2048, "us": {"expand@read": 40.0}}]
    after = [{"shape": "B", "R": 16, "S": 1, "T": 2048, "us": {"expand@read": 20.0, "bare@read": 18.0,
                                                               "swiglu@read": 16.0, "expand_x64f64w4@read": 19.0}},
             {"shape": "Inkling", "R": 16, "S": 1, "T": 2048, "us": {"expand@read": 50.0}}]
    lines = module.against(before, after, "read")
    assert len(lines) == 1  # the one point both timed
    line = lines[0]
    assert "expand    25.0 ->    20.0 (0.800x, 1.25x sglang's)" in line, line
    assert "bare    20.0 ->    18.0 (0.900x, 1.12x sglang's)" in line, line
    assert "x64f64w4" not in line and "swiglu" not in line  # nothing of its own before; sglang's is the yardstick
    assert module.against(before, after, "write") == []  # no contender timed under that flush in both
