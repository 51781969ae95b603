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
import math
import re
import sys
import textwrap
import traceback
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any, Iterator

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
    """``explain`` found no entry for the text it was given; ``closest`` holds the
    nearest entries, as ``[(entry, why), ...]`` (empty: no shared-sink LoRA error), and
    ``headline`` what was not found, in one sentence."""

    closest: list[tuple[CatalogEntry, str]] = []
    headline: str = ""


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


def _exception_text(exc: BaseException, alone: bool = False) -> str:
    """``exc`` as Python prints it: its chain (``alone``: ``exc`` only), each traceback's
    innermost frames and its ``Type: message`` line."""
    lines = []
    for link in [exc] if alone else exception_chain(exc):
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
    """``(entry or None, cut)``: the entry for a code (any case, ``ISL-`` optional), a
    pasted message or traceback, an unambiguous fragment of a message's fixed text
    (``"requires four 4D"``), or an exception; ``cut`` when only the last ``READ_LIMIT``
    characters were read.

    The rule: the last line of the text that holds a catalogued message decides (in a
    traceback, the error raised last). On that line: errors and warnings before findings
    and notes; then an entry whose ``frame`` rule holds (it counts only on the error line
    of a traceback whose innermost frame is in a shared-sink file and which passes
    through that function there: the more specific reading of Python's or torch's
    words); then an entry whose exception type the line names just before the message;
    then the message with the most fixed text. One pass over the lines, ``str.find`` per
    entry and literal: linear in the text. Only a text that holds no whole message is
    read as a fragment (``FRAGMENT_SIZES``): one line, found, in any case, inside the
    fixed text of exactly one entry's message.
    """
    code = _as_code(message_or_exception)
    if code is not None:
        return CATALOG[code], False
    if isinstance(message_or_exception, BaseException):
        # the chain object itself, outermost first (the error raised last decides, as in a pasted traceback),
        # every link however deep: a shared-sink error at the root of 2000 wrappers is still found
        for link in _links(message_or_exception):
            entry = _read_lines(_bounded(_exception_text(link, alone=True))[0])
            if entry is not None:
                return entry, False
        return None, False
    text, cut = _text_of(message_or_exception)
    best = _read_lines(text)
    if best is None and isinstance(message_or_exception, str):
        holding = _holding_fragment(text)
        return (holding[0] if len(holding) == 1 else None), cut
    return best, cut


