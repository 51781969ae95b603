"""Scratch folders: fresh, empty, and gone when their process exits; none of the
catalog's snippets or the notebooks leaves a ``mkdtemp`` folder behind."""
import json
import os
import subprocess
import sys
from pathlib import Path

import inkling_lab as il
from inkling_lab.errors import CATALOG

SCRATCH = Path(il.__file__).parent / "scratch.py"
ROOT = Path(__file__).resolve().parents[1]

# The module by its file (it imports the standard library only), so that a child
# process need not import torch with the package.
_LOAD = ("import importlib.util, sys\n"
         f"spec = importlib.util.spec_from_file_location('scratch', {str(SCRATCH)!r})\n"
         "scratch = importlib.util.module_from_spec(spec); spec.loader.exec_module(scratch)\n")


def _run(body: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    return subprocess.run([sys.executable, "-c", _LOAD + body], env=env, capture_output=True, text=True,
                          timeout=120, check=True)


def test_each_call_is_a_new_empty_folder_under_one_root():
    a, b = il.scratch_folder(), il.scratch_folder()
    assert a != b and a.is_dir() and b.is_dir()
    assert list(a.iterdir()) == [] and a.parent == b.parent
    (a / "x.bin").write_bytes(b"1")
    assert list(b.iterdir()) == []


def test_the_folders_and_what_they_hold_are_gone_when_the_process_exits(tmp_path):
    out = _run("import json\n"
               "a = scratch.scratch_folder(); (a / 'adapter').mkdir(); (a / 'adapter' / 'w.bin').write_bytes(b'1')\n"
               "b = scratch.scratch_folder()\n"
               "print(json.dumps([str(a), str(b)]))\n", tmp_path)
    a, b = map(Path, json.loads(out.stdout))
    assert a.parent.parent == tmp_path  # under TMPDIR, as mkdtemp's are
    assert not a.exists() and not b.exists()
    assert list(tmp_path.iterdir()) == []


def test_a_forked_child_has_its_own_root_and_leaves_its_parents(tmp_path):
    # A warm kernel is a fork of a server: the child's exit must not remove the server's folders.
    out = _run("import json, os\n"
               "parent = scratch.scratch_folder()\n"
               "r, w = os.pipe()\n"
               "pid = os.fork()\n"
               "if pid == 0:\n"
               "    os.close(r); child = scratch.scratch_folder()\n"
               "    os.write(w, str(child).encode()); os.close(w)\n"
               "    sys.exit(0)  # a normal exit: atexit runs in the child\n"
               "os.close(w); child = os.read(r, 4096).decode(); os.waitpid(pid, 0)\n"
               "print(json.dumps([str(parent), child, parent.is_dir(), os.path.exists(child)]))\n", tmp_path)
    parent, child, parent_kept, child_kept = json.loads(out.stdout)
    assert Path(parent).parent != Path(child).parent
    assert parent_kept and not child_kept
    assert not Path(parent).exists()  # and the parent's went with the parent


def test_no_snippet_or_notebook_makes_a_temporary_folder_it_never_removes():
    for code, entry in CATALOG.items():
        for part in (entry.setup, entry.trigger, entry.fix):
            assert "mkdtemp" not in part, code
    for notebook in sorted((ROOT / "notebooks").rglob("*.ipynb")):
        cells = json.loads(notebook.read_text())["cells"]
        assert not any("mkdtemp" in "".join(c["source"]) for c in cells), notebook.name
