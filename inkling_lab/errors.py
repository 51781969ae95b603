"""The error catalog at work: ``explain`` a code, a pasted message or traceback, or an
exception; ``expect_error`` and ``demonstrate`` for self-checking demos.

The entries themselves are data, in ``inkling_lab.catalog`` (one module per place the
errors come from). Codes never change meaning. ``ISL-E…``: sglang's errors (both
wrapper generations of 0.5.23, its adapter loader, another revision's words), the kit
raising the same type and message. ``ISL-K…``: the kit's own refusals (each says what
sglang does instead). ``ISL-W…``: warnings (sglang raises nothing but serves something
else). ``ISL-D…``: ``diagnose_pool`` findings. ``ISL-N…``: notes of adapter loading.
"""
from __future__ import annotations

import ast
import difflib
import linecache
import re
import sys
import textwrap
import traceback
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

from .catalog import CATALOG, SNIPPET_PRELUDE, CatalogEntry, UpstreamDefectWarning  # noqa: F401  (re-exported)
from .catalog import ENTRIES as _ENTRIES

READ_LIMIT = 64 * 1024
"""``explain`` reads at most the last this many characters of a pasted text (the error
is at the end of a traceback); longer texts are cut, and the answer says so."""

CHAIN_LIMIT = 64
"""At most this many exceptions of a ``__cause__``/``__context__`` chain are read."""

_FRAME_LINE = re.compile(r'\s*File "([^"\n]{0,4096})"(?:, line \d+)?, in (\S{1,200})\s*$')
_TYPE_BEFORE = re.compile(r"([A-Za-z_][\w.]{0,200}(?:Error|Exception|Warning|Exit|Interrupt)): $")
_SINK_FILES = ("inkling_common/lora.py", "inkling_lab/lora.py", "inkling_lab/validate.py")
"""sglang's shared-sink LoRA file, and the kit's two files that reproduce it."""


class NoCatalogEntry(LookupError):
    """``explain`` found no entry for the text it was given."""


def exception_chain(exc: BaseException, limit: int = CHAIN_LIMIT) -> list[BaseException]:
    """``exc`` and the exceptions behind it (``__cause__``, else ``__context__``), the
    outermost last, as Python prints them. Iterative: a cycle or a chain thousands
    deep is cut (at ``limit`` exceptions), never recursed into."""
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen and len(chain) < limit:
        seen.add(id(exc))
        chain.append(exc)
        # as Python prints them: the cause, else the context unless ``raise ... from None``
        exc = exc.__cause__ if exc.__cause__ is not None else (
            None if exc.__suppress_context__ else exc.__context__)
    return chain[::-1]


def _exception_text(exc: BaseException) -> str:
    lines = []
    for link in exception_chain(exc):
        lines.append("Traceback (most recent call last):")
        # the innermost frames decide (the frame rule), so those are the ones kept
        lines += [f'  File "{f.filename}", line {f.lineno}, in {f.name}'
                  for f in traceback.extract_tb(link.__traceback__, limit=-CHAIN_LIMIT)]
        try:
            said = str(link)
        except Exception:  # noqa: BLE001 - an exception whose __str__ fails still has a type
            said = "<unprintable>"
        lines.append(f"{type(link).__name__}: {said}")
    return "\n".join(lines)


def _bounded(text: str) -> tuple[str, bool]:
    if len(text) <= READ_LIMIT:
        return text, False
    return text[-READ_LIMIT:], True


def _text_of(message_or_exception: Any) -> tuple[str, bool]:
    """The text to read, at most ``READ_LIMIT`` characters (and whether it was cut)."""
    if isinstance(message_or_exception, BaseException):
        return _bounded(_exception_text(message_or_exception))
    return _bounded(str(message_or_exception))


def _in_sink_frame(frames: list[tuple[str, str]], functions: tuple[str, ...]) -> bool:
    """The rule for Python's own words (an unpacking error): the innermost frame is in a
    shared-sink LoRA file (``_SINK_FILES``) and the traceback passes through one of
    ``functions`` in such a file."""
    def sink(path: str) -> bool:
        path = path.replace("\\", "/")
        return any(s in path for s in _SINK_FILES)

    return bool(frames) and sink(frames[-1][0]) and any(sink(p) and f in functions for p, f in frames)


