"""``scripts/gpu/h200_grouped.py``'s correctness pass on the CPU: Triton's interpreter, float32, a
tiny shape, the CUDA-only steps stubbed (a graph replays by calling the launch again). So the H200
call cannot die of a typo or a renamed helper, and the pass flags a grouped launch that leaves its
output unwritten or adds a slot's LoRA to another slot's tokens."""
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from interpreted import import_interpreted, without_overflow_checks
from inkling_lab import profile as pr
from inkling_lab.batch import SlotBatch
from inkling_lab.geometry import PRESETS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def script(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.syspath_prepend(str(ROOT / "scripts" / "gpu"))
    tb = import_interpreted("inkling_lab.forward.kernels", "inkling_lab.forward.triton_backend")
    module = import_interpreted("h200_grouped")
    sys.modules.pop("h200_grouped", None)
    sys.modules.pop("h200_pdl", None)
    monkeypatch.setattr(module, "tb", tb)
    for preset in ("A", "Inkling-TP8"):
        name = pr.SHAPES[preset]
        monkeypatch.setitem(PRESETS, name, PRESETS[name].with_(n=2, hidden=32, intermediate=24))
    scenario = pr.Case.scenario
    monkeypatch.setattr(pr.Case, "scenario", lambda c, device, **kw: scenario(replace(c, dtype="float32"), "cpu", **kw))
    monkeypatch.setattr(pr, "capture", lambda fn: type("Graph", (), {"replay": staticmethod(fn)})())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    with without_overflow_checks():
        yield module, tb


@pytest.mark.slow
def test_the_correctness_pass_checks_every_mode_and_flags_a_wrong_one(script, monkeypatch):
    module, tb = script
    rows = module.correctness()
    assert len(rows) == 4  # A and the TP-8 slice, both gate/up layouts
    assert all(r["ok"] for r in rows), [r["rel_err"] for r in rows]
    assert set(rows[0]["rel_err"]) == {k + g for k in ("kit", "g_epi", "g_fold") for g in ("", "_graph")}
    grouped = tb._launch_grouped

    def shifted(ops, x, gammas, p, out, mode):  # the groups one token off: slot runs misread
        return grouped(ops, x, gammas, replace(p, offs=p.offs - 1), out, mode)

    monkeypatch.setattr(tb, "_launch_grouped", shifted)
    rows = module.correctness()
    assert all(r["rel_err"]["kit"] < 1e-5 for r in rows) and not any(r["ok"] for r in rows)
    assert not any(r["rel_err"]["g_" + m] < 1e-4 for r in rows for m in module.MODES)  # NaN counts as wrong
