"""The kit as a person meets it: JupyterLab in a real browser.

JupyterLab starts through scripts/lab.sh (what ``make lab`` runs) on loopback with a
random token and a free port; Debian's Chromium, driven by Playwright, opens every
notebook, saves it (which must not change a byte on disk: one kernelspec, no widget
state), runs all its cells from the Run menu as a reader on a CPU laptop does, and checks
that every cell ran, that no cell shows an error it is not tagged to raise, that no
figure is blank, that every ipywidget is drawn as a widget rather than as its text
fallback, and that moving the first slider or dropdown, and ticking every checkbox,
changes what its cell shows without a traceback or a blank figure.

Screenshots and the server's log go to artifacts/e2e/. With UPDATE_SCREENSHOT=1 the
pictures of README_SCREENSHOTS also replace the ones the README shows.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Error as PlaywrightError

from e2e.chromium import BrowserUnavailable, chromium_context
from e2e.lab import LabServer, LabUnavailable
from e2e.notebook import WIDGET_FALLBACKS, Cell, NotebookPage

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "artifacts" / "e2e"
NOTEBOOKS = tuple(str(p.relative_to(REPO)) for p in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")))
# notebook: (which of its screenshots, the README's picture of it)
README_SCREENSHOTS = {
    "notebooks/00_start_here.ipynb": ("widget", REPO / "docs" / "screenshots" / "jupyterlab.png"),
    "notebooks/03_error_walkthroughs.ipynb": ("walkthrough", REPO / "docs" / "screenshots" / "jupyterlab-03.png"),
}
EXPECTED_ERROR_TAG = "raises-exception"


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="inkling-e2e-") as path:
        yield Path(path)


@pytest.fixture(scope="module")
def artifacts() -> Path:
    """artifacts/e2e/, emptied: what a person looks at belongs to this run only."""
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    return ARTIFACTS


@pytest.fixture(scope="module")
def lab(scratch: Path, artifacts: Path) -> Iterator[LabServer]:
    server = LabServer(REPO, scratch / "jupyter", artifacts / "jupyterlab.log")
    try:
        try:
            server.start()
        except LabUnavailable as exc:
            pytest.fail(str(exc), pytrace=False)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser(scratch: Path) -> Iterator[BrowserContext]:
    try:
        with chromium_context(scratch / "chromium-profile") as context:
            yield context
    except BrowserUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


def _replace_atomically(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    shutil.copyfile(source, partial)
    os.replace(partial, target)


def _assert_ran_cleanly(path: str, cells: list[Cell]) -> None:
    unexpected = [f"{cell.where}: {error}" for cell in cells if EXPECTED_ERROR_TAG not in cell.tags
                  for error in cell.errors]
    assert not unexpected, (f"{path}: cells show errors they are not tagged {EXPECTED_ERROR_TAG!r} to raise:\n"
                            + "\n".join(unexpected))
    not_run = [cell.where for cell in cells if cell.source.strip() and cell.count is None]
    assert not not_run, f"{path}: Run All stopped before these cells ran:\n" + "\n".join(not_run)


def _assert_no_blank_figures(path: str, cells: list[Cell], after: str) -> None:
    blank = [f"{cell.where}: {cell.blank_images} of {cell.images}" for cell in cells if cell.blank_images]
    assert not blank, f"{path}: blank figures {after}:\n" + "\n".join(blank)


def _shows_widgets(path: str) -> bool:
    """Whether the notebook displays an explorer (a cell calls into inkling_lab.widgets)."""
    cells = json.loads((REPO / path).read_text())["cells"]
    return any(cell["cell_type"] == "code" and re.search(r"\bwidgets\.\w+\(|from inkling_lab\.widgets import",
                                                           "".join(cell["source"])) for cell in cells)


def _assert_widgets_drawn(path: str, cells: list[Cell]) -> None:
    widget_cells = [cell for cell in cells if cell.widget_outputs]
    assert widget_cells, f"{path}: calls an explorer, but no cell displays an ipywidget"
    undrawn = [f"{cell.where} shows {cell.text[:300]!r}" for cell in widget_cells
               if cell.drawn_widgets < cell.widget_outputs
               or any(fallback in cell.text for fallback in WIDGET_FALLBACKS)]
    assert not undrawn, f"{path}: widgets drawn as text, not as widgets:\n" + "\n".join(undrawn)


def _assert_no_widget_tracebacks(path: str, cells: list[Cell], moved: str) -> None:
    broken = [f"{cell.where}:\n{trace}" for cell in cells if EXPECTED_ERROR_TAG not in cell.tags
              for trace in cell.widget_tracebacks]
    assert not broken, f"{path}: widgets show tracebacks after the {moved} moved:\n" + "\n".join(broken)


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_notebook_runs_and_its_widgets_respond_in_jupyterlab(
        path: str, lab: LabServer, browser: BrowserContext) -> None:
    assert (REPO / path).exists(), f"{path} is missing; the end-to-end test opens it"
    original = (REPO / path).read_bytes()
    stem = Path(path).stem
    page = browser.new_page()
    console: list[str] = []
    page.on("console", lambda message: console.append(f"[{message.type}] {message.text}"))
    notebook = NotebookPage(page, lab, path)
    try:
        notebook.open()
        notebook.save()
        saved = (REPO / path).read_bytes()
        if saved != original:  # never leave the repository changed, then fail
            (REPO / path).write_bytes(original)
        assert saved == original, (f"{path}: opening and saving it in JupyterLab changed the file "
                                   "(kernelspec, metadata or widget state): git would show a diff")
        notebook.run_all()
        notebook.screenshot(ARTIFACTS / f"{stem}.png")
        cells = [cell for cell in notebook.cells() if cell.kind == "code"]
        _assert_ran_cleanly(path, cells)
        _assert_no_blank_figures(path, cells, "after Run All")
        if _shows_widgets(path):
            _assert_widgets_drawn(path, cells)
            moved = notebook.change_first_widget()
            notebook.screenshot(ARTIFACTS / f"{stem}-widget.png", at_first_widget=True)
            ticked = notebook.toggle_checkboxes()
            after = f"after the first {moved} moved and {ticked} checkbox(es) were ticked"
            shown = notebook.cells()
            _assert_no_widget_tracebacks(path, shown, after)
            _assert_no_blank_figures(path, shown, after)
        if path == "notebooks/03_error_walkthroughs.ipynb":
            notebook.screenshot(ARTIFACTS / f"{stem}-walkthrough.png", at_cell="ISL-E001-title")
        if path in README_SCREENSHOTS and os.environ.get("UPDATE_SCREENSHOT") == "1":
            which, target = README_SCREENSHOTS[path]
            _replace_atomically(ARTIFACTS / f"{stem}-{which}.png", target)
    except BaseException:
        with contextlib.suppress(PlaywrightError):  # the picture helps; the first error matters
            notebook.screenshot(ARTIFACTS / f"{stem}-failure.png")
        raise
    finally:
        (ARTIFACTS / f"{stem}-console.log").write_text("\n".join(console))
        with contextlib.suppress(PlaywrightError):
            notebook.shut_kernel_down()
        page.close()
    assert (REPO / path).read_bytes() == original, f"{path} changed on disk while the browser ran it"
