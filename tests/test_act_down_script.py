"""``scripts/gpu/h200_act_down.py``'s correctness pass on the CPU (``interpreted.sweep_script``), so the
H200 call cannot die of a typo: every contender, the kept copies through ``act_down_kernel`` among them,
is the adapter's forward at 2, 9 and 32 tokens of one kept slot."""
import pytest

from interpreted import sweep_script


@pytest.fixture
def script(monkeypatch):
    with sweep_script("h200_act_down", monkeypatch) as loaded:
        yield loaded


def test_the_act_down_pass_checks_every_contender(script):
    module, tb = script
    rows = module.correctness()
    assert len(rows) == 24  # two shapes, both gate/up layouts, two dtypes, three token counts
    assert all(r["ok"] for r in rows), [r["rel_err"] for r in rows]
    assert all(set(r["rel_err"]) == {k + g for k in ("kit", "kept", "act_down_h64k128s4") for g in ("", "_graph")}
               for r in rows)


def test_every_variant_is_a_tile_the_backend_takes(script):
    module, tb = script
    for name, v in module.VARIANTS.items():
        t = tb.act_down_tiles(8, **v)
        assert t.act_down and t.bm == 16 and t.bn == v["bn"] and t.bk == v["bk"], name
