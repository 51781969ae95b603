"""``scripts/gpu/h200_grouped.py``'s correctness pass on the CPU (``interpreted.sweep_script``). So
the H200 call cannot die of a typo or a renamed helper, and the pass flags a grouped launch that leaves
its output unwritten or adds a slot's LoRA to another slot's tokens."""
from dataclasses import replace

import pytest

from interpreted import stubbed_sweep, sweep_fixture


script = sweep_fixture("h200_grouped")


@pytest.mark.slow
def test_the_correctness_pass_checks_the_grouped_launch_and_flags_a_wrong_one(script, monkeypatch):
    module, tb = script
    rows = module.correctness()
    assert len(rows) == 4  # A and the TP-8 slice, both gate/up layouts
    assert all(r["ok"] for r in rows), [r["rel_err"] for r in rows]
    assert set(rows[0]["rel_err"]) == {k + g for k in ("kit", "g_epi") for g in ("", "_graph")}
    grouped = tb._launch_grouped

    def shifted(ops, x, gammas, p, out):  # the groups one token off: slot runs misread
        return grouped(ops, x, gammas, replace(p, offs=p.offs - 1), out)

    monkeypatch.setattr(tb, "_launch_grouped", shifted)
    rows = module.correctness()
    assert all(r["rel_err"]["kit"] < 1e-5 for r in rows) and not any(r["ok"] for r in rows)
    assert not any(r["rel_err"]["g_" + m] < 1e-4 for r in rows for m in module.MODES)  # NaN counts as wrong


def test_the_sweep_times_every_contender_at_every_point(script, monkeypatch):
    """The sweep on the CPU (``interpreted.stubbed_sweep``, one token count on the cuBLAS tiles): every point
    has every contender checked against the float64 reference and timed, sglang's base among them."""
    module, tb = script
    rows = stubbed_sweep(module, monkeypatch, TOKENS=(130,))  # the cuBLAS tiles, as from 512
    assert [(r["R"], r["S"]) for r in rows] == [(R, S) for R in (16, 64) for S in (4, 8)]
    for r in rows:
        assert "sglang_base" in r["rel_err"] and max(r["rel_err"].values()) < 1e-5, r["rel_err"]
        assert set(r["us"]) == {k + "@read" for k in r["rel_err"]}