def _type_score(entry: CatalogEntry, line: str, start: int) -> int:
    """2: the line names this entry's exception type just before the message; 1: it names
    none and the entry is a warning (logged, not raised); 0 otherwise."""
    named = _TYPE_BEFORE.search(line[max(0, start - 200):start])
    if named is None:
        return 1 if entry.kind == "warning" else 0
    name = named.group(1).rsplit(".", 1)[-1]
    return 2 if entry.exc_type is not None and entry.exc_type.__name__ == name else 0


def lookup(message_or_exception: Any) -> tuple[CatalogEntry | None, bool]:
    """``(entry or None, cut)``: the entry for a code, a pasted message or traceback, or
    an exception; ``cut`` when only the last ``READ_LIMIT`` characters were read.

    The rule: the last line of the text that holds a catalogued message decides (in a
    traceback, the error raised last). On that line: errors and warnings before findings
    and notes; then an entry whose ``frame`` rule holds (it counts only on the error line
    of a traceback whose innermost frame is in a shared-sink file and which passes
    through that function there: the more specific reading of Python's or torch's
    words); then an entry whose exception type the line names just before the message;
    then the message with the most fixed text. One pass over the lines, ``str.find`` per
    entry and literal: linear in the text.
    """
    if isinstance(message_or_exception, str) and message_or_exception.strip() in CATALOG:
        return CATALOG[message_or_exception.strip()], False
    text, cut = _text_of(message_or_exception)
    # one pass per entry over the whole text leaves the few entries worth trying per line
    candidates = [e for e in _ENTRIES if e.key_literal in text]
    frames: list[tuple[str, str]] = []
    best: tuple[tuple[bool, bool, int, int], CatalogEntry] | None = None
    for line in text.splitlines():
        if line.startswith("Traceback (most recent call last)"):
            frames = []
            continue
        frame = _FRAME_LINE.match(line) if line.lstrip().startswith("File ") else None
        if frame is not None:
            frames.append((frame.group(1), frame.group(2)))
            continue
        on_line = None
        for entry in candidates:
            where = entry.find_in(line)
            if where is None or (entry.frame and not _in_sink_frame(frames, entry.frame)):
                continue
            # errors and warnings before findings and notes (those are reports, not raised);
            # an entry whose frame rule holds is the more specific reading of the same words
            score = (entry.kind in ("error", "warning"), bool(entry.frame), _type_score(entry, line, where[0]),
                     entry.literal_size)
            if on_line is None or score > on_line[0]:
                on_line = (score, entry)
        if on_line is not None:
            best = on_line
        if not line[:1].isspace():
            frames = []  # the error line closes its traceback: later lines have no frames
    return (best[1] if best else None), cut


def find_entry(message_or_exception: Any) -> CatalogEntry | None:
    """The entry for a code, a pasted message or traceback, or an exception; ``None``
    when nothing matches (see ``lookup`` for the rule)."""
    return lookup(message_or_exception)[0]


def explain(message_or_exception: Any) -> CatalogEntry:
    """The catalog entry for a code (``"ISL-E001"``), a pasted message or traceback,
    or an exception object. Raises ``NoCatalogEntry`` with the closest titles when
    nothing matches. Reads at most the last ``READ_LIMIT`` characters."""
    entry, cut = lookup(message_or_exception)
    if entry is not None:
        return entry
    text = _text_of(message_or_exception)[0].strip()
    tail = text[-200:]
    candidates = {e.message: e.code for e in _ENTRIES}
    close = difflib.get_close_matches(tail, list(candidates), n=2, cutoff=0.4)
    hint = ("; closest: " + ", ".join(f"{candidates[c]} ({CATALOG[candidates[c]].title})" for c in close)
            if close else "")
    note = f" (only the last {READ_LIMIT // 1024} KiB of a longer text were read)" if cut else ""
    raise NoCatalogEntry(f"no catalog entry matches {tail[-120:]!r}{note}{hint}. Codes: {', '.join(CATALOG)}")


