"""Kernel modules imported for Triton's CPU interpreter, for the tests on a machine
without a GPU. Triton decides at decoration time whether a ``@triton.jit`` function is
interpreted, so the variable must be set while the module is imported, and only then:
the modules the library itself imported, and the environment, are put back."""
from __future__ import annotations

import importlib
import os
import sys
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator


@contextmanager
def interpreter_on() -> Iterator[None]:
    """``TRITON_INTERPRET=1`` inside, the caller's value (or none) after."""
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved


@contextmanager
def without_overflow_checks() -> Iterator[None]:
    """Triton's interpreter without its int32 overflow sanitizer inside, with it after.

    The interpreter checks every integer add, sub and mul of a kernel for int32 overflow
    (a cast to int64, two compares and an assert, each interpreted): about half of an
    interpreted launch's time. A compiled kernel has no such check (it is a debug option).
    Only for tests whose point is what a kernel computes where the check adds nothing:
    vLLM's kernels (upstream's code, the kit claims only their output) and a GPU script
    driving the kit's own kernels, which ``test_triton.py`` runs with the check at these
    sizes. Needs triton imported for the interpreter (``conftest.py`` does it)."""
    import dataclasses

    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    saved = builder.options
    builder.options = dataclasses.replace(saved, sanitize_overflow=False)
    try:
        yield
    finally:
        builder.options = saved


def import_triton_for_the_interpreter() -> None:
    """Without a GPU, import triton for the first time under ``TRITON_INTERPRET=1``.

    Triton decides at decoration time whether a function is interpreted, its own
    standard library (``tl.sum``, ``tl.max``, ...) included, when triton is first
    imported. Without a GPU the kit's kernels only ever run in the interpreter, so triton
    is imported interpreted before a library that uses torch's triton integration (PEFT)
    imports it compiled; the variable itself is restored, so the tests that switch the
    interpreter on and off still decide for themselves. Without triton, nothing (the
    kernels' tests skip)."""
    import torch

    if torch.cuda.is_available() or "triton" in sys.modules:
        return
    with interpreter_on():
        try:
            import triton.language  # noqa: F401
        except ImportError:
            pass


def import_interpreted(*names: str) -> ModuleType:
    """Private interpreted copies of the modules ``names`` (imported in that order; the
    last is returned). ``sys.modules`` and the parent packages' attributes are restored,
    so the rest of the test session keeps the library's own modules."""
    parents = {name: name.rpartition(".") for name in names}
    saved_modules = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    saved_attrs = {}
    for name, (parent, _, attr) in parents.items():
        if parent and attr in vars(importlib.import_module(parent)):
            saved_attrs[name] = vars(sys.modules[parent]).pop(attr)
    try:
        with interpreter_on():
            for name in names:
                module = importlib.import_module(name)
        return module
    finally:
        for name, (parent, _, attr) in parents.items():
            sys.modules.pop(name, None)
            if parent:
                vars(sys.modules[parent]).pop(attr, None)
        sys.modules.update(saved_modules)
        for name, value in saved_attrs.items():
            parent, _, attr = parents[name]
            setattr(sys.modules[parent], attr, value)


GPU_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts" / "gpu"


@contextmanager
def gpu_script(name: str, folder: Path = GPU_SCRIPTS) -> Iterator[ModuleType]:
    """``<folder>/<name>.py`` (default ``scripts/gpu``) imported for the interpreter, its folder and
    ``scripts/gpu`` first on ``sys.path`` (as when the script runs: it imports its neighbours and
    ``scripts/gpu``'s helpers by name) and ``TRITON_INTERPRET=1`` inside (Triton reads it at each
    launch too)."""
    paths = list(dict.fromkeys((str(folder), str(GPU_SCRIPTS))))
    sys.path[:0] = paths
    try:
        module = import_interpreted(name)
        with interpreter_on():
            yield module
    finally:
        for path in paths:
            sys.path.remove(path)


@contextmanager
def sweep_script(name: str, monkeypatch, folder: Path = GPU_SCRIPTS) -> Iterator[tuple[ModuleType, ModuleType]]:
    """``(module, backend)``: a sweep script of ``folder`` (``scripts/gpu``' ``h200_grouped``, ``h200_merge``) set up
    for its correctness pass on the CPU (``gpu_script``): the interpreted backend as its ``tb``, float32
    on the CPU, a tiny shape (A and the TP-8 slice at ``n = 2``, ``H = 32``, ``F = 24``), the CUDA-only
    steps stubbed (a graph replays by calling the launch again), no int32 overflow checks."""
    import torch

    from inkling_lab import profile as pr
    from inkling_lab.geometry import PRESETS

    tb = import_interpreted("inkling_lab.forward.kernels", "inkling_lab.forward.triton_backend")
    with gpu_script(name, folder) as module:
        sys.modules.pop("h200_pdl", None)  # the script's neighbour, imported with it: no other test sees it
        if hasattr(module, "tb"):  # a script that times cuBLAS alone (h200_pad) has no backend
            monkeypatch.setattr(module, "tb", tb)
        for preset in ("A", "Inkling-TP8"):
            key = pr.SHAPES[preset]
            monkeypatch.setitem(PRESETS, key, PRESETS[key].with_(n=2, hidden=32, intermediate=24))
        scenario = pr.Case.scenario
        monkeypatch.setattr(pr.Case, "scenario",
                            lambda c, device, **kw: scenario(replace(c, dtype="float32"), "cpu", **kw))
        monkeypatch.setattr(pr, "capture", lambda fn: type("Graph", (), {"replay": staticmethod(fn)})())
        monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
        with without_overflow_checks():
            yield module, tb


def sweep_fixture(name: str) -> Callable:
    """A test module's ``script`` fixture: ``sweep_script(name)`` around each test that asks for it."""
    import pytest

    @pytest.fixture
    def script(monkeypatch):
        with sweep_script(name, monkeypatch) as loaded:
            yield loaded
    return script


def recording_timer(seen: list) -> Callable:
    """A sweep script's ``timer`` for the CPU: appends the names it is given to time to ``seen`` and times each at 1 µs
    under the read flush."""
    def timer(fns, flushes, reps):
        seen.append(set(fns))
        return {f"{k}@read": 1.0 for k in fns}
    return timer


def stubbed_sweep(module: ModuleType, monkeypatch, shapes=("A",), **fields) -> list[dict]:
    """``module.sweep`` (a ``sweep_script``) on the CPU: one flush, every graph timed at 1 µs, and sglang's
    layer stood in for by the float64 reference (``forward(x, gammas, lora=...)``: the sink's base forward
    without LoRA, ``reference_forward`` with it), ``fields`` set on the module first (``TOKENS``,
    ``SLOTS``) -> the sweep's rows."""
    from inkling_lab import profile as pr
    from inkling_lab.forward.reference import reference_forward

    class Upstream:
        def __init__(self, sink, batch, min_slots):
            self.sink, self.batch = sink, batch

        def forward(self, x, gammas, lora=True):
            if lora:
                return reference_forward(self.sink.operands(), x, gammas, self.batch).to(x.dtype)
            return self.sink.base_forward(x, gammas)

    for name, value in fields.items():
        monkeypatch.setattr(module, name, value)
    monkeypatch.setattr(module.h200_pdl, "both_flushes", lambda: {"read": None})
    monkeypatch.setattr(pr, "time_interleaved", lambda graphs, flush, reps: {k: [1.0] for k in graphs})
    return module.sweep(Upstream, 1, list(shapes))
