"""Helpers for the notebooks' own cells: skip a GPU cell on a CPU, check the error the
cell above raised, verify a fix cell. Each prints one short verdict; none holds domain logic.

    if il.nb.requires_cuda():        # on a CPU: prints "skipped: needs CUDA", the body does not run
        ...
"""
from __future__ import annotations

import contextlib
import io
import re
import sys
import traceback
import warnings
from pathlib import Path

from .errors import CATALOG, SNIPPET_PRELUDE, _run_snippet, expect_error


def requires_cuda() -> bool:
    """True when a CUDA device is present. Otherwise print ``skipped: needs CUDA`` and
    return False, so that ``if il.nb.requires_cuda():`` skips a GPU cell's body without
    an error and "Run All" goes on."""
    import torch

    if torch.cuda.is_available():
        return True
    print("skipped: needs CUDA (this cell re-measures on a GPU; nothing after it depends on it)")
    return False


def _ipython():
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - the notebooks run in IPython
        return None
    return get_ipython()


CHECKS = ("raised", "reported", "explained", "verify")
_CHECK_CALL = re.compile(r"\bil\.nb\.(?:" + "|".join(CHECKS) + r")\(")
FIX_MARK = "# the fix for {code}"
"""The first line of a walkthrough's fix cell (notebook 03): ``verify(code)`` re-runs the
cell that starts so, whatever ran in between."""
_FIX_LINE = re.compile(r"# the fix for (ISL-[A-Z]\d+)\b")

_last_cell: dict[str, object] = {}
"""The last cell that is no check cell: its ``source`` and the ``error`` it raised (or
``None``), kept by an IPython ``post_run_cell`` hook. A check judges the cell above it,
never a check's own failure (IPython's ``sys.last_value`` would hold a failed verify's
AssertionError), and IPython's ``_i`` is empty when a runner executes cells without
history, as nbval does."""

_fixes: dict[str, str] = {}
"""{code: source} of every fix cell run in this kernel (see ``FIX_MARK``)."""


def _remember(result) -> None:
    source = result.info.raw_cell
    if _CHECK_CALL.search(source):
        return
    fix = _FIX_LINE.match(source.lstrip())
    if fix:
        _fixes[fix.group(1)] = source
    _last_cell.update(source=source, error=result.error_before_exec or result.error_in_exec)


def _watch_cells() -> None:
    shell = _ipython()
    if shell is not None and _remember not in shell.events.callbacks["post_run_cell"]:
        shell.events.register("post_run_cell", _remember)


_watch_cells()  # from the first il.nb call on: the checks judge the cells run after it


def _last_library_frame(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "inkling_lab" in Path(f.filename).parts and Path(f.filename).name != "errors.py"]
    if not frames:
        return "outside the kit"
    path = Path(frames[-1].filename)
    return f"{'/'.join(path.parts[path.parts.index('inkling_lab'):])}, in {frames[-1].name}"


def _where_upstream(entry) -> str:
    """Where sglang raises it, or, for the kit's own refusals, what sglang does instead."""
    upstream = getattr(entry, "upstream", "")
    by_upstream = getattr(entry, "by_upstream", getattr(entry, "origin", "").startswith("sglang"))
    if by_upstream:
        return (f"  sglang: {upstream}" if upstream else
                "  sglang raises the same type and message; only the frames above it differ")
    return "  the kit's own check" + (f"; sglang: {upstream}" if upstream else "")


def _last_error() -> BaseException | None:
    """What the last cell that is no check cell raised (``None``: nothing), consumed, so
    that no later check sees it again. Outside IPython (a test, a script), or before the
    hook saw such a cell, Python's record of the last uncaught exception."""
    if "error" in _last_cell:
        exc = _last_cell["error"]
        _last_cell["error"] = None
    else:
        exc = getattr(sys, "last_value", None)
    sys.last_value = None
    if hasattr(sys, "last_exc"):
        sys.last_exc = None
    return exc  # type: ignore[return-value]


def _check_last_error(code: str) -> BaseException:
    """The exception the cell above raised, if it is exactly catalog entry ``code``;
    ``AssertionError`` otherwise (nothing raised, or something else)."""
    exc = _last_error()
    check = expect_error(code, show=False)
    check.__enter__()
    if exc is None:
        check.__exit__(None, None, None)  # raises: nothing was raised
    check.__exit__(type(exc), exc, exc.__traceback__)  # raises unless it is exactly this entry
    return exc


