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
    monkeypatch.setitem(nb._fixes, "ISL-E001", nb.fix_cell("ISL-E001"))
    nb.verify("ISL-E001")
    assert "✓ verified: re-ran the fix cell of ISL-E001" in capsys.readouterr().out
    monkeypatch.setitem(nb._fixes, "ISL-E001", entry.setup + entry.trigger)
    with pytest.raises(AssertionError, match="re-ran the fix cell of ISL-E001.*does not run clean"):
        nb.verify("ISL-E001")


def test_verify_makes_the_entrys_warning_an_error(monkeypatch):
    entry = il.CATALOG["ISL-W001"]
    monkeypatch.setitem(nb._fixes, "ISL-W001", entry.setup + entry.trigger)
    with pytest.raises(AssertionError, match="UpstreamDefectWarning"):
        nb.verify("ISL-W001")
    monkeypatch.setitem(nb._fixes, "ISL-W001", nb.fix_cell("ISL-W001"))
    nb.verify("ISL-W001")


def test_verify_before_the_fix_cell_ran_runs_the_shipped_fix_and_says_so(capsys, monkeypatch):
    monkeypatch.setattr(nb, "_fixes", {})
    nb.verify("ISL-E001")
    out = capsys.readouterr().out
    assert "re-ran ISL-E001's fix as the notebook ships it" in out and "has not run in this kernel" in out


@pytest.fixture
def shell(monkeypatch):
    """A real IPython shell with the kit's cell hook, as in a notebook kernel."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    monkeypatch.setattr(nb, "_last_cell", {})
    monkeypatch.setattr(nb, "_fixes", {})
    nb._watch_cells()
    shell.run_cell("import inkling_lab as il")
    yield shell
    shell.events.unregister("post_run_cell", nb._remember)
    InteractiveShell.clear_instance()


def _cell(shell, source: str):
    return shell.run_cell(source)


def test_raised_judges_the_trigger_not_a_failed_verify_before_it(shell):
    """A walkthrough as a learner meets it: the trigger raises, the check passes, a broken
    fix fails its verify, then the trigger, edited so that it no longer raises, is judged
    by what it did (nothing), not by the verify's AssertionError."""
    entry = il.CATALOG["ISL-E001"]
    assert _cell(shell, entry.setup + entry.trigger).error_in_exec is not None
    assert _cell(shell, 'il.nb.raised("ISL-E001")').success
    broken_fix = nb.FIX_MARK.format(code="ISL-E001") + "\n" + entry.setup + entry.trigger
    _cell(shell, broken_fix)
    failed = _cell(shell, 'il.nb.verify("ISL-E001")').error_in_exec
    assert isinstance(failed, AssertionError) and "re-ran the fix cell of ISL-E001" in str(failed)
    assert _cell(shell, entry.setup + entry.fix).success  # the trigger, edited: raises nothing
    judged = _cell(shell, 'il.nb.raised("ISL-E001")').error_in_exec
    assert isinstance(judged, AssertionError) and "nothing was raised" in str(judged), judged


def test_verify_reruns_the_fix_cell_even_when_the_check_ran_after_it(shell, capsys):
    """verify re-runs the cell marked as the fix of its code, not whatever ran last."""
    entry = il.CATALOG["ISL-E001"]
    _cell(shell, nb.fix_cell("ISL-E001"))
    _cell(shell, entry.setup + entry.trigger)  # something else ran in between
    assert _cell(shell, 'il.nb.verify("ISL-E001")').success
    assert "re-ran the fix cell of ISL-E001" in capsys.readouterr().out
