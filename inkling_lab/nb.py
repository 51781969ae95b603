"""Helpers for the notebooks' own cells: skip a GPU cell on a CPU, check the error the
cell above raised, verify a fix cell. Each prints one short verdict; none holds domain logic.

    if il.nb.requires_cuda():        # on a CPU: prints "skipped: needs CUDA", the body does not run
        ...
"""
from __future__ import annotations

import contextlib
import io
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


_last_cell: dict[str, str] = {}
"""The source of the cell that finished last (kept by an IPython ``post_run_cell`` hook:
IPython's own ``_i`` is empty when a runner executes cells without history, as nbval does)."""


def _remember(result) -> None:
    if "il.nb.verify(" not in result.info.raw_cell:
        _last_cell["source"] = result.info.raw_cell


def _watch_cells() -> None:
    shell = _ipython()
    if shell is not None and _remember not in shell.events.callbacks["post_run_cell"]:
        shell.events.register("post_run_cell", _remember)


_watch_cells()  # from the first il.nb call on, so that verify() can see the fix cell before it


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


def _check_last_error(code: str) -> BaseException:
    """The exception the previous cell raised, if it is exactly catalog entry ``code``;
    ``AssertionError`` otherwise. Consumed, so that no later check sees it again."""
    exc = getattr(sys, "last_value", None)  # IPython's record of the last uncaught exception
    sys.last_value = None
    if hasattr(sys, "last_exc"):
        sys.last_exc = None
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
    """Check that the cell run just before this one raised exactly catalog entry ``code``
    (its type and its message), and say where the kit raised it and where sglang does.
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


def verify(code: str) -> None:
    """Re-run the cell run just before this one (the fix) in a fresh namespace, with
    catalog entry ``code``'s warning made an error, and say whether it runs clean.

    A finding's fix must not report it. Raises ``AssertionError`` with what still goes
    wrong. What the fix prints is not shown again.
    """
    source = _last_cell.get("source", "")
    if not source.strip():
        raise RuntimeError("il.nb.verify re-runs the fix cell run just before it: run that cell first "
                           "(in Jupyter or IPython)")
    entry = CATALOG[code]
    first = next((line for line in source.splitlines() if line.strip() and not line.startswith("#")), "")
    with warnings.catch_warnings():
        if isinstance(entry.exc_type, type) and issubclass(entry.exc_type, Warning):
            warnings.simplefilter("error", entry.exc_type)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                result = _run_snippet(SNIPPET_PRELUDE + source, f"<fix for {code}>")
        except Exception as exc:  # noqa: BLE001 - any failure is the verdict
            raise AssertionError(f"the fix for {code} does not run clean in a fresh namespace: "
                                 f"{type(exc).__name__}: {exc}") from exc
    if entry.exc_type is None and result is not None:  # a finding: the fix must not report it
        from .errors import codes_of

        if code in codes_of(result):
            raise AssertionError(f"the fix for {code} still reports {code}")
    print(f"✓ verified: the fix runs clean on fresh objects, without {code} or any other error "
          f"(re-ran the cell above, from {first.strip()[:60]!r})")
