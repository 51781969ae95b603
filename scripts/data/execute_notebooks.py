"""Execute notebooks in place, so that their committed outputs are what the code gives today.

Like ``jupyter nbconvert --execute --inplace``, except that

* without CUDA the cells tagged ``gpu`` are left unrun (no outputs, no execution count:
  nbval then compares nothing for them and the test run skips them);
* no widget state is stored (no ``widgets`` metadata, no widget views with fresh model
  ids): a re-run, or a save in JupyterLab, changes no byte that the code did not change;
* tracebacks show paths relative to the repository, and a temporary folder a cell made
  reads ``<tmp>`` in every output (no machine paths in committed files; the test run's
  sanitizer, ``tests/nbval_sanitize.cfg``, writes a fresh run's temporary folders the same way);
* the file is replaced atomically.

    .venv/bin/python scripts/data/execute_notebooks.py notebooks/*.ipynb      (= make notebooks)
"""
from __future__ import annotations

import re
import site
import sys
from pathlib import Path

import nbformat
import torch
from nbclient import NotebookClient

from inkling_lab.atomic import atomic_write

REPO = Path(__file__).resolve().parents[2]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# Longest first, so that a venv inside the repository reads as <site-packages>, not .venv/...
_MACHINE_PATHS = sorted({*site.getsitepackages(), str(REPO)}, key=len, reverse=True)
# tempfile's folders (tmpXXXXXXXX) wherever the temporary directory lives; the same pattern as the sanitizer's.
_TEMP_FOLDER = re.compile(r"(?:(?:/[\w.-]+)*/)?\btmp[a-z0-9_]{8}\b")


def _without_machine_paths(text: str) -> str:
    for path in _MACHINE_PATHS:
        text = text.replace(path + "/", "" if path == str(REPO) else "<site-packages>/")
    return _TEMP_FOLDER.sub("<tmp>", text)


def _clean_outputs(cell) -> None:
    """Drop widget views (their model ids are new on every run and their state is not
    kept) and machine paths in text."""
    kept = []
    for output in cell.outputs:
        data = output.get("data", {})
        if WIDGET_VIEW in data:
            continue
        if output.output_type == "error":
            output.traceback = [_without_machine_paths(line) for line in output.traceback]
            output.evalue = _without_machine_paths(output.evalue)
        elif output.output_type == "stream":
            output.text = _without_machine_paths(output.text)
        elif "text/plain" in data:
            data["text/plain"] = _without_machine_paths(data["text/plain"])
        kept.append(output)
    cell.outputs = kept


def execute(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    # No timing metadata: a re-run that changes no output changes no byte of the file.
    client = NotebookClient(nb, timeout=600, kernel_name="python3", record_timing=False, coalesce_streams=True,
                            resources={"metadata": {"path": str(path.parent)}})
    skip_gpu = not torch.cuda.is_available()
    skipped = 0
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            cell.metadata.pop("execution", None)
            if skip_gpu and "gpu" in cell.metadata.get("tags", []):
                cell.outputs, cell.execution_count = [], None
                skipped += 1
                continue
            client.execute_cell(cell, index)
            _clean_outputs(cell)
    nb.metadata.pop("widgets", None)
    atomic_write(path, (nbformat.writes(nb) + "\n").encode())
    print(f"{path}: executed" + (f", {skipped} gpu cell(s) left unrun (no CUDA)" if skipped else ""))


if __name__ == "__main__":
    for name in sys.argv[1:]:
        execute(Path(name))
