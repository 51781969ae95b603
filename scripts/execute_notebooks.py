"""Execute notebooks in place, so that their committed outputs are what the code gives today.

Like ``jupyter nbconvert --execute --inplace``, except that

* without CUDA the cells tagged ``gpu`` are left unrun (no outputs, no execution count:
  nbval then compares nothing for them and the test run skips them);
* no widget state is stored (no ``widgets`` metadata, no widget views with fresh model
  ids): a re-run, or a save in JupyterLab, changes no byte that the code did not change;
* tracebacks of cells tagged ``raises-exception`` show paths relative to the repository
  (no machine paths in committed files);
* the file is replaced atomically.

    .venv/bin/python scripts/execute_notebooks.py notebooks/*.ipynb      (= make notebooks)
"""
from __future__ import annotations

import site
import sys
from pathlib import Path

import nbformat
import torch
from nbclient import NotebookClient

from inkling_lab.atomic import atomic_write

REPO = Path(__file__).resolve().parents[1]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# Longest first, so that a venv inside the repository reads as <site-packages>, not .venv/...
_MACHINE_PATHS = sorted({*site.getsitepackages(), str(REPO)}, key=len, reverse=True)


def _without_machine_paths(text: str) -> str:
    for path in _MACHINE_PATHS:
        text = text.replace(path + "/", "" if path == str(REPO) else "<site-packages>/")
    return text


def _clean_outputs(cell) -> None:
    """Drop widget views (their model ids are new on every run and their state is not
    kept) and machine paths in tracebacks."""
    kept = []
    for output in cell.outputs:
        if WIDGET_VIEW in output.get("data", {}):
            continue
        if output.output_type == "error":
            output.traceback = [_without_machine_paths(line) for line in output.traceback]
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
