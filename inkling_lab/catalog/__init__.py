"""The error catalog as data: one module of entries per place the errors come from.

Every module in this package (but ``entry``) holds ``ENTRIES: list[CatalogEntry]``;
``CATALOG`` is all of them by code, in module order. Codes are never reused.
"""
from __future__ import annotations

import importlib
import pkgutil

from .entry import SNIPPET_PRELUDE, CatalogEntry, UpstreamDefectWarning, pattern_of


def _load() -> list[CatalogEntry]:
    entries: list[CatalogEntry] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name == "entry":
            continue
        entries += importlib.import_module(f"{__name__}.{info.name}").ENTRIES
    codes = [e.code for e in entries]
    dupes = sorted({c for c in codes if codes.count(c) > 1})
    if dupes:
        raise RuntimeError(f"catalog codes defined twice: {dupes}")
    return entries


ENTRIES: list[CatalogEntry] = _load()
CATALOG: dict[str, CatalogEntry] = {e.code: e for e in ENTRIES}

__all__ = ["CATALOG", "ENTRIES", "SNIPPET_PRELUDE", "CatalogEntry", "UpstreamDefectWarning", "pattern_of"]
