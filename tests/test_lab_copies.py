"""`make lab`'s working copies (scripts/lab_copies.py): the tracked notebooks are copied
once into lab/, a learner's copy is never overwritten, a notebook changed upstream is
named, and a reset keeps the old copies."""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import lab_copies  # noqa: E402

sys.path.pop(0)


def _course(tmp_path: Path) -> Path:
    source = tmp_path / "notebooks"
    (source / "sub").mkdir(parents=True)
    for name in ("00_a.ipynb", "01_b.ipynb", "sub/x.ipynb"):
        (source / name).write_text(json.dumps({"cells": [], "name": name}))
    return source


def test_copies_once_keeps_the_learners_work_and_names_upstream_changes(tmp_path):
    source, lab = _course(tmp_path), tmp_path / "lab"
    copied, changed = lab_copies.sync(lab, source)
    assert copied == ["00_a.ipynb", "01_b.ipynb", "sub/x.ipynb"] and changed == []
    assert (lab / "sub" / "x.ipynb").read_bytes() == (source / "sub" / "x.ipynb").read_bytes()
    (lab / "00_a.ipynb").write_text("my work")                    # the learner's edit
    (source / "01_b.ipynb").write_text(json.dumps({"cells": [1]}))  # a git pull
    (source / "02_c.ipynb").write_text("{}")                       # a new notebook
    copied, changed = lab_copies.sync(lab, source)
    assert copied == ["02_c.ipynb"] and changed == ["01_b.ipynb"]
    assert (lab / "00_a.ipynb").read_text() == "my work"            # never overwritten
    assert (lab / "01_b.ipynb").read_bytes() != (source / "01_b.ipynb").read_bytes()


def test_reset_moves_the_copies_aside_then_copies_afresh(tmp_path):
    source, lab, backups = _course(tmp_path), tmp_path / "lab", tmp_path / "lab-backups"
    assert lab_copies.reset(lab, backups) is None  # nothing yet
    lab_copies.sync(lab, source)
    (lab / "00_a.ipynb").write_text("my work")
    kept = lab_copies.reset(lab, backups)
    assert kept.parent == backups and (kept / "00_a.ipynb").read_text() == "my work" and not lab.exists()
    lab_copies.sync(lab, source)
    assert (lab / "00_a.ipynb").read_bytes() == (source / "00_a.ipynb").read_bytes()
    assert lab_copies.reset(lab, backups) != kept  # a second reset within the second keeps both


def test_the_copies_and_backups_are_ignored_by_git():
    ignored = (ROOT / ".gitignore").read_text().split()
    assert "/lab/" in ignored and "/lab-backups/" in ignored
