"""``scripts/gpu/h200_pdl.py``'s correctness pass on the CPU: Triton's interpreter, float32, a
tiny shape, the CUDA-only steps stubbed (a graph replays by calling the launch again), PDL off
(the interpreter has no grid dependency control). So the H200 call cannot die of a typo or of
a renamed profile helper, and the pass flags a forward that leaves its output unwritten."""
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from interpreted import import_interpreted, without_overflow_checks
from inkling_lab import profile as pr
from inkling_lab.geometry import PRESETS
from inkling_lab.batch import SlotBatch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def script(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.syspath_prepend(str(ROOT / "scripts" / "gpu"))
    tb = import_interpreted("inkling_lab.forward.kernels", "inkling_lab.forward.triton_backend")
    module = import_interpreted("h200_pdl")
    sys.modules.pop("h200_pdl", None)
    monkeypatch.setattr(module, "tb", tb)
    monkeypatch.setitem(module.VARIANTS, "pdl", {"pdl": False})
    monkeypatch.setattr(module, "CHECK_TOKENS", (9,))  # the interpreter is slow: one token count
    monkeypatch.setattr(pr, "SHAPES", {"A": "A"})
    monkeypatch.setitem(PRESETS, "A", PRESETS["A"].with_(n=2, hidden=32, intermediate=16))
    scenario = pr.Case.scenario
    monkeypatch.setattr(pr.Case, "scenario", lambda c, device, **kw: scenario(replace(c, dtype="float32"), "cpu", **kw))
    monkeypatch.setattr(pr, "capture", lambda fn: type("Graph", (), {"replay": staticmethod(fn)})())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    to = SlotBatch.to
    monkeypatch.setattr(SlotBatch, "to", lambda self, device: to(self, "cpu"))
    with without_overflow_checks():  # test_triton.py runs these kernels with the check
        yield module


@pytest.mark.slow
def test_the_correctness_pass_runs_every_check_and_flags_an_unwritten_output(script, monkeypatch):
    rows = script.correctness()
    assert len(rows) == 8  # every layout and dtype of A, one variant
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    assert {"mixed", "no_adapter", "graph", "resident", "base_only"} <= set(rows[0]["rel_err"])
    unwritten = lambda ops, x, *a: torch.full_like(x, float("nan"))  # noqa: E731
    monkeypatch.setattr(script, "run", unwritten)
    monkeypatch.setattr(script, "graph_replays", unwritten)
    assert not any(r["ok"] for r in script.correctness())


@pytest.mark.slow
def test_the_gathered_epilogues_pass_the_same_checks(script, monkeypatch):
    monkeypatch.setitem(script.VARIANTS, "gather", {"pdl": False, "gather": True})
    monkeypatch.setattr(script, "CHECKED", ["gather"])
    rows = script.correctness()
    assert len(rows) == 8 and {r["variant"] for r in rows} == {"gather"}
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
