"""A GPU script of ``scripts/gpu`` imported to run its correctness pass on the CPU: Triton's
interpreter, float32, a tiny shape (A and the TP-8 slice at ``n = 2``, ``H = 32``, ``F = 24``), the
CUDA-only steps stubbed (a graph replays by calling the launch again)."""
import sys
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch

from interpreted import import_interpreted, without_overflow_checks
from inkling_lab import profile as pr
from inkling_lab.geometry import PRESETS

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def interpreted_script(name: str, monkeypatch):
    """``(script module, interpreted backend)`` for ``scripts/gpu/<name>.py``."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.syspath_prepend(str(ROOT / "scripts" / "gpu"))
    tb = import_interpreted("inkling_lab.forward.kernels", "inkling_lab.forward.triton_backend")
    module = import_interpreted(name)
    sys.modules.pop(name, None)
    sys.modules.pop("h200_pdl", None)
    monkeypatch.setattr(module, "tb", tb)
    for preset in ("A", "Inkling-TP8"):
        key = pr.SHAPES[preset]
        monkeypatch.setitem(PRESETS, key, PRESETS[key].with_(n=2, hidden=32, intermediate=24))
    scenario = pr.Case.scenario
    monkeypatch.setattr(pr.Case, "scenario", lambda c, device, **kw: scenario(replace(c, dtype="float32"), "cpu", **kw))
    monkeypatch.setattr(pr, "capture", lambda fn: type("Graph", (), {"replay": staticmethod(fn)})())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    with without_overflow_checks():
        yield module, tb
