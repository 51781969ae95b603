"""Scratch folders for the walkthroughs' snippets and the notebooks: each call a fresh,
empty folder under one root per process, and the root removed when that process exits.

    folder = il.scratch_folder() / "my_adapter"     # save_adapter(..., folder)

``tempfile.mkdtemp()`` in a snippet leaves a folder behind at every run of a notebook;
these go with the kernel. The names keep ``mkdtemp``'s ``tmpXXXXXXXX`` form, which the
notebooks' output sanitizer already replaces.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

_ROOTS: dict[int, Path] = {}
"""This process's root, keyed on its pid: a kernel forked from a warm server after the
server made one must not share it (or remove it at its own exit)."""


def _remove(pid: int) -> None:
    root = _ROOTS.pop(pid, None)
    if root is not None and os.getpid() == pid:
        shutil.rmtree(root, ignore_errors=True)


def scratch_folder() -> Path:
    """A new empty folder, removed with everything in it when this Python process exits
    (a kernel shut down or restarted, a script ending). Use it for what a snippet or a
    notebook writes only to read back; keep what you want elsewhere."""
    pid = os.getpid()
    root = _ROOTS.get(pid)
    if root is None or not root.is_dir():
        root = Path(tempfile.mkdtemp())
        _ROOTS[pid] = root
        atexit.register(_remove, pid)
    return Path(tempfile.mkdtemp(dir=root))
