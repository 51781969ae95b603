"""Run a notebook's code cells in order as plain Python, for a machine without Jupyter.

The lent GPU machine has torch and triton but no Jupyter, nbval or ipywidgets; this
runs every code cell of the given notebooks there (``gpu`` cells included), from the
notebook's own folder, and fails on the first cell that raises. Cells that display a
widget are skipped when ipywidgets is missing, and said so.

    cd notebooks && PYTHONPATH=.. MPLBACKEND=Agg python3 ../scripts/gpu/run_notebook_cells.py 05_batched_forward.ipynb
"""
from __future__ import annotations

import importlib.util
import json
import sys
import time


def run(path: str) -> int:
    cells = [c for c in json.load(open(path))["cells"] if c["cell_type"] == "code"]
    has_widgets = importlib.util.find_spec("ipywidgets") is not None
    namespace: dict = {"__name__": "__main__"}
    ran = 0
    for i, cell in enumerate(cells):
        source = "".join(cell["source"])
        tags = cell.get("metadata", {}).get("tags", [])
        if not has_widgets and "widgets" in source:
            print(f"--- {path} cell {i}: skipped (shows a widget; ipywidgets is not installed)")
            continue
        print(f"--- {path} cell {i}{' [gpu]' if 'gpu' in tags else ''}", flush=True)
        start = time.perf_counter()
        exec(compile(source, f"<{path} cell {i}>", "exec"), namespace)
        print(f"    ({time.perf_counter() - start:.1f} s)", flush=True)
        ran += 1
    print(f"=== {path}: {ran} of {len(cells)} code cells ran")
    return ran


if __name__ == "__main__":
    for notebook in sys.argv[1:]:
        run(notebook)