def _explained(entry) -> str:
    """The line saying how sglang's own words for ``entry`` read (they must be explained as it)."""
    from .errors import find_entry

    sample = getattr(entry, "sample", "")
    if find_entry(sample) is not entry:
        raise AssertionError(f"{entry.code}: sglang's words {sample!r} are not explained as {entry.code}")
    return (f"✓ explained as expected: {entry.code}, {entry.title}; {_who(entry)} says:\n  {sample}\n"
            f"  → what it means and what to do: il.explain({entry.code!r})")


def _who(entry) -> str:
    return getattr(entry, "generation", "") or getattr(entry, "origin", "")


def raised(code: str) -> None:
    """Check that the cell run last before this one (check cells like this one do not
    count) raised exactly catalog entry ``code`` (its type and its message), and say where the kit raised it and where sglang does.
    For words the kit does not write itself, the cell must raise what the kit raises
    instead (the entry's ``kit_code``), and sglang's words must read as ``code``.

    Raises ``AssertionError`` when that cell raised nothing, or something else: a
    walkthrough never passes by not raising.
    """
    entry = CATALOG[code]
    kit_code = "" if getattr(entry, "reproduced", True) else entry.kit_code
    exc = _check_last_error(kit_code or code)
    shown = CATALOG[kit_code or code]
    print(f"✓ raised as expected: {shown.code}, {shown.title}")
    print(f"  the kit raised it in {_last_library_frame(exc)}")
    if kit_code:
        print(_explained(entry))
    else:
        print(_where_upstream(entry))


def reported(code: str, found) -> None:
    """Check that ``found`` (a ``Diagnosis``, anything with ``.findings``, or a list of
    findings: what the cell above gave) holds finding ``code``; ``AssertionError`` if not."""
    from .errors import codes_of

    entry = CATALOG[code]
    got = codes_of(found)
    if code not in got:
        raise AssertionError(f"expected finding {code} ({entry.title}), but the cell above reports {got}")
    print(f"✓ reported as expected: {code}, {entry.title}")
    print(_where_upstream(entry))


def explained(code: str) -> None:
    """For words only sglang writes (the kit raises nothing for the trigger above):
    check that they read as ``code`` and show them."""
    print(_explained(CATALOG[code]))


def fix_cell(code: str) -> str:
    """The source of catalog entry ``code``'s fix cell as notebook 03 ships it: its
    ``FIX_MARK`` line, then the entry's setup and fix."""
    entry = CATALOG[code]
    return f"{FIX_MARK.format(code=code)}: edit it, run it, then the check below\n{entry.setup}{entry.fix}"


def verify(code: str) -> None:
    """Re-run catalog entry ``code``'s fix cell (the cell that starts with ``FIX_MARK``,
    as last run in this kernel; the fix as shipped when it has not run yet) in a fresh
    namespace, with the entry's warning made an error, and say which it ran and whether
    it runs clean.

    A finding's fix must not report it. Raises ``AssertionError`` with what still goes
    wrong. What the fix prints is not shown again.
    """
    entry = CATALOG[code]
    source = _fixes.get(code)
    ran = f"re-ran the fix cell of {code} (the one starting {FIX_MARK.format(code=code)!r})"
    if source is None:
        source = fix_cell(code)
        ran = (f"re-ran {code}'s fix as the notebook ships it: its fix cell has not run in this kernel "
               "(run it first to check your own edit)")
    with warnings.catch_warnings():
        if isinstance(entry.exc_type, type) and issubclass(entry.exc_type, Warning):
            warnings.simplefilter("error", entry.exc_type)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                result = _run_snippet(SNIPPET_PRELUDE + source, f"<fix for {code}>")
        except Exception as exc:  # noqa: BLE001 - any failure is the verdict
            raise AssertionError(f"{ran}; it does not run clean in a fresh namespace: "
                                 f"{type(exc).__name__}: {exc}") from exc
    if entry.exc_type is None and result is not None:  # a finding: the fix must not report it
        from .errors import codes_of

        if code in codes_of(result):
            raise AssertionError(f"{ran}; it still reports {code}")
    print(f"✓ verified: {ran}; on fresh objects it runs clean, without {code} or any other error")
