"""The notebooks' cell helpers: the GPU guard, the check of a raised error, the verify
of a fix cell."""
import sys

import pytest
import torch

import inkling_lab as il
from inkling_lab import nb


def test_requires_cuda_says_skipped_without_cuda(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert nb.requires_cuda() is False
    assert capsys.readouterr().out.startswith("skipped: needs CUDA")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert nb.requires_cuda() is True and capsys.readouterr().out == ""



def test_raised_checks_the_last_error_and_consumes_it(capsys, monkeypatch):
    pool = il.LoRAPool(2, 8, 6, 2, 4)
    try:
        il.SharedSinkLoRA(2, 8, 6).set_lora_info(pool.gate_up_a[0], *pool.buffers()[1:])
    except ValueError as exc:
        monkeypatch.setattr(sys, "last_value", exc, raising=False)
    nb.raised("ISL-E001")
    out = capsys.readouterr().out
    assert "✓ raised as expected: ISL-E001" in out and "inkling_lab/" in out
    with pytest.raises(AssertionError, match="nothing was raised"):
        nb.raised("ISL-E001")  # consumed: the next check cannot pass on the same error


def test_raised_fails_on_another_error(monkeypatch):
    monkeypatch.setattr(sys, "last_value", ValueError("Inkling shared-sink LoRA expert count does not match"),
                        raising=False)
    with pytest.raises(AssertionError, match=r"expected ISL-E001 .*\[ISL-E004\]"):
        nb.raised("ISL-E001")


def test_verify_reruns_the_fix_on_fresh_objects(capsys, monkeypatch):
    entry = il.CATALOG["ISL-E001"]
    monkeypatch.setitem(nb._last_cell, "source", entry.setup + entry.fix)
    nb.verify("ISL-E001")
    assert "✓ verified" in capsys.readouterr().out
    monkeypatch.setitem(nb._last_cell, "source", entry.setup + entry.trigger)
    with pytest.raises(AssertionError, match="does not run clean"):
        nb.verify("ISL-E001")


def test_verify_makes_the_entrys_warning_an_error(monkeypatch):
    entry = il.CATALOG["ISL-W001"]
    monkeypatch.setitem(nb._last_cell, "source", entry.setup + entry.trigger)
    with pytest.raises(AssertionError, match="UpstreamDefectWarning"):
        nb.verify("ISL-W001")
    monkeypatch.setitem(nb._last_cell, "source", entry.setup + entry.fix)
    nb.verify("ISL-W001")


def test_verify_needs_a_cell_before_it(monkeypatch):
    monkeypatch.setattr(nb, "_last_cell", {})
    with pytest.raises(RuntimeError, match="run that cell first"):
        nb.verify("ISL-E001")
