"""The error catalog: every error the shared-sink LoRA path can raise, explained.

Each entry has a stable code, the exception type, the exact message (a pattern where
it is parametrized), what it means, when it happens, a minimal runnable snippet that
triggers it, a runnable fix and related codes. ``explain`` finds the entry for any
pasted message or exception; ``expect_error`` is the self-checking context manager
for notebooks and tests: it fails loudly when nothing, or something else, is raised.

Codes never change meaning. ``ISL-E…``: upstream's errors (sglang 0.5.23 and its
"V2" wrapper), reproduced by the kit. ``ISL-K…``: the kit's own refusals, where
upstream would fail later or silently. ``ISL-W…``: warnings about behaviour that
raises nothing upstream but computes something else than intended.
"""
from __future__ import annotations

import difflib
import linecache
import sys
import textwrap
import traceback
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

from .catalog import CATALOG, SNIPPET_PRELUDE, CatalogEntry, UpstreamDefectWarning  # noqa: F401  (re-exported)
from .catalog import ENTRIES as _ENTRIES


class NoCatalogEntry(LookupError):
    """``explain`` found no entry for the text it was given."""


def _text_of(message_or_exception: Any) -> str:
    if isinstance(message_or_exception, BaseException):
        exc = message_or_exception
        text = f"{type(exc).__name__}: {exc}"
        cause = exc.__cause__ or exc.__context__
        return text + ("\n" + _text_of(cause) if cause is not None else "")
    return str(message_or_exception)


def find_entry(message_or_exception: Any) -> CatalogEntry | None:
    """The entry whose pattern matches, or ``None`` (no error is raised)."""
    if isinstance(message_or_exception, str) and message_or_exception.strip() in CATALOG:
        return CATALOG[message_or_exception.strip()]
    text = _text_of(message_or_exception)
    for entry in _ENTRIES:
        if entry.matches(text):
            return entry
    return None


def explain(message_or_exception: Any) -> CatalogEntry:
    """The catalog entry for a code (``"ISL-E001"``), a pasted message or traceback,
    or an exception object. Raises ``NoCatalogEntry`` with the closest titles when
    nothing matches."""
    entry = find_entry(message_or_exception)
    if entry is not None:
        return entry
    text = _text_of(message_or_exception).strip()
    candidates = {e.message: e.code for e in _ENTRIES}
    close = difflib.get_close_matches(text[-200:], list(candidates), n=2, cutoff=0.4)
    hint = ("; closest: " + ", ".join(f"{candidates[c]} ({CATALOG[candidates[c]].title})" for c in close)
            if close else "")
    raise NoCatalogEntry(f"no catalog entry matches {text[:120]!r}{hint}. Codes: {', '.join(CATALOG)}")


def format_traceback(exc: BaseException) -> str:
    """A traceback a reader can follow and a notebook can store: library frames by
    package path and function (no machine paths, no line numbers), notebook cells as
    ``<cell>``, other libraries' frames folded."""
    lines = ["Traceback (most recent call last):"]
    folded = 0
    for frame in traceback.extract_tb(exc.__traceback__):
        path = Path(frame.filename)
        if path.name == "errors.py" and "inkling_lab" in path.parts:
            continue  # the demo harness itself
        if "inkling_lab" in path.parts:
            where = "/".join(path.parts[path.parts.index("inkling_lab"):])
        elif frame.filename.startswith("<"):  # a catalog snippet
            where = frame.filename
        elif "ipykernel" in frame.filename:
            where = "<cell>"
        else:
            folded += 1
            continue
        if folded:
            lines.append(f"  ... {folded} frame(s) in other libraries")
            folded = 0
        lines.append(f'  File "{where}", in {frame.name}')
        if frame.line:
            lines.append(f"    {frame.line.strip()}")
    if folded:
        lines.append(f"  ... {folded} frame(s) in other libraries")
    lines.append(f"{type(exc).__name__}: {exc}")
    return "\n".join(lines)


class expect_error:
    """``with expect_error("ISL-E001"): ...`` for error demos and tests.

    Passes only when the block raises exactly that catalog error (its type and its
    message); shows the traceback and the explanation. Fails with ``AssertionError``
    when nothing is raised or another error is: a demo never passes by not raising.
    """

    def __init__(self, code: str, show: bool = True) -> None:
        if code not in CATALOG:
            raise KeyError(f"unknown catalog code {code!r}; codes: {', '.join(CATALOG)}")
        self.entry = CATALOG[code]
        self.show = show
        self.exception: BaseException | None = None

    def __enter__(self) -> "expect_error":
        self._warnings: warnings.catch_warnings | None = None
        if isinstance(self.entry.exc_type, type) and issubclass(self.entry.exc_type, Warning):
            # A warning raises nothing: inside the block it is made an error, so that a
            # warning demo checks itself exactly like an error demo.
            self._warnings = warnings.catch_warnings()
            self._warnings.__enter__()
            warnings.simplefilter("error", self.entry.exc_type)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if self._warnings is not None:
            self._warnings.__exit__(None, None, None)
        code = self.entry.code
        if exc is None:
            raise AssertionError(f"expected {code} ({self.entry.title}), but nothing was raised")
        if not isinstance(exc, Exception):
            return False  # KeyboardInterrupt and friends go through
        got = find_entry(exc)
        if got is None or got.code != code or (self.entry.exc_type and not isinstance(exc, self.entry.exc_type)):
            label = got.code if got else "not in the catalog"
            raise AssertionError(
                f"expected {code} ({self.entry.title}), but got {type(exc).__name__}: {exc} [{label}]") from exc
        self.exception = exc
        if self.show:
            print(format_traceback(exc))
            print()
            print(f"✓ raised as expected: {code}, {self.entry.title}")
            print(textwrap.fill(self.entry.meaning, 88, initial_indent="  ", subsequent_indent="  "))
            print(f"  → fix and more: il.explain({code!r})")
            sys.stdout.flush()
        return True


def _run_snippet(source: str, name: str) -> None:
    # Registered with linecache so that tracebacks show the snippet's own lines.
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    exec(compile(source, name, "exec"), {})


def demonstrate(code: str, show: bool = True) -> None:
    """Walk one entry through: run its trigger (it must raise exactly this error),
    show the traceback and the meaning, then run its fix (it must run clean)."""
    entry = CATALOG[code]
    if show:
        print(f"── {code}: {entry.title} ──")
        print(textwrap.indent((entry.setup + entry.trigger).rstrip(), "  >>> ", lambda _: True))
    with expect_error(code, show=show):
        _run_snippet(entry.trigger_source(), f"<{code} trigger>")
    _run_snippet(entry.fix_source(), f"<{code} fix>")
    if show:
        print("Fix:")
        print(textwrap.indent(entry.fix.rstrip(), "  >>> ", lambda _: True))
        print("✓ the fix runs clean")
