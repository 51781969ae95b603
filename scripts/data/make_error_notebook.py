"""Write notebook 03's walkthroughs from the error catalog (``inkling_lab.catalog``).

One notebook per origin (where the errors come from: the adapter files, the loader,
normalization, ..., ``notebooks/03_errors/NN_<group>.ipynb``), so that each stays small
enough for JupyterLab to scroll and search; the index, ``03_error_walkthroughs``, holds
the map with a link to each. Every catalog entry becomes six cells:

1. the entry's title, where it comes from, when it happens;
2. the trigger: the entry's setup and trigger, a cell that really raises (tagged
   ``raises-exception``: Run All goes on, nbval checks that it raises);
3. ``il.nb.raised(code)``: the error above is exactly this entry (``expect_error``'s
   check), with where the kit raised it and where sglang does;
4. why, in the entry's words;
5. the fix: setup and fix, a cell to edit and re-run (its output is not compared:
   it may show random numbers);
6. ``il.nb.verify(code)``: the fix re-run on fresh objects raises nothing and, for a
   warning, does not warn.

In the index, the hand-written opening (up to the cell holding ``MARKER``) and
everything after the generated map (the error lab) are kept as they are. Generated
cells carry the cell metadata ``{"generated": "make_error_notebook"}`` and stable ids;
a notebook whose cells the catalog did not change is not rewritten (its outputs stay).
Then execute what changed:

    PYTHONPATH=. .venv/bin/python scripts/data/make_error_notebook.py
    PYTHONPATH=. .venv/bin/python scripts/data/execute_notebooks.py notebooks/03_error_walkthroughs.ipynb notebooks/03_errors/*.ipynb
"""
from __future__ import annotations

import argparse
import ast
import importlib
import pkgutil
import sys
import textwrap
from pathlib import Path

import nbformat

from inkling_lab import catalog
from inkling_lab.atomic import atomic_write
from inkling_lab.catalog import CatalogEntry
from inkling_lab.nb import fix_cell

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "03_error_walkthroughs.ipynb"
FOLDER = NOTEBOOK.parent / "03_errors"
"""One notebook per origin, beside the index."""
MARKER = "<!-- walkthroughs: generated from the catalog by scripts/data/make_error_notebook.py -->"
GENERATED = {"generated": "make_error_notebook"}

# group: (heading, where the errors come from). The order is the order of a load:
# files, the loader, normalization, slicing, the pool, the wrapper's checks, the forward.
GROUPS: dict[str, tuple[str, str]] = {
    "adapter_files": ("Adapter files", "reading a PEFT adapter folder: the config, the weights file, the "
                      "names and shapes of the factors (the kit's loader; sglang reads the same files)"),
    "files": ("Adapter files", ""),
    "normalize": ("Normalization", "upstream's `normalize_shared_sink`: flat PEFT factors given their expert "
                  "axis, renamed and stacked into gate-up"),
    "tp": ("Tensor-parallel slicing", "`slice_lora_a` / `slice_lora_b`: each rank's share of every factor, and "
           "the kit's tensor-parallel runner"),
    "loader": ("The LoRA manager", "sglang's loader (`srt/lora/lora_manager.py`, `mem_pool.py`): what it "
               "refuses, skips or drops while it reads an adapter and fills a slot"),
    "pool": ("Loading into a pool slot", "the LoRA memory pool: an adapter's normalized factors written into "
             "one slot of the four buffers"),
    "eligibility": ("Eligibility", "`initialize_lora`: whether the shared-sink LoRA wrapper can serve this "
                    "sink and backend at all"),
    "set_lora_info": ("set_lora_info", "the wrapper's `set_lora_info`: the shape checks on the four buffers, in "
                      "order, and the raw torch errors when a shape gets past them"),
    "refresh": ("Refresh", "`on_lora_slots_updated`: copying reloaded slots into the derived operands"),
    "v2": ("The V2 generation", "the second wrapper generation (`InklingBatchDenseMLPWithLoRAV2`): its own "
           "`initialize_lora` errors and its folded pool message"),
    "forward": ("The forward", "a batch through the backends: slot ids, devices, kernels"),
    "diagnose": ("diagnose_pool findings", "what `il.diagnose_pool` finds that sglang's checks let through: it "
                 "reports, it does not raise"),
    "core": ("The forward", ""),
    "upstream": ("Upstream behaviour", "what upstream's wrapper methods do with unusual inputs"),
    "doctor": ("Doctor findings", "`inkling-lab doctor`: what sglang would do with an adapter, found before "
               "serving it"),
    "gpu": ("GPU", "the kernels on a GPU"),
    "warnings": ("Warnings", "nothing raises upstream, but it computes something other than the adapter "
                 "means: the kit warns"),
}
# Entries of the first round, still in catalog/legacy.py, by code, until they move
# to their group modules (then the module or the entry's ``group`` says it).
_LEGACY_GROUPS = {
    **dict.fromkeys(("ISL-E001", "ISL-E002", "ISL-E003", "ISL-E004", "ISL-E005", "ISL-E007", "ISL-E012",
                     "ISL-E013"), "set_lora_info"),
    "ISL-E006": "v2", "ISL-E008": "refresh", "ISL-E009": "eligibility",
    **dict.fromkeys(("ISL-E010", "ISL-E011", "ISL-K101", "ISL-K102", "ISL-K105", "ISL-K106"), "tp"),
    **dict.fromkeys(("ISL-E014", "ISL-K103"), "forward"),
    **dict.fromkeys(("ISL-E015", "ISL-E016", "ISL-K104"), "pool"),
    "ISL-W001": "warnings",
}


