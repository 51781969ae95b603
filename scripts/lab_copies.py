"""The learner's working copies of the course: ``lab/`` (git-ignored), beside ``notebooks/``.

``make lab`` opens these copies, never the tracked notebooks: JupyterLab autosaves,
and a session (Run All, an edited cell) must leave the clone as it was (``git status``
clean), while the learner's own work survives a restart. The copies sit at the same
depth as ``notebooks/``, so every relative path a notebook uses (``../data/...``,
``../docs/reference.md``) reads the same.

    python scripts/lab_copies.py           copy the notebooks lab/ lacks; say which changed since
    python scripts/lab_copies.py --reset   move lab/ aside (lab-backups/<time>/), then fresh copies
    python scripts/lab_copies.py --lab X   the copies in X/ instead (a folder at the top, as the
                                           browser test's own, so that it never touches yours)

A copy is never overwritten: a notebook that changed in ``notebooks/`` since it was
copied (a ``git pull``) is named, with how to get the new version.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import time
from pathlib import Path

from inkling_lab.atomic import atomic_write

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "notebooks"
LAB = REPO / "lab"
BACKUPS = REPO / "lab-backups"
COPIED = ".copied.json"
"""{notebook's path under notebooks/: sha256 of the tracked file when it was copied}."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _notebooks(source: Path) -> list[Path]:
    return sorted(p.relative_to(source) for p in source.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def sync(lab: Path = LAB, source: Path = SOURCE) -> tuple[list[str], list[str]]:
    """Copy every notebook of ``source`` that ``lab`` lacks; returns ``(copied, changed
    in source since copied)``."""
    record_path = lab / COPIED
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    copied, changed = [], []
    for rel in _notebooks(source):
        tracked, target, key = source / rel, lab / rel, rel.as_posix()
        if not target.exists():
            atomic_write(target, tracked.read_bytes(), exclusive=True)
            record[key] = _sha256(tracked)
            copied.append(key)
        elif record.get(key) not in (None, _sha256(tracked)):
            changed.append(key)
    if copied:
        atomic_write(record_path, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
    return copied, changed


def reset(lab: Path = LAB, backups: Path = BACKUPS) -> Path | None:
    """Move ``lab`` to ``lab-backups/<UTC time>/`` (nothing of the learner's is deleted);
    returns where it went (``None`` when there was nothing to move)."""
    if not lab.exists():
        return None
    backups.mkdir(exist_ok=True)
    target = backups / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    while target.exists():  # two resets within a second
        target = target.with_name(target.name + "+")
    shutil.move(str(lab), str(target))
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reset", action="store_true", help="move the copies aside and make fresh ones")
    parser.add_argument("--lab", default=LAB.name, metavar="NAME",
                        help="the copies' folder, at the top of the repository (default: lab)")
    args = parser.parse_args(argv)
    if Path(args.lab).name != args.lab or args.lab in ("", ".", ".."):
        parser.error(f"--lab takes a folder name at the top of the repository (beside notebooks/), "
                     f"not {args.lab!r}: the notebooks' relative paths (../data) must read the same")
    lab = REPO / args.lab
    first = not lab.exists()
    if args.reset:
        moved = reset(lab)
        if moved:
            print(f"your copies are kept in {moved.relative_to(REPO)}/")
        first = True
    copied, changed = sync(lab)
    if first:
        print(f"your working copies of the course are in {args.lab}/ (git ignores it): edit and run them freely; "
              f"your work stays there between sessions. `make lab-reset` starts over.")
    elif copied:
        print(f"new in the course, copied to {args.lab}/: {', '.join(copied)}")
    if changed:
        print(f"changed in notebooks/ since you copied them (your copies are kept): {', '.join(changed)}; "
              f"`make lab-reset` gives fresh copies (and keeps yours in lab-backups/)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
