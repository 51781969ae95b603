"""``scripts/gpu/h200_kept_streams.py``'s correctness pass on the CPU (``interpreted.sweep_script``), so the
H200 call cannot die of a typo: every contender, the kept copies with ``run_streams`` on and off among
them, is the adapters' forward for runs with an empty kept slot between them."""
import pytest

from interpreted import sweep_script


@pytest.fixture
def script(monkeypatch):
    with sweep_script("h200_kept_streams", monkeypatch) as loaded:
        yield loaded


def test_the_kept_streams_pass_checks_every_contender(script):
    module, tb = script
    rows = module.correctness()
    assert len(rows) == 4  # two shapes, both gate/up layouts
    assert all(r["ok"] for r in rows), [r["rel_err"] for r in rows]
    assert all(set(r["rel_err"]) == {k + g for k in ("kit", "kept", "kept_streams") for g in ("", "_graph")}
               for r in rows)
