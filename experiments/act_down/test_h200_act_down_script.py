"""``h200_act_down.py`` (beside this file)'s correctness pass on the CPU (``interpreted.sweep_script``), so
the H200 call cannot die of a typo: every contender, the kept copies through ``act_down_kernel`` among
them (both folds), is the adapter's forward at 2, 9 and 32 tokens of one kept slot, and every swept tile is one the
kernel takes."""
import sys
from pathlib import Path

import pytest

from interpreted import import_interpreted, stubbed_sweep, sweep_script


@pytest.fixture
def script(monkeypatch):
    with sweep_script("h200_act_down", monkeypatch, Path(__file__).resolve().parent) as (module, tb):
        sys.modules.pop("act_down", None)  # imported with the script: no other test sees that copy
        monkeypatch.setattr(module, "ad", import_interpreted("act_down"))
        yield module


def test_the_act_down_pass_checks_every_contender(script):
    rows = script.correctness()
    assert len(rows) == 24  # two shapes, both gate/up layouts, two dtypes, three token counts
    assert all(r["ok"] for r in rows), [r["rel_err"] for r in rows]
    names = ("kit", "kept", "act_down_h64k128s4", "up_act_f32k128s4", "slot_down_h64k64s3")
    assert all(set(r["rel_err"]) == {k + g for k in names for g in ("", "_graph")} for r in rows)


def test_every_swept_tile_is_one_the_kernel_takes(script):
    assert set(script.VARIANTS) == {*script.ad.FOLDS, "slot"} == set(script.PREFIX)
    for fold, tiles in script.VARIANTS.items():
        for name, v in tiles.items():
            t = script.ad.tiles(8, **v)
            assert (t.bt, t.bh, t.bk, t.stages, t.warps) == (16, v["bh"], v["bk"], v["stages"], v.get("warps", 4)), name


def test_the_sweep_times_every_contender_at_every_point(script, monkeypatch):
    """The sweep on the CPU (``interpreted.stubbed_sweep``): every point has every contender checked
    against the float64 reference and timed."""
    rows = stubbed_sweep(script, monkeypatch, TOKENS=(2, 19))
    every = {"kit", "kept", "sglang_base", *(script.name(f, t) for f, tiles in script.VARIANTS.items() for t in tiles)}
    slot_only = {"kit", "sglang_base", *(script.name("slot", t) for t in script.VARIANTS["slot"])}
    assert [(r["R"], r["T"]) for r in rows] == [(16, 2), (16, 19), (64, 2), (64, 19)]
    for r in rows:
        names = every if r["R"] == script.KEPT_RANK else slot_only
        assert set(r["rel_err"]) == names and max(r["rel_err"].values()) < 1e-5, r["rel_err"]
        assert set(r["us"]) == {k + "@read" for k in names}
