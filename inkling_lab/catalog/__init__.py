"""The error catalog as data: one module of entries per place the errors come from.

Every module in this package (but ``entry``) holds ``ENTRIES: list[CatalogEntry]``;
``CATALOG`` is all of them by code, in module order. Codes are never reused. An
entry's ``group`` is its module's name unless the entry names another.

Raisers take their words from here, so that each message is typed once:
``raise error("ISL-E002", n=n)`` or ``ValueError(message("ISL-E002", n=n))``, and so do
reporters: ``finding("ISL-D103", "gate_up_b", fix=..., two_f=13)``, and so do the
entries' other words: ``diagnosis("ISL-E004", ...)`` (diagnose_pool's words for one of
upstream's checks), ``repair_note("ISL-K206", ...)`` (what the kit repaired instead).
This package imports nothing else of ``inkling_lab``: every module may use it.
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any

from .entry import (BOTH, DOCTOR_COMMAND, EVERY_RELEASE, INKLING_LORA, KIT, KIT_FINDING, KIT_NOTE, LOADER,
                    OTHER_REVISION, RELEASES, SINCE_0_5_23, SNIPPET_PRELUDE, V1, V2, CatalogEntry, Finding, Repair,
                    UpstreamDefectWarning, fill, find_in_line, pattern_of, template_parts)


def _load() -> list[CatalogEntry]:
    entries: list[CatalogEntry] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name == "entry" or info.name.startswith("_"):
            continue
        for e in importlib.import_module(f"{__name__}.{info.name}").ENTRIES:
            entries.append(e if e.group else dataclasses.replace(e, group=info.name))
    codes = [e.code for e in entries]
    dupes = sorted({c for c in codes if codes.count(c) > 1})
    if dupes:
        raise RuntimeError(f"catalog codes defined twice: {dupes}")
    return entries


ENTRIES: list[CatalogEntry] = _load()
CATALOG: dict[str, CatalogEntry] = {e.code: e for e in ENTRIES}

_READING_ORDER = ("set_lora_info", "refresh", "eligibility", "v2", "tp", "loader", "forward", "warnings",
                  "diagnose", "adapter_files", "normalize")


def _groups() -> dict[str, str]:
    names = list(dict.fromkeys(e.group for e in ENTRIES))
    names.sort(key=lambda g: (_READING_ORDER.index(g) if g in _READING_ORDER else len(_READING_ORDER), g))
    docs = {}
    for g in names:
        try:
            doc = importlib.import_module(f"{__name__}.{g}").__doc__ or g
        except ImportError:  # a group named by its entries, not by a module
            doc = g
        docs[g] = " ".join(doc.split("\n\n")[0].split())
    return docs


GROUPS: dict[str, str] = _groups()
"""Every group, in reading order (where the errors come from, first to last on sglang's
path), with its one-paragraph description: the map of notebook 03."""


def message(code: str, **fields: Any) -> str:
    """The message of catalog entry ``code`` with its ``{field}`` placeholders filled."""
    return CATALOG[code].format(**fields)


def error(code: str, **fields: Any) -> BaseException:
    """The exception of catalog entry ``code``, its message filled: ``raise error(...)``."""
    return CATALOG[code].error(**fields)


def finding(code: str, where: str, /, *, fix: str | None = None, consequence: str | None = None,
            upstream: bool = False, more: bool = False, **fields: Any) -> Finding:
    """The ``Finding`` of catalog entry ``code`` at ``where``, its message (and its
    ``consequence``) filled from ``fields``. ``fix``: the way out for this case (default:
    the entry's ``remedy``); ``consequence``: what upstream does with it (default: the
    entry's); ``more``: point the fix at ``inkling-lab explain CODE``."""
    entry = CATALOG[code]
    fix = entry.remedy if fix is None else fix
    if more:
        fix += f" (more: inkling-lab explain {code})"
    if consequence is None:
        text, consequence = fill(code, (entry.message, entry.consequence), fields)
    else:
        text = entry.format(**fields)
    return Finding(code, where, text, fix, upstream, consequence)


def diagnosis(code: str, where: str, /, *, fix: str, **fields: Any) -> Finding:
    """``diagnose_pool``'s finding for upstream's check ``code`` (which sglang raises on):
    the entry's ``diagnosis`` filled from ``fields`` (the buffer and its sizes), and the
    ``fix`` the diagnosis computed."""
    return Finding(code, where, fill(code, (CATALOG[code].diagnosis,), fields)[0], fix, True)


def repair_note(code: str, where: str, /, **fields: Any) -> Finding:
    """The note of catalog entry ``code`` when the kit repairs what the entry refuses:
    its ``repaired`` message, fix and consequence filled from ``fields``."""
    repaired = CATALOG[code].repaired
    if repaired is None:
        raise KeyError(f"{code} has no repair note: the kit refuses it, it does not repair it")
    message, fix, consequence = fill(code, (repaired.message, repaired.fix, repaired.consequence), fields)
    return Finding(code, where, message, fix, False, consequence)


__all__ = ["BOTH", "CATALOG", "DOCTOR_COMMAND", "ENTRIES", "EVERY_RELEASE", "GROUPS", "INKLING_LORA", "KIT",
           "KIT_FINDING", "KIT_NOTE", "LOADER", "OTHER_REVISION", "RELEASES", "SINCE_0_5_23", "SNIPPET_PRELUDE",
           "V1", "V2", "CatalogEntry", "Finding", "Repair", "UpstreamDefectWarning", "diagnosis", "error", "fill",
           "find_in_line", "finding", "message", "pattern_of", "repair_note", "template_parts"]
