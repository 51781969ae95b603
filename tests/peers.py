"""Whether a peer library (PEFT, transformers' Inkling) is installed, asked without
importing it.

Every xdist worker imports every test module to collect it, the browser test's worker
too, which never runs a peer's test. A module that needs a peer therefore skips by
``pytestmark = pytest.mark.skipif(not installed(...))`` and imports the peer inside the
tests and helpers that use it, instead of ``pytest.importorskip`` and imports at its
top: PEFT and transformers' Inkling model cost about 4 s of import, once, on the worker
that runs their tests."""
from __future__ import annotations

import importlib.util
from pathlib import Path


def installed(name: str) -> bool:
    """``name`` ("peft", "transformers.models.inkling") is there to import: the top-level
    package is found and holds the dotted rest as a subpackage or module. Nothing is
    imported (``find_spec`` of a dotted name would import its parents)."""
    top, _, rest = name.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not rest:
        return spec is not None
    inner = Path(*rest.split("."))
    return any((Path(where) / inner).is_dir() or (Path(where) / inner.with_suffix(".py")).is_file()
               for where in spec.submodule_search_locations or ())
