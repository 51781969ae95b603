"""``scripts/gpu/h200_grouped.py``'s and ``h200_merge.py``'s correctness passes on the CPU: Triton's
interpreter, float32, a tiny shape, the CUDA-only steps stubbed (a graph replays by calling the launch
again). So the H200 call cannot die of a typo or a renamed helper, and the pass flags a grouped or
merged launch that leaves its output unwritten or adds a slot's LoRA to another slot's tokens."""
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
def script(request, monkeypatch):
    """``(script module, interpreted backend)`` for the script named by the test's parameter
    (``h200_grouped`` unless told)."""
    name = getattr(request, "param", "h200_grouped")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.syspath_prepend(str(ROOT / "scripts" / "gpu"))
    tb = import_interpreted("inkling_lab.forward.kernels", "inkling_lab.forward.triton_backend")
    module = import_interpreted(name)
    sys.modules.pop(name, None)
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


@pytest.mark.slow
@pytest.mark.parametrize("script", ["h200_merge"], indirect=True)
def test_the_merge_pass_checks_runs_and_one_slot_and_flags_a_misread_run(script, monkeypatch):
    module, tb = script
    monkeypatch.setattr(module, "CHECK_SHAPES", ("A",))  # the TP-8 slice runs the same code
    monkeypatch.setattr(tb, "MERGE_TILE", (16, 16, 1))  # several row and column tiles
    rows = module.correctness()
    assert len(rows) == 8  # two dtypes, both gate/up layouts, uneven runs and one slot
    assert all(r["ok"] for r in rows), [r["rel_err"] for r in rows]
    assert all(set(r["rel_err"]) == {k + g for k in ("kit", "merge") for g in ("", "_graph")}
               for r in rows if r["runs"] == 1 or r["dtype"] == "bfloat16")
    assert all(set(r["rel_err"]) == {"kit", "kit_graph"}  # the grouped GEMM is bfloat16-only on CUDA
               for r in rows if r["runs"] > 1 and r["dtype"] == "float16")
    merged = tb._launch_merged

    def shifted(ops, x, gammas, p, out):  # each run's rows one token late
        late = tuple((a + 1, min(b + 1, x.shape[0])) for a, b in p.runs)
        return merged(ops, x, gammas, replace(p, runs=late, offs=(p.offs + 1).clamp(max=x.shape[0])), out)

    monkeypatch.setattr(tb, "_launch_merged", shifted)
    rows = module.correctness()
    merged = [r for r in rows if "merge" in r["rel_err"]]
    assert len(merged) == 6 and all(r["rel_err"]["kit"] < 1e-5 for r in rows)
    assert not any(r["ok"] for r in merged) and not any(r["rel_err"]["merge"] < 1e-4 for r in merged)
