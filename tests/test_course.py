"""The course as a reader meets it: every notebook from 01 on has exercises with a
check and a runnable solution, notebook 03 walks today's catalog, GPU cells skip with
a note, references point into the kit's own docs/, and saving a notebook changes no
byte (one kernelspec, no widget state)."""
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import warm_kernel  # noqa: E402  the kernelspec make setup installs

sys.path.pop(0)
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
WALKTHROUGHS = sorted((ROOT / "notebooks" / "03_errors").glob("*.ipynb"))
"""Notebook 03's walkthroughs, one notebook per origin (generated; no exercises of their own)."""
EVERY_NOTEBOOK = NOTEBOOKS + WALKTHROUGHS
REFERENCE = ROOT / "docs" / "reference.md"


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _source(cell: dict) -> str:
    return "".join(cell["source"])


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name >= "01"], ids=lambda p: p.stem)
def test_every_notebook_from_01_has_two_exercises_with_a_check_and_a_hidden_solution(path):
    cells = _cells(path)
    headings = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                and re.match(r"#+ Exercise", _source(c))]
    assert len(headings) >= 2, f"{path.name}: {len(headings)} 'Exercise' headings, want at least 2"
    for i in headings:
        reader, solution = cells[i + 1], cells[i + 2]
        title = _source(cells[i]).splitlines()[0]
        assert reader["cell_type"] == "code" and "il.exercises." in _source(reader) and "..." in _source(reader), \
            f"{path.name}, {title}: the cell after the heading must hold the '...' to replace and the check"
        assert "solution" in solution["metadata"].get("tags", []), f"{path.name}, {title}: no solution cell"
        assert solution["metadata"].get("jupyter", {}).get("source_hidden") is True, \
            f"{path.name}, {title}: the solution must be collapsed (one click away)"
        assert ".assert_right()" in _source(solution), \
            f"{path.name}, {title}: the solution must run the check, so that CI keeps the check honest"


def test_notebook_03_walks_todays_catalog():
    sys.path.insert(0, str(ROOT / "scripts" / "data"))
    try:
        import make_error_notebook
    finally:
        sys.path.pop(0)
    assert make_error_notebook.main(["--check"]) == 0, \
        "notebook 03 is stale: run scripts/data/make_error_notebook.py, then scripts/data/execute_notebooks.py on it"


def test_every_catalog_entry_is_walked_through_in_notebook_03():
    """Trigger, check, why, fix and verify cells for every code, and the check's verdict
    in the committed outputs: raised (the trigger cell raises and is tagged so),
    reported (a finding) or explained (words only sglang writes)."""
    import inkling_lab as il

    cells = {c.get("id"): c for path in WALKTHROUGHS for c in _cells(path)}
    shown = lambda c: "".join("".join(o.get("text", "")) for o in c.get("outputs", []))  # noqa: E731
    for code in il.CATALOG:
        parts = {part: cells.get(f"{code}-{part}") for part in ("title", "trigger", "check", "why", "fix", "verify")}
        assert all(parts.values()), f"{code}: missing {[p for p, c in parts.items() if not c]}: regenerate 03"
        check = _source(parts["check"])
        verdict = re.match(r'il\.nb\.(raised|reported|explained)\("' + code + '"', check)
        assert verdict, f"{code}: the check cell is {check!r}"
        raises = verdict.group(1) == "raised"
        assert ("raises-exception" in parts["trigger"]["metadata"].get("tags", [])) is raises, code
        assert re.search(rf"✓ (raised|reported|explained) as expected: ({code}|ISL-\w+)", shown(parts["check"])), \
            f"{code}: its check shows no verdict: re-execute notebook 03"
        assert "✓ verified" in shown(parts["verify"]), f"{code}: its fix is not verified: re-execute notebook 03"


def test_notebook_03_is_an_index_of_small_notebooks_one_per_origin():
    """The walkthroughs are split by origin so that JupyterLab scrolls and searches each
    at ease: the index links every one, and none is long."""
    index = "".join(_source(c) for c in _cells(ROOT / "notebooks" / "03_error_walkthroughs.ipynb"))
    assert WALKTHROUGHS and all(f"](03_errors/{p.name})" in index for p in WALKTHROUGHS)
    assert all(len(_cells(p)) <= 150 for p in WALKTHROUGHS), {p.name: len(_cells(p)) for p in WALKTHROUGHS}
    assert len(_cells(ROOT / "notebooks" / "03_error_walkthroughs.ipynb")) <= 40


