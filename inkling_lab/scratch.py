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

_root: tuple[int, Path] | None = None
"""(pid, folder) of the process that made the root: a kernel forked from a warm server
after the server made one must make its own, and not remove the server's at its exit
(a fork inherits the exit handler too)."""


def _remove(pid: int, root: Path) -> None:
    if os.getpid() == pid:
        shutil.rmtree(root, ignore_errors=True)


def scratch_folder() -> Path:
    """A new empty folder, removed with everything in it when this Python process exits
    (a kernel shut down or restarted, a script ending). Use it for what a snippet or a
    notebook writes only to read back; keep what you want elsewhere."""
    global _root
    if _root is None or _root[0] != os.getpid() or not _root[1].is_dir():
        _root = (os.getpid(), Path(tempfile.mkdtemp()))
        atexit.register(_remove, *_root)
    return Path(tempfile.mkdtemp(dir=_root[1]))
