"""One catalog entry: an error, warning or finding of the shared-sink LoRA path, as data.

The ``message`` is the one source of the text. It is a template: ``{field}``
placeholders (Python identifiers) for the variable parts, everything else literal.
Raisers format it (``catalog.message(code, n=2)``); ``explain`` recognises it by its
literal parts, in order, on one line of the pasted text (linear time, no regex); and
``pattern``, the equivalent regex, is derived from it for readers and tools.
"""
from __future__ import annotations

import re
import string
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SNIPPET_PRELUDE = "import torch\nimport inkling_lab as il\n"
"""What every snippet may assume: ``torch`` and ``inkling_lab as il``."""

DOCTOR_COMMAND = "inkling-lab doctor ADAPTER -n N --hidden H --intermediate F"
"""The first thing to run when an adapter causes an error: N, H and F are the model's
``n_shared_experts``, ``hidden_size`` and one shared expert's intermediate size."""

KINDS = ("error", "warning", "finding", "note")

# Who writes a message (an entry's ``generation``). ``by_upstream`` reads the prefix.
V1 = "sglang 0.5.23, first wrapper generation (InklingBatchDenseMLPWithLoRA)"
V2 = "sglang 0.5.23, second wrapper generation (InklingBatchDenseMLPWithLoRAV2, the dense engine)"
BOTH = "sglang 0.5.23, both wrapper generations"
LOADER = "sglang 0.5.23, the LoRA adapter loader (srt/lora/)"
OTHER_REVISION = ("another sglang revision of srt/models/inkling_common/lora.py (not in the 0.5.23 wheel; "
                  "it circulates in the field)")
KIT = "inkling_lab (the kit's own refusal; sglang 0.5.23 does not raise this)"
KIT_FINDING = "inkling_lab diagnose_pool (a finding; sglang 0.5.23 checks nothing of it)"
KIT_NOTE = "inkling_lab adapter loading (a note; nothing to fix)"
INKLING_LORA = "sglang/srt/models/inkling_common/lora.py"

