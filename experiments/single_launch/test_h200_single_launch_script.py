"""``experiments/single_launch/h200_single_launch.py`` end to end on the CPU, so that the one H200 call it is
made for does not die of a typo: tiny shapes, the interpreted kernel (float32), and the
CUDA-only steps replaced (graph capture and timing run the function once and report
1 µs; the float64 reference stands in for the ``triton`` and ``cublas_base`` backends).
What it checks is the plumbing: every correctness case, sweep candidate and grid point
runs, agrees with the reference, and lands in the record with the fields KERNEL_NOTES.md
and the notebooks read."""
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from inkling_lab import profile as pr, scenario
from inkling_lab.forward.reference import reference_forward

from test_single_launch import sl  # the interpreted copy of the kernel module

HERE = Path(__file__).resolve().parent  # the script sits beside this test


@pytest.fixture
def script(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("h200_single_launch", None)
    import h200_single_launch as h

    monkeypatch.setattr(h, "sl", sl)
    monkeypatch.setattr(h, "DEVICE", "cpu")
    monkeypatch.setattr(h, "SHAPES", {"A": (2, 40, 24), "inkling-tp8": (2, 48, 16)})
    monkeypatch.setattr(h, "RANKS", (16,))
    monkeypatch.setattr(h, "SLOTS", (4,))
    monkeypatch.setattr(h, "TOKENS", (1, 20))
    monkeypatch.setattr(h, "TOLERANCE", {torch.bfloat16: 1e-4, torch.float16: 1e-4})
    monkeypatch.setattr(h, "finish_or_exit", lambda *a, **k: None)
    # the H200 run's time budgets are the device's; here the whole plan runs, however slow the machine
    monkeypatch.setattr(h, "BUDGET_S", float("inf"))
    monkeypatch.setattr(h, "GRID_BUDGET_S", float("inf"))
    monkeypatch.setattr(h, "graph_of", lambda fn: type("Graph", (), {"replay": staticmethod(fn)})())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(pr, "measure_ceilings", lambda *a, **k: {"copy_TBps": 4.2, "matmul_TFLOPs": 780.0})
    monkeypatch.setattr(pr, "L2Flush", lambda device: None)
    monkeypatch.setattr(pr, "time_graph", lambda fn, flush, reps: [(fn(), 1.0)[1]])

    def runner(backend, sink, x, gammas, batch, tiles=None):
        ops = sink.operands()
        return (lambda: reference_forward(ops, x, gammas, batch if backend == "triton" else None).to(x.dtype)), True

    monkeypatch.setattr(pr, "backend_runner", runner)
    # float32 everywhere: the interpreter mishandles bf16 (the H200 run checks bf16 and fp16)
    case_scenario = pr.Case.scenario
    monkeypatch.setattr(pr.Case, "scenario", lambda c, device, seed=0, sink=None:
                        case_scenario(replace(c, dtype="float32"), device, seed, sink))
    draw = scenario.Scenario.random.__func__
    monkeypatch.setattr(h, "Scenario", type("Scenario", (), {
        "random": classmethod(lambda cls, g, **kw: draw(scenario.Scenario, g, **{**kw, "dtype": torch.float32}))}))
    return h


@pytest.mark.slow
def test_the_h200_script_runs_through_on_the_cpu(script, tmp_path, monkeypatch):
    out = tmp_path / "record.json"
    monkeypatch.setattr(sys, "argv", ["h200_single_launch.py", "--out", str(out), "--reps", "1", "--shapes", "A"])
    assert script.main() == 0
    record = json.loads(out.read_text())
    assert record["version"] == sl.VERSION == "v12" and record["failed"] == 0 and not record["truncated"]
    assert len(record["checks"]) == 16 + len(script.CHECK_SCHEDULES)
    assert all(c["ok"] and c["workspace_clean"] for c in record["checks"])
    assert {c["schedule"] for c in record["checks"]} == {"default", *script.CHECK_SCHEDULES}
    programs7 = next(c for c in record["checks"] if c["schedule"] == "programs7")
    assert programs7["plan"]["programs"] == 7 < programs7["plan"]["tasks"]
    for row in record["sweep"]:
        assert set(row["us"]) == set(script.CANDIDATES) and not row["wrong"] and not row["errors"]
        assert row["winner"] in script.CANDIDATES and all(v < 1e-4 for v in row["rel_vs_triton"].values())
        assert row["plans"]["phased"]["lag"] == row["plans"]["phased"]["chunks"]
        assert row["plans"]["kc_other"]["config"]["kc"] != row["plans"]["v12"]["config"]["kc"]
        assert row["plans"]["v12"]["lag"] == row["plans"]["v12"]["chunks"] and not row["plans"]["v12"]["config"]["persistent"]
        assert row["plans"]["kc_whole"]["chunks"] == 2  # n = 2 experts, one chunk each
    assert [(p["T"], p["S"]) for p in record["points"]] == [(1, 4), (20, 4)]
    assert all(p["rel_vs_triton"] < 1e-4 and p["workspace_clean"] for p in record["points"])
