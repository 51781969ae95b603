"""One catalog entry: an error (or warning) of the shared-sink LoRA path, as data.

The ``message`` is the one source of the text: raisers format it (``entry.format(n=2)``)
and ``pattern`` is derived from it unless an entry gives its own (messages whose
variable parts are not plain ``{field}`` placeholders).
"""
from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from typing import Any

SNIPPET_PRELUDE = "import torch\nimport inkling_lab as il\n"
"""What every snippet may assume: ``torch`` and ``inkling_lab as il``."""

class UpstreamDefectWarning(UserWarning):
    """Upstream raises nothing here but computes something else than intended (``ISL-W…``)."""


_FIELD = re.compile(r"\{[^{}]*\}")


def pattern_of(template: str) -> str:
    """A regex for every message ``template`` can produce: its literal text, each
    ``{field}`` matching a run of characters on one line."""
    parts = _FIELD.split(template)
    return r"[^\n]*?".join(re.escape(p) for p in parts)


@dataclass(frozen=True, kw_only=True)
class CatalogEntry:
    """One error (or warning) of the shared-sink LoRA path."""

    code: str
    title: str
    exc_type: type[BaseException] | None
    message: str
    pattern: str = ""
    meaning: str
    when: str
    setup: str
    trigger: str
    fix: str
    related: tuple[str, ...] = ()
    origin: str = "sglang 0.5.23"

    def __post_init__(self) -> None:
        if not self.pattern:
            object.__setattr__(self, "pattern", pattern_of(self.message))

    def matches(self, text: str) -> bool:
        return re.search(self.pattern, text) is not None

    def trigger_source(self) -> str:
        """The whole runnable snippet that raises this error."""
        return SNIPPET_PRELUDE + self.setup + self.trigger

    def fix_source(self) -> str:
        """The whole runnable snippet that does the right thing instead."""
        return SNIPPET_PRELUDE + self.setup + self.fix

    def explain(self) -> str:
        """The entry as plain text, in the order a reader needs it."""
        kind = self.exc_type.__name__ if self.exc_type else "warning"
        wrap = lambda s: textwrap.fill(s, 88, initial_indent="  ", subsequent_indent="  ")  # noqa: E731
        parts = [f"{self.code}: {self.title}  [{self.origin}]",
                 f"  {kind}: {self.message}", "", "What it means:", wrap(self.meaning), "",
                 "When it happens:", wrap(self.when), "",
                 "Minimal trigger:", textwrap.indent((self.setup + self.trigger).rstrip(), "    "), "",
                 "Fix:", textwrap.indent((self.setup + self.fix).rstrip(), "    ")]
        if self.related:
            parts += ["", "Related: " + ", ".join(self.related)]
        parts += ["", f"More: il.explain({self.code!r}); notebooks/03_error_walkthroughs.ipynb"]
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.explain()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.explain())