# The sglang releases that have the shared-sink LoRA wrapper (read from each wheel; the
# table of what each one does is ``inkling_lab.releases``). 0.5.15 has no such file.
RELEASES = ("0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
EVERY_RELEASE = RELEASES
"""An entry raised by every release: its code is the same in all of them (or the kit's own)."""
SINCE_0_5_23 = ("0.5.23",)
"""Code that first appears in 0.5.23 (the second wrapper generation, its loader's new checks)."""


class UpstreamDefectWarning(UserWarning):
    """Upstream raises nothing here but computes something else than intended (``ISL-W…``)."""


@dataclass(frozen=True)
class Finding:
    """One thing found wrong (or worth saying) about a pool or an adapter: its catalog
    ``code``, where (``buffer``: a pool buffer, a file, a module), the catalog's message
    filled in, and how to fix it. Build one with ``catalog.finding(code, where, ...)``.

    ``upstream`` is true where sglang itself raises on it (the five checks of
    ``set_lora_info``, a file sglang cannot load). ``consequence`` says what upstream
    does with it when it does not raise.
    """

    code: str
    buffer: str
    message: str
    fix: str
    upstream: bool = False
    consequence: str = ""

    def __str__(self) -> str:
        head = f"[{self.code}] {self.message}"
        return f"{head}\n    fix: {self.fix}" + (f"\n    upstream: {self.consequence}" if self.consequence else "")


@dataclass(frozen=True)
class Repair:
    """What the kit says instead of refusing, when it repairs what an entry refuses
    (``load_adapter(repair=True)``, ``guess=True``): a note in the entry's own code.
    Each part is a template like the entry's ``message``; the fields of all three are
    filled from one set (``catalog.repair_note(code, where, **fields)``)."""

    message: str
    fix: str
    consequence: str = ""


def fill(code: str, templates: tuple[str, ...], fields: Mapping[str, Any]) -> tuple[str, ...]:
    """Each of ``templates`` filled from ``fields``, which must be exactly the fields
    they name together (a template takes the ones it names)."""
    names = list(dict.fromkeys(f for t in templates for f in template_parts(t)[1]))
    missing = [f for f in names if f not in fields]
    extra = [f for f in fields if f not in names]
    if missing or extra:
        raise TypeError(f"{code} message needs fields {names}; missing {missing}, unexpected {extra}")
    return tuple(t.format(**fields) for t in templates)


def template_parts(template: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(literals, fields)`` of a message template: ``len(literals) == len(fields) + 1``.

    ``{{``/``}}`` are literal braces. Raises ``ValueError`` for a placeholder that is no
    identifier (``{sorted ids}``) or has a format spec: templates name their fields.
    """
    literals, fields = [""], []
    for literal, name, spec, conversion in string.Formatter().parse(template):
        literals[-1] += literal
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ValueError(f"message template field {{{name}}} must be a plain identifier: {template!r}")
        fields.append(name)
        literals.append("")
    return tuple(literals), tuple(fields)


def pattern_of(template: str) -> str:
    """A regex for every message ``template`` can produce: its literal text, each
    ``{field}`` matching a run of characters on one line."""
    return r"[^\n]*?".join(re.escape(p) for p in template_parts(template)[0])


def find_in_line(literals: tuple[str, ...], line: str) -> tuple[int, int] | None:
    """``(start, end)`` of the first place ``line`` reads as the template whose literal
    parts are ``literals`` (fields match anything), or ``None``.

    Each literal is looked for once, left to right, after the previous one: the
    leftmost occurrence of each leaves the most room for the rest, so one pass decides
    it. Linear in ``len(line)`` for each literal; no backtracking.
    """
    pos, start = 0, None
    for literal in literals:
        if not literal:
            continue
        at = line.find(literal, pos)
        if at < 0:
            return None
        if start is None:
            start = at
        pos = at + len(literal)
    return (pos if start is None else start), pos


@dataclass(frozen=True, kw_only=True)
class CatalogEntry:
    """One error (or warning, or diagnosis finding) of the shared-sink LoRA path.

    Required: ``code``, ``title``, ``exc_type`` (``None`` for findings and notes),
    ``message`` (the template), ``meaning``, ``when``, ``setup``/``trigger``/``fix``
    (runnable snippets, ``torch`` and ``il`` imported), ``remedy`` (what to do, in one
    or two sentences, for reports that cannot show a snippet), ``upstream`` (the
    upstream file and function that raises or causes it; for the kit's own refusals,
    what upstream does instead) and ``generation`` (who writes this message:
    ``"sglang 0.5.23, first wrapper generation"``, ``"inkling_lab"``, ...).

    ``frame``: the entry claims the message only inside a traceback whose innermost
    frame is in a shared-sink LoRA file and which passes through one of these functions
    there (for Python's own words, such as an unpacking error, that mean this only
    there). ``adapter_caused``: the usual cause is the adapter, so the first fix is the
    doctor. ``reproduced=False``: the kit never writes this message (another revision's
    words, or a step of sglang the kit does not model); then ``sample`` shows it as
    the field sees it and ``kit_code`` names what the kit raises for the same trigger
    (``""``: nothing). ``doctor_fix``: the way out the doctor's report gives, in the
    command line's words, for a refusal whose message states the problem only.
    ``releases``: the sglang releases (of ``RELEASES``) in which this is raised, like an
    error index marking codes no longer emitted: for sglang's own messages, the releases
    whose code writes them; for the doctor's findings, those whose code causes them;
    for the kit's own refusals, findings and notes, every release (the kit raises them
    whichever release it models); ``()`` for a message of no release (another
    revision's). ``None`` only while an entry is being written: tests refuse it.
    ``group`` is the catalog module the entry lives in (set by the loader).

    The same code may be written in other words where the kit says more than the
    message: ``diagnosis``, ``diagnose_pool``'s words for one of upstream's checks (whose
    message names only the check: the diagnosis names the buffer and its sizes);
    ``repaired``, the note the kit writes when it repairs what the entry refuses;
    ``consequence``, what upstream does with a finding or note that does not stop it
    (the ``Finding``'s ``consequence``). All are templates, like ``message``.
    """

    code: str
    title: str
    exc_type: type[BaseException] | None
    message: str
    meaning: str
    when: str
    setup: str
    trigger: str
    fix: str
    remedy: str
    upstream: str
    generation: str
    kind: str = ""
    frame: tuple[str, ...] = ()
    adapter_caused: bool = False
    reproduced: bool = True
    doctor_fix: str = ""
    kit_code: str = ""
    sample: str = ""
    related: tuple[str, ...] = ()
    releases: tuple[str, ...] | None = None
    group: str = ""
    pattern: str = ""
    diagnosis: str = ""
    repaired: Repair | None = None
    consequence: str = ""

    def __post_init__(self) -> None:
        if not self.kind:  # from the type: a raised warning, an error; a finding or note must say so
            kind = "warning" if isinstance(self.exc_type, type) and issubclass(self.exc_type, Warning) else "error"
            object.__setattr__(self, "kind", kind if self.exc_type is not None else "")
        if self.releases is not None and not set(self.releases) <= set(RELEASES):
            raise ValueError(f"{self.code}: releases must be among {RELEASES}, got {self.releases}")
        if self.kind not in KINDS:
            raise ValueError(f"{self.code}: kind must be one of {KINDS}, got {self.kind!r}")
        literals, fields = template_parts(self.message)
        object.__setattr__(self, "_literals", literals)
        object.__setattr__(self, "fields", fields)
        for other in self.other_templates:  # each names its fields too (raises otherwise)
            template_parts(other)
        if not self.pattern:  # a given pattern is only checked (tests/test_catalog.py), never used
            object.__setattr__(self, "pattern", pattern_of(self.message))

    # -- the message ---------------------------------------------------------------------
    def format(self, **fields: Any) -> str:
        """The message with its fields filled in; exactly the template's fields."""
        return fill(self.code, (self.message,), fields)[0]

    @property
    def other_templates(self) -> tuple[str, ...]:
        """The entry's words beside its message: diagnosis, repair note, consequence."""
        repaired = (self.repaired.message, self.repaired.fix, self.repaired.consequence) if self.repaired else ()
        return tuple(t for t in (self.diagnosis, *repaired, self.consequence) if t)

    def error(self, **fields: Any) -> BaseException:
        """The exception this entry describes, with its message (``raise entry.error(n=2)``)."""
        if self.exc_type is None:
            raise TypeError(f"{self.code} is a {self.kind}, not an exception")
        return self.exc_type(self.format(**fields))

    @property
    def key_literal(self) -> str:
        """The message's longest fixed part: a text without it cannot hold the message."""
        return max(self._literals, key=len)  # type: ignore[attr-defined]

    @property
    def literal_size(self) -> int:
        """How much of a message is fixed text: the more, the more specific the entry."""
        return sum(len(p) for p in self._literals)  # type: ignore[attr-defined]

    def find_in(self, line: str) -> tuple[int, int] | None:
        """Where ``line`` holds this entry's message (see ``find_in_line``)."""
        return find_in_line(self._literals, line)  # type: ignore[attr-defined]

    def matches(self, text: str) -> bool:
        """Whether any line of ``text`` holds the message (ignores ``frame``; use
        ``errors.find_entry`` for the full rule)."""
        return any(self.find_in(line) is not None for line in text.splitlines())

    @property
    def by_upstream(self) -> bool:
        """True when sglang itself raises or warns this (its own words or torch's/Python's
        inside its code), false for the kit's own refusals, findings and notes."""
        return self.generation.startswith("sglang") or self.generation.startswith("another sglang")

    # -- snippets ------------------------------------------------------------------------
    def trigger_source(self) -> str:
        """The whole runnable snippet that raises (or reports) this."""
        return SNIPPET_PRELUDE + self.setup + self.trigger

    def fix_source(self) -> str:
        """The whole runnable snippet that does the right thing instead."""
        return SNIPPET_PRELUDE + self.setup + self.fix

    # -- text ----------------------------------------------------------------------------
    def explain(self) -> str:
        """The entry as plain text, in the order a reader needs it."""
        kind = self.exc_type.__name__ if self.exc_type else self.kind
        wrap = lambda s: textwrap.fill(s, 88, initial_indent="  ", subsequent_indent="  ")  # noqa: E731
        parts = [f"{self.code}: {self.title}  [{self.generation}]",
                 f"  {kind}: {self.message}", "", "What it means:", wrap(self.meaning), "",
                 "When it happens:", wrap(self.when), "", "Where it comes from:", wrap(self.upstream), "",
                 "What to do:"]
        if self.adapter_caused:
            parts.append(f"  With an adapter in hand, run the doctor on it first: {DOCTOR_COMMAND}")
            parts.append("  (N, H, F from the model's config.json: n_shared_experts, hidden_size and one shared "
                         "expert's intermediate size.) It names the tensor at fault and what sglang does with it;")
            parts.append("  inkling-lab export ADAPTER -o OUT with the same -n, --hidden and --intermediate writes a "
                         "copy sglang serves as trained, or says why none can be.")
        parts.append(wrap(self.remedy))
        trigger = "Minimal trigger (in the kit):"
        if not self.reproduced:
            parts += ["", "As the field sees it:", wrap(self.sample)]
            trigger = (f"The same situation in the kit (which raises {self.kit_code} instead):" if self.kit_code
                       else "The same situation in the kit (which raises nothing here):")
        parts += ["", trigger, textwrap.indent((self.setup + self.trigger).rstrip(), "    "), "",
                  "Fix (in the kit):", textwrap.indent((self.setup + self.fix).rstrip(), "    ")]
        if self.related:
            parts += ["", "Related: " + ", ".join(self.related)]
        parts += ["", f"More: il.explain({self.code!r}); notebooks/03_error_walkthroughs.ipynb"]
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.explain()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.explain())
