"""Execute notebooks in place, so that their committed outputs are what the code gives today.

Like ``jupyter nbconvert --execute --inplace``, except that without CUDA the cells
tagged ``gpu`` are left unrun (no outputs, no execution count: nbval then compares
nothing for them and the test run skips them), and the file is replaced atomically.

    .venv/bin/python scripts/execute_notebooks.py notebooks/*.ipynb      (= make notebooks)
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import torch
from nbclient import NotebookClient

from inkling_lab.atomic import atomic_write


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
    atomic_write(path, (nbformat.writes(nb) + "\n").encode())
    print(f"{path}: executed" + (f", {skipped} gpu cell(s) left unrun (no CUDA)" if skipped else ""))


if __name__ == "__main__":
    for name in sys.argv[1:]:
        execute(Path(name))