# group: the section of docs/reference.md that explains where its errors come from.
_REFERENCE = {"adapter_files": "adapters-on-disk", "files": "adapters-on-disk", "loader": "peft-features",
              "normalize": "adapters-on-disk", "tp": "tensor-parallelism", "pool": "the-pool",
              "eligibility": "message-generations", "set_lora_info": "validation-order", "refresh": "after-the-checks",
              "v2": "message-generations", "forward": "the-forward", "core": "the-forward", "diagnose": "validation-order",
              "doctor": "peft-features", "warnings": "per-expert-defect"}

_ORDER = ("adapter_files", "files", "loader", "normalize", "tp", "pool", "eligibility", "set_lora_info", "refresh",
          "v2", "forward", "core", "upstream", "gpu", "diagnose", "doctor", "warnings")


def group_of(entry: CatalogEntry, module: str) -> str:
    """The entry's own ``group`` where it has one, else its catalog module's name."""
    group = getattr(entry, "group", "") or module
    if group == "legacy":
        code = entry.code
        group = _LEGACY_GROUPS.get(code) or ("adapter_files" if code.startswith("ISL-K2") else
                                             "warnings" if code.startswith("ISL-W") else "other")
    return group


def grouped_entries() -> dict[str, tuple[str, list[CatalogEntry]]]:
    """Every catalog entry by heading, as ``{heading: (its first group, entries)}``, in
    a load's order (unknown groups last); groups that share a heading are merged."""
    by_group: dict[str, list[CatalogEntry]] = {}
    for info in sorted(pkgutil.iter_modules(catalog.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{catalog.__name__}.{info.name}")
        for entry in getattr(module, "ENTRIES", ()):  # entry.py and helpers hold none
            by_group.setdefault(group_of(entry, info.name), []).append(entry)
    order = list(_ORDER)
    merged: dict[str, tuple[str, list[CatalogEntry]]] = {}
    for group in sorted(by_group, key=lambda g: order.index(g) if g in order else len(order)):
        heading = GROUPS.get(group, (group.replace("_", " ").capitalize(), ""))[0]
        merged.setdefault(heading, (group, []))[1].extend(sorted(by_group[group], key=lambda e: e.code))
    return merged


def _cell_id(code: str, part: str) -> str:
    return f"{code}-{part}".replace(" ", "-")


def _md(source: str, cell_id: str) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_markdown_cell(source, id=cell_id)
    cell.metadata.update(GENERATED)
    return cell


def _code(source: str, cell_id: str, tags: tuple[str, ...] = ()) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source.rstrip("\n"), id=cell_id)
    cell.metadata.update(GENERATED)
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def _is_warning(entry: CatalogEntry) -> bool:
    return isinstance(entry.exc_type, type) and issubclass(entry.exc_type, Warning)


def _kind(entry: CatalogEntry) -> str:
    """How the walkthrough shows the entry: ``raise`` (its trigger raises it, or, for
    words the kit does not write, the kit's own error), ``report`` (a finding the
    trigger's last line reports), ``explain`` (words only sglang writes; the kit's
    trigger raises nothing)."""
    if not getattr(entry, "reproduced", True):
        return "raise" if getattr(entry, "kit_code", "") else "explain"
    if entry.exc_type is None:
        return "report"
    return "raise"


def _assign_last_line(source: str, name: str) -> str:
    """``source`` with its last statement, an expression, assigned to ``name``."""
    lines = source.rstrip("\n").splitlines()
    last = ast.parse(source).body[-1]
    if not isinstance(last, ast.Expr):
        raise ValueError(f"a finding's trigger must end with the expression that reports it:\n{source}")
    start = last.lineno - 1
    lines[start] = f"{name} = " + lines[start]
    return "\n".join(lines) + "\n"


def _trigger_source(entry: CatalogEntry) -> str:
    source = entry.setup + entry.trigger
    if _kind(entry) == "report":
        return _assign_last_line(source, "found")
    if _is_warning(entry) and getattr(entry, "reproduced", True):
        # A warning raises nothing; made an error here, it shows where it comes from.
        kind = entry.exc_type
        return (f"import warnings\nfrom {kind.__module__} import {kind.__qualname__}\n\n"
                "with warnings.catch_warnings():\n"
                f"    warnings.simplefilter('error', {kind.__qualname__})  # the warning raises: see where it comes from\n"
                + textwrap.indent(source, "    "))
    return source


def _check_source(entry: CatalogEntry) -> str:
    return {"raise": f'il.nb.raised("{entry.code}")', "report": f'il.nb.reported("{entry.code}", found)',
            "explain": f'il.nb.explained("{entry.code}")'}[_kind(entry)]


def _who(entry: CatalogEntry) -> str:
    return getattr(entry, "generation", "") or getattr(entry, "origin", "")


def entry_cells(entry: CatalogEntry) -> list[nbformat.NotebookNode]:
    """The six cells of one walkthrough."""
    code = entry.code
    kind = entry.exc_type.__name__ if entry.exc_type else getattr(entry, "kind", "warning")
    why = [f"**Why:** {entry.meaning}"]
    if getattr(entry, "upstream", ""):
        why.append(f"**Where it comes from:** {entry.upstream}")
    if getattr(entry, "remedy", ""):
        why.append(f"**What to do:** {entry.remedy}")
    raises = _kind(entry) == "raise"
    return [
        _md(f"### {code} · {entry.title}\n\n*{_who(entry)}*. `{kind}: {entry.message}`\n\n"
            f"**When:** {entry.when}", _cell_id(code, "title")),
        _code(_trigger_source(entry), _cell_id(code, "trigger"), ("raises-exception",) if raises else ()),
        _code(_check_source(entry), _cell_id(code, "check")),
        _md("\n\n".join(why) + "\n\n**Fix** (edit it and re-run it, then the check below):", _cell_id(code, "why")),
        # What a fix shows may hold random numbers; the verify cell below is its check.
        _code(fix_cell(code), _cell_id(code, "fix"), ("nbval-ignore-output",)),
        _code(f'il.nb.verify("{code}")', _cell_id(code, "verify")),
    ]


_SETUP = ("import torch\nimport inkling_lab as il\nimport inkling_lab.nb  # its checks judge the cells run after this one\n\n"
          "%xmode Plain\n# ^ tracebacks as a server's log prints them: file, line, the line of code")


def _where(heading: str) -> str:
    where = next((w for h, w in GROUPS.values() if h == heading and w), "")
    return where[0].upper() + where[1:] if where else ""


def origins() -> list[tuple[str, str, str, list[CatalogEntry]]]:
    """``(file name, heading, first group, entries)`` of every origin notebook, in a
    load's order: ``01_adapter_files.ipynb``, ..."""
    return [(f"{i:02d}_{group}.ipynb", heading, group, entries)
            for i, (heading, (group, entries)) in enumerate(grouped_entries().items(), start=1)]


def map_cell() -> nbformat.NotebookNode:
    """The index's map: every origin, where its errors come from, its codes, a link."""
    found = origins()
    rows = ["| walkthroughs | where the errors come from | codes |", "|---|---|---|"]
    for name, heading, _, entries in found:
        rows.append(f"| [{heading}]({FOLDER.name}/{name}) | {_where(heading)} | {', '.join(e.code for e in entries)} |")
    total = sum(len(entries) for *_, entries in found)
    return _md(f"## The map\n\n{total} catalog entries in {len(found)} notebooks, one per origin, in the order a "
               "load meets them: `ISL-E…` are sglang's own errors, `ISL-K…` the kit's refusals where sglang would "
               "fail later or compute something else, `ISL-W…` warnings, `ISL-D…`/`ISL-N…` diagnoses. Each notebook "
               "runs on its own (*Run All*); `il.explain(code)` finds any entry from here.\n\n" + "\n".join(rows),
               "map")


def origin_notebook(at: int, metadata: dict) -> nbformat.NotebookNode:
    """The ``at``-th origin's notebook: where its errors come from, the setup, its walkthroughs."""
    found = origins()
    name, heading, group, entries = found[at]
    anchor = _REFERENCE.get(group)
    link = f" ([reference](../../docs/reference.md#{anchor}))" if anchor else ""
    back = f"[the map](../{NOTEBOOK.name})"
    steps = [f"[{found[i][1]}]({found[i][0]})" for i in (at - 1, at + 1) if 0 <= i < len(found)]
    around = ("← " if at > 0 else "") + " · ".join(steps) + (" →" if at + 1 < len(found) else "")
    cells = [_md(f"# 03 · {heading}\n\n{_where(heading)}{link}\n\n{len(entries)} walkthroughs: "
                 f"{', '.join(e.code for e in entries)}. How a walkthrough goes, and the error lab, are in "
                 f"{back}; {around}", "intro"),
             _code(_SETUP, "setup")]
    for entry in entries:
        cells += entry_cells(entry)
    nb = nbformat.v4.new_notebook(metadata=dict(metadata))
    nb.cells = cells
    return nb


def rebuild(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The index ``nb`` with its generated cells replaced by today's map, after the MARKER cell."""
    markers = [i for i, cell in enumerate(nb.cells) if MARKER in cell.source]
    if len(markers) != 1:
        raise SystemExit(f"{NOTEBOOK.name}: expected one cell holding {MARKER!r}, found {len(markers)}; "
                         "the map goes right after it")
    kept = [cell for cell in nb.cells if cell.metadata.get("generated") != GENERATED["generated"]]
    at = next(i for i, cell in enumerate(kept) if MARKER in cell.source) + 1
    nb.cells = kept[:at] + [map_cell()] + kept[at:]
    return nb


def _cells(nb: nbformat.NotebookNode) -> list:
    return [(c.cell_type, c.source, c.metadata) for c in nb.cells]


def planned() -> dict[Path, nbformat.NotebookNode]:
    """Every notebook the catalog gives today: the index and one per origin."""
    index = rebuild(nbformat.read(NOTEBOOK, as_version=4))
    metadata = {k: v for k, v in index.metadata.items() if k in ("kernelspec", "language_info")}
    notebooks = {NOTEBOOK: index}
    for at, (name, *_) in enumerate(origins()):
        notebooks[FOLDER / name] = origin_notebook(at, metadata)
    return notebooks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the walkthrough notebooks are not what the catalog gives today")
    args = parser.parse_args(argv)
    wanted = planned()
    stale = sorted(set(FOLDER.glob("*.ipynb")) - set(wanted))
    changed = [path for path, nb in wanted.items()
               if not path.exists() or _cells(nbformat.read(path, as_version=4)) != _cells(nb)]
    if args.check:
        if changed or stale:
            print(f"out of date: {', '.join(str(p.relative_to(NOTEBOOK.parent)) for p in changed + stale)}; run "
                  "scripts/data/make_error_notebook.py and re-execute those notebooks", file=sys.stderr)
            return 1
        return 0
    for path in stale:  # an origin the catalog no longer has
        path.unlink()
        print(f"{path}: removed (no catalog entries come from there any more)")
    for path in changed:
        atomic_write(path, (nbformat.writes(wanted[path]) + "\n").encode())
        print(f"{path}: written; now execute it (scripts/data/execute_notebooks.py)")
    if not changed and not stale:
        print("the walkthroughs are unchanged")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