def read_pasted(stream: Any, limit: int = READ_LIMIT) -> tuple[str, str]:
    """Read a pasted text from ``stream`` (e.g. stdin) keeping only its last ``limit``
    characters, in chunks, so that a huge log needs no more memory than that.
    Returns ``(text, note)``; ``note`` is ``""`` unless the text was cut."""
    tail, total = "", 0
    while True:
        chunk = stream.read(1 << 16)
        if not chunk:
            break
        total += len(chunk)
        tail = (tail + chunk)[-limit:]
    note = f"(read the last {len(tail)} of {total} characters)" if total > len(tail) else ""
    return tail, note


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


def _run_snippet(source: str, name: str) -> Any:
    """Run a snippet like a notebook cell: the value of its last line when that is an
    expression (``None`` otherwise). Registered with linecache so that tracebacks show
    the snippet's own lines."""
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    tree = ast.parse(source, name)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    scope: dict[str, Any] = {}
    exec(compile(tree, name, "exec"), scope)
    return eval(compile(ast.Expression(last.value), name, "eval"), scope) if last is not None else None


def codes_of(result: Any) -> list[str]:
    """The finding codes of what a finding snippet's last line gives: a ``Diagnosis``
    (``.codes``), anything with ``.findings``, or a list of findings."""
    if hasattr(result, "codes"):
        return list(result.codes)
    found = getattr(result, "findings", result)
    return [f.code for f in found] if isinstance(found, (list, tuple)) else []


def expect_finding(code: str, result: Any, show: bool = True) -> Any:
    """The ``expect_error`` of findings and notes (``ISL-D…``, ``ISL-N…``): ``result``
    (a ``Diagnosis``, an adapter, a list of findings) must report ``code``; fails with
    ``AssertionError`` otherwise. Returns ``result``, so a notebook cell can show it."""
    entry = CATALOG[code]
    got = codes_of(result)
    if code not in got:
        raise AssertionError(f"expected finding {code} ({entry.title}), but it reports {got or 'nothing'}")
    if show:
        print(f"✓ reported as expected: {code}, {entry.title}")
        print(textwrap.fill(entry.meaning, 88, initial_indent="  ", subsequent_indent="  "))
        print(f"  → fix and more: il.explain({code!r})")
    return result


def demonstrate(code: str, show: bool = True) -> None:
    """Walk one entry through: run its trigger (it must raise exactly this error, or
    report this finding), show the traceback and the meaning, then run its fix (it must
    run clean, and report no such finding).

    For a message the kit does not write itself (``reproduced=False``) the trigger must
    raise what the kit raises instead (``kit_code``) or nothing, and the entry's
    ``sample`` (the message as the field sees it) must be explained as this entry."""
    entry = CATALOG[code]
    if show:
        print(f"── {code}: {entry.title} ──")
        print(textwrap.indent((entry.setup + entry.trigger).rstrip(), "  >>> ", lambda _: True))
    if not entry.reproduced:
        if entry.kit_code:
            with expect_error(entry.kit_code, show=show):
                _run_snippet(entry.trigger_source(), f"<{code} trigger>")
        else:
            _run_snippet(entry.trigger_source(), f"<{code} trigger>")
        if find_entry(entry.sample) is not entry:
            raise AssertionError(f"{code}: its sample is not explained as {code}: {entry.sample!r}")
        if show:
            print(f"The kit {'raises ' + entry.kit_code if entry.kit_code else 'raises nothing'} here; "
                  f"{entry.generation} says:\n  {entry.sample}")
    elif entry.kind in ("finding", "note"):
        expect_finding(code, _run_snippet(entry.trigger_source(), f"<{code} trigger>"), show=show)
    else:
        with expect_error(code, show=show):
            _run_snippet(entry.trigger_source(), f"<{code} trigger>")
    fixed = _run_snippet(entry.fix_source(), f"<{code} fix>")
    if entry.kind in ("finding", "note") and code in codes_of(fixed):
        raise AssertionError(f"{code}: the fix still reports {code}")
    if show:
        print("Fix:")
        print(textwrap.indent(entry.fix.rstrip(), "  >>> ", lambda _: True))
        print("✓ the fix runs clean")
