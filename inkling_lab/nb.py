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

from .errors import CATALOG, SNIPPET_PRELUDE, expect_error


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


def raised(code: str) -> None:
    """Check that the cell run just before this one raised exactly catalog entry ``code``
    (its type and its message), and say where the kit raised it and where sglang does.

    Raises ``AssertionError`` when that cell raised nothing, or something else: a
    walkthrough never passes by not raising. The exception is consumed, so the next
    check cannot see it again.
    """
    exc = getattr(sys, "last_value", None)  # IPython's record of the last uncaught exception
    sys.last_value = None
    if hasattr(sys, "last_exc"):
        sys.last_exc = None
    check = expect_error(code, show=False)
    check.__enter__()
    if exc is None:
        check.__exit__(None, None, None)  # raises: nothing was raised
    check.__exit__(type(exc), exc, exc.__traceback__)  # raises unless it is exactly this entry
    entry = CATALOG[code]
    print(f"✓ raised as expected: {code}, {entry.title}")
    print(f"  the kit raised it in {_last_library_frame(exc)}")
    upstream = getattr(entry, "upstream", "")
    if upstream:
        print(f"  sglang raises it in {upstream}: its traceback ends there, below the server's loader frames")
    elif entry.origin.startswith("inkling_lab"):
        print("  a refusal of the kit's own (ISL-K): what sglang does instead is under 'Why' below")
    else:
        print(f"  {entry.origin} raises the same type and message; only the frames above it differ")


def verify(code: str) -> None:
    """Re-run the cell run just before this one (the fix) in a fresh namespace, with
    catalog entry ``code``'s warning made an error, and say whether it runs clean.

    Raises ``AssertionError`` with what still goes wrong. What the fix prints is not
    shown again.
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
                exec(compile(SNIPPET_PRELUDE + source, f"<fix for {code}>", "exec"), {"__name__": "__main__"})
        except Exception as exc:  # noqa: BLE001 - any failure is the verdict
            raise AssertionError(f"the fix for {code} does not run clean in a fresh namespace: "
                                 f"{type(exc).__name__}: {exc}") from exc
    print(f"✓ verified: the fix runs clean on fresh objects, without {code} or any other error "
          f"(re-ran the cell above, from {first.strip()[:60]!r})")
