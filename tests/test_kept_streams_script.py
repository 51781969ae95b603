"""``scripts/gpu/h200_kept_streams.py``'s correctness pass on the CPU (``interpreted.sweep_script``), so the
H200 call cannot die of a typo: every contender, the kept copies with ``run_streams`` on and off among
them, is the adapters' forward for runs with an empty kept slot between them."""

from interpreted import stubbed_sweep, sweep_fixture


script = sweep_fixture("h200_kept_streams")


def test_the_kept_streams_pass_checks_every_contender(script):
    module, tb = script
    rows = module.correctness()
    assert len(rows) == 4  # two shapes, both gate/up layouts
    assert all(r["ok"] for r in rows), [r["rel_err"] for r in rows]
    assert all(set(r["rel_err"]) == {k + g for k in ("kit", "kept", "kept_streams") for g in ("", "_graph")}
               for r in rows)


def test_the_sweep_times_every_contender_at_every_point(script, monkeypatch):
    """The sweep on the CPU (``interpreted.stubbed_sweep``, tiny token counts): every point has every
    contender checked against the float64 reference and timed."""
    module, tb = script
    rows = stubbed_sweep(module, monkeypatch, SLOTS=(4,), TOKENS=(16, 24))
    names = {"kit", "kept", "kept_streams", "sglang_base"}
    assert [(r["S"], r["T"]) for r in rows] == [(4, 16), (4, 24)]
    for r in rows:
        assert set(r["rel_err"]) == names and max(r["rel_err"].values()) < 1e-5, r["rel_err"]
        assert set(r["us"]) == {k + "@read" for k in names}