@pytest.mark.parametrize("path", EVERY_NOTEBOOK, ids=lambda p: p.stem)
def test_gpu_cells_skip_with_a_note_off_cuda(path):
    for cell in _cells(path):
        if "gpu" in cell["metadata"].get("tags", []):
            assert _source(cell).startswith("if il.nb.requires_cuda():"), \
                f"{path.name}: a gpu cell must start with `if il.nb.requires_cuda():`, so Run All goes on off CUDA"


LIBRARY = sorted((ROOT / "inkling_lab").rglob("*.py"))


def test_no_notebook_readme_or_library_text_points_to_a_spec_the_kit_does_not_ship():
    texts = {p.name: "".join(_source(c) for c in _cells(p)) for p in EVERY_NOTEBOOK}
    texts["README.md"] = (ROOT / "README.md").read_text()
    texts.update({str(p.relative_to(ROOT)): p.read_text() for p in LIBRARY})  # docstrings and messages
    offenders = {name: re.findall(r".{0,30}\bSPEC\b.{0,30}|.{0,30}steering docs.{0,10}", text)
                 for name, text in texts.items()}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"point to docs/reference.md instead: {offenders}"


def test_links_into_the_reference_name_sections_that_exist():
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', REFERENCE.read_text()))
    assert {"the-pool", "validation-order", "message-generations", "peft-features", "tensor-parallelism",
            "per-expert-defect"} <= anchors
    texts = [(p.name, "".join(_source(c) for c in _cells(p))) for p in EVERY_NOTEBOOK]
    texts.append(("README.md", (ROOT / "README.md").read_text()))
    texts += [(str(p.relative_to(ROOT)), p.read_text()) for p in LIBRARY]
    for name, text in texts:
        for anchor in re.findall(r"reference\.md#([\w-]+)", text):
            assert anchor in anchors, f"{name} links to docs/reference.md#{anchor}, which does not exist"
    assert any("reference.md#" in text for _, text in texts)


@pytest.mark.parametrize("path", EVERY_NOTEBOOK, ids=lambda p: p.stem)
def test_saving_a_notebook_changes_nothing(path):
    """One kernelspec, the one `make setup` installs (scripts/warm_kernel.py); no widget
    state or views (their model ids are new on every run)."""
    nb = json.loads(path.read_text())
    assert nb["metadata"]["kernelspec"] == {"display_name": warm_kernel.DISPLAY_NAME, "language": "python",
                                            "name": warm_kernel.KERNEL_NAME}
    assert "widgets" not in nb["metadata"], f"{path.name}: widget state in the metadata (re-run the executor)"
    views = [i for i, c in enumerate(nb["cells"]) for o in c.get("outputs", [])
             if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert not views, f"{path.name}: widget views with model ids in cells {views} (re-run the executor)"


def test_the_executor_keeps_no_widget_views_and_no_machine_paths():
    import nbformat

    sys.path.insert(0, str(ROOT / "scripts" / "data"))
    try:
        import execute_notebooks
    finally:
        sys.path.pop(0)
    cell = nbformat.v4.new_code_cell("x")
    cell.outputs = [
        nbformat.v4.new_output("display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "1"},
                                                     "text/plain": "VBox()"}),
        nbformat.v4.new_output("error", ename="ValueError", evalue="bad",
                               traceback=[f"File {ROOT}/inkling_lab/lora.py:12, in set_lora_info"]),
        nbformat.v4.new_output("stream", name="stdout", text="kept /tmp/tmpab12cd_9/my_adapter\n"),
        nbformat.v4.new_output("execute_result", data={"text/plain": "Adapter(source='/var/x/tmp0a1b2c3d/a')"}),
    ]
    execute_notebooks._clean_outputs(cell)
    assert [o.output_type for o in cell.outputs] == ["error", "stream", "execute_result"]
    assert cell.outputs[0].traceback == ["File inkling_lab/lora.py:12, in set_lora_info"]
    assert cell.outputs[1].text == "kept <tmp>/my_adapter\n"       # temporary folders, as the sanitizer writes them
    assert cell.outputs[2].data["text/plain"] == "Adapter(source='<tmp>/a')"
    assert execute_notebooks._without_machine_paths("tmpw3i035lp/adapter_config.json") == "<tmp>/adapter_config.json"