def _links(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then the exceptions behind it (``__cause__``, else ``__context__``, as
    Python prints them), then those an exception group holds (``ExceptionGroup.exceptions``,
    what ``asyncio.TaskGroup`` and ``concurrent`` runners raise), every one once:
    iterative, a cycle ends the walk."""
    seen: set[int] = set()
    groups: list[BaseException] = []
    while True:
        while exc is not None and id(exc) not in seen:
            seen.add(id(exc))
            yield exc
            if isinstance(exc, BaseExceptionGroup):
                groups.extend(reversed(exc.exceptions))
            exc = exc.__cause__ if exc.__cause__ is not None else (
                None if exc.__suppress_context__ else exc.__context__)
        if not groups:
            return
        exc = groups.pop()


def _read_lines(text: str) -> CatalogEntry | None:
    """The entry of the last line of ``text`` that holds a catalogued message (``lookup``'s rule)."""
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
    return best[1] if best else None


_CODE = re.compile(r"\s*(?:ISL-?)?([EKWDN]\d{3})\s*", re.IGNORECASE)

FRAGMENT_SIZES = (8, 200)
"""A pasted text is read as a fragment of a message when it is one line of this many
characters (from, to): shorter ones ("LoRA") name no entry."""

_WORD = re.compile(r"[a-z][a-z0-9_]*(?:-[a-z0-9_]+)*")
_SINK_WORDS = ("lora", "inkling", "shared-sink", "shared_expert", "sink", "expert", "adapter", "gate", "down_proj", "up_proj",
               "rank", "slot", "pool", "buffer", "peft", "sglang", "safetensors", "w13", "w2", "target_module",
               "alpha", "dora", "rslora", "set_lora_info", "tp_rank", "tensor-parallel")
"""Word stems of the shared-sink LoRA path: a message without one of them ("CUDA out of
memory") is no error of it, and gets no "closest" entry."""
_COMMON = frozenset("""a an and are as at be but by can does every for from given got has have holds if in
into is it its more must no not of on one only or other the than that this to use was when which with
without""".split())
_FIELD = re.compile(r"\{\w+\}")
_TELLING = math.log(8)
"""A word tells entries apart when at most one in eight messages uses it: "lora" does not."""


def _as_code(message_or_exception: Any) -> str | None:
    """The catalog code a text names, in any case and with or without ``ISL-``."""
    if not isinstance(message_or_exception, str):
        return None
    named = _CODE.fullmatch(message_or_exception)
    code = f"ISL-{named.group(1).upper()}" if named else None
    return code if code in CATALOG else None


def _squash(text: str) -> str:
    return " ".join(text.lower().split())


def _holding_fragment(text: str) -> list[CatalogEntry]:
    """The entries whose message's fixed text holds ``text`` (one line of
    ``FRAGMENT_SIZES`` characters, any case, any spacing)."""
    fragment = _squash(text)
    if "\n" in text.strip() or not FRAGMENT_SIZES[0] <= len(fragment) <= FRAGMENT_SIZES[1]:
        return []
    return [e for e in _ENTRIES if any(fragment in _squash(part) for part in e._literals)]  # type: ignore[attr-defined]


def _error_line(text: str) -> str:
    """The line of a pasted text that says what went wrong: its last line that is no
    traceback frame (or source line under one)."""
    lines = [line for line in text.splitlines() if line.strip() and not line[:1].isspace()
             and not line.startswith("Traceback (most recent call last)")]
    return lines[-1].strip() if lines else text.strip()


def _words(text: str) -> dict[str, None]:
    """The words of ``text`` that may tell entries apart, in their order."""
    return dict.fromkeys(w for w in _WORD.findall(text.lower()) if len(w) > 2 and w not in _COMMON)


def _is_about_the_sink(words: dict[str, None]) -> bool:
    return any(w.startswith(stem) for w in words for stem in _SINK_WORDS)


def closest(text: str, count: int = 3) -> list[tuple[CatalogEntry, str]]:
    """Up to ``count`` entries nearest to an error line no entry matches, each with why:
    ``[(entry, "it also says 'rank', 'match'"), ...]``; ``[]`` for a text that is no
    shared-sink LoRA error (neither its line nor its frames name anything of the sink,
    its adapters or its pool), or whose line shares no telling word with any entry.

    Near means: words the line shares with the entry's message and title, each counted
    by how few entries use it (``shared-sink`` is in most messages and counts little).
    A fragment that several messages hold names those entries first.
    """
    line = _error_line(text)
    holding = _holding_fragment(line)
    if holding:
        return [(e, f"its message holds {line.strip()!r}") for e in holding[:count]]
    words = _words(line)
    if not _is_about_the_sink(_words(text)):  # frames count: a traceback through sglang's LoRA code is one
        return []
    vocab = {e.code: _words(_FIELD.sub(" ", f"{e.message} {e.title}")) for e in _ENTRIES}
    used = {w: sum(w in v for v in vocab.values()) for w in words}
    weight = {w: math.log(len(_ENTRIES) / n) for w, n in used.items() if n}
    scored = []
    for entry in _ENTRIES:
        shared = [w for w in weight if w in vocab[entry.code]]
        telling = [w for w in shared if weight[w] >= _TELLING]
        if telling:  # the words every message has make no entry near
            scored.append((sum(weight[w] for w in shared), entry, telling))
    scored.sort(key=lambda s: (-s[0], s[1].code))
    return [(entry, "it also says " + ", ".join(repr(w) for w in telling[:4]))
            for score, entry, telling in scored[:count] if score >= 0.6 * scored[0][0]]


def find_entry(message_or_exception: Any) -> CatalogEntry | None:
    """The entry for a code, a pasted message or traceback, or an exception; ``None``
    when nothing matches (see ``lookup`` for the rule)."""
    return lookup(message_or_exception)[0]


def explain(message_or_exception: Any) -> CatalogEntry:
    """The catalog entry for a code (``"ISL-E001"``, ``"isl-e001"``), a pasted message,
    traceback or unambiguous fragment of a message, or an exception object. Raises
    ``NoCatalogEntry`` when nothing matches: its ``closest`` holds the nearest entries
    with why (none for a text that is no shared-sink LoRA error). Reads at most the
    last ``READ_LIMIT`` characters."""
    entry, cut = lookup(message_or_exception)
    if entry is not None:
        return entry
    text = _text_of(message_or_exception)[0]
    line = _error_line(text)
    near = closest(text)
    note = f" (only the last {READ_LIMIT // 1024} KiB of a longer text were read)" if cut else ""
    if near or _is_about_the_sink(_words(text)):
        headline = f"no catalog entry matches {line[-120:]!r}{note}"
        said = headline + ("; closest: " + "; ".join(f"{e.code} ({e.title}: {why})" for e, why in near) if near
                           else "; none is near it")
    else:
        headline = said = (f"{line[-120:]!r} is not a shared-sink LoRA error{note}: it names nothing of the shared "
                           "sink, its LoRA adapters or its pool, so no catalog entry applies")
    error = NoCatalogEntry(f"{said}. Every entry: inkling-lab explain --list")
    error.headline, error.closest = headline, near
    raise error


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
