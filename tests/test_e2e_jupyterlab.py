"""The kit as a person meets it: JupyterLab in a real browser.

JupyterLab starts through scripts/lab.sh (what ``make lab`` runs) on loopback with a
random token and a free port, with its defaults (autosave on); Debian's Chromium, driven
by Playwright, opens every notebook's working copy (the test's own, ``lab-e2e/``, made
by lab.sh as a learner's ``lab/`` is) one after the other in one JupyterLab tab, saves it
(which must not change a byte against the tracked notebook: one kernelspec, no widget
state), runs all its cells from the Run menu as a reader on a CPU laptop does, and
checks that every cell ran, that no cell shows an error it is not tagged to raise, that no
figure is blank, that every ipywidget is drawn as a widget rather than as its text
fallback, and that moving the first slider or dropdown, and ticking every checkbox,
changes what its cell shows without a traceback or a blank figure. Last, a learner's
session: one trigger edited and re-run, then ``git status`` must read as it did before
the browser started (the session changed nothing git tracks), and the edit must
survive a restart. How long each notebook took to open and to run, and its cell count,
go to artifacts/e2e/timings.json.

Screenshots and the server's log go to artifacts/e2e/. With UPDATE_SCREENSHOT=1 the
pictures of README_SCREENSHOTS also replace the ones the README shows.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, ConsoleMessage, Error as PlaywrightError, Page

from e2e.chromium import BrowserUnavailable, chromium_context
from e2e.lab import LAB_DIR, LabServer, LabUnavailable
from e2e.notebook import WIDGET_FALLBACKS, Cell, NotebookPage

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "artifacts" / "e2e"
# Every notebook of the course, by its path under notebooks/ (03's walkthroughs in their folder).
NOTEBOOKS = tuple(p.relative_to(REPO / "notebooks").as_posix() for p in sorted((REPO / "notebooks").rglob("*.ipynb"))
                  if ".ipynb_checkpoints" not in p.parts)
EDITED = ("03_errors/06_set_lora_info.ipynb", "ISL-E001-trigger")
"""The learner's edit of the session test: a walkthrough's trigger."""
TIMINGS: dict[str, dict[str, float]] = {}
# notebook: (which of its screenshots, the README's picture of it)
README_SCREENSHOTS = {
    "00_start_here.ipynb": ("widget", REPO / "docs" / "screenshots" / "jupyterlab.png"),
    EDITED[0]: ("walkthrough", REPO / "docs" / "screenshots" / "jupyterlab-03.png"),
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


def _git_status() -> str:
    """What git sees changed in the clone (tracked and untracked, not ignored)."""
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def clone_before() -> str:
    """``git status`` before the browser starts: the session must leave it so."""
    return _git_status()


@pytest.fixture(scope="module")
def lab(scratch: Path, artifacts: Path, clone_before: str) -> Iterator[LabServer]:
    server = LabServer(REPO, scratch / "jupyter", artifacts / "jupyterlab.log")
    try:
        try:
            server.start()
        except LabUnavailable as exc:
            pytest.fail(str(exc), pytrace=False)
        yield server
    finally:
        server.stop()
        (artifacts / "timings.json").write_text(json.dumps(TIMINGS, indent=1) + "\n")
        shutil.rmtree(REPO / LAB_DIR, ignore_errors=True)


@pytest.fixture(scope="module")
def browser(scratch: Path) -> Iterator[BrowserContext]:
    try:
        with chromium_context(scratch / "chromium-profile") as context:
            yield context
    except BrowserUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


class Tab:
    """One JupyterLab tab for every notebook, as a person opens one after the other:
    JupyterLab boots once (booting it took longer than running most notebooks). A test
    that fails discards the tab, so the next one starts on a fresh JupyterLab."""

    def __init__(self, browser: BrowserContext) -> None:
        self.browser = browser
        self._page: Page | None = None

    def page(self) -> Page:
        if self._page is None or self._page.is_closed():
            self._page = self.browser.new_page()
        return self._page

    def discard(self) -> None:
        page, self._page = self._page, None
        if page is not None:
            with contextlib.suppress(PlaywrightError):
                page.close()


@pytest.fixture(scope="module")
def tab(browser: BrowserContext) -> Iterator[Tab]:
    tab = Tab(browser)
    yield tab
    tab.discard()


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


def _shows_widgets(tracked: Path) -> bool:
    """Whether the notebook displays an explorer (a cell calls into inkling_lab.widgets)."""
    cells = json.loads(tracked.read_text())["cells"]
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


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_and_its_widgets_respond_in_jupyterlab(
        name: str, lab: LabServer, tab: Tab) -> None:
    tracked, path = REPO / "notebooks" / name, f"{LAB_DIR}/{name}"
    assert (REPO / path).exists(), f"{path} is missing: scripts/lab.sh copies every notebook of notebooks/"
    original = tracked.read_bytes()
    stem = name.removesuffix(".ipynb").replace("/", "-")
    page = tab.page()
    console: list[str] = []

    def listen(message: ConsoleMessage) -> None:
        console.append(f"[{message.type}] {message.text}")

    page.on("console", listen)
    notebook = NotebookPage(page, lab, path)
    try:
        started = time.monotonic()
        notebook.open()
        opened = time.monotonic()
        notebook.save()
        assert (REPO / path).read_bytes() == original, (
            f"{path}: opening and saving it in JupyterLab changed it against notebooks/{name} "
            "(kernelspec, metadata or widget state): a learner's save would differ from the course")
        notebook.run_all()
        TIMINGS[name] = {"open_s": round(opened - started, 1), "run_all_s": round(time.monotonic() - opened, 1)}
        notebook.screenshot(ARTIFACTS / f"{stem}.png")
        cells = [cell for cell in notebook.cells() if cell.kind == "code"]
        TIMINGS[name]["cells"] = len(json.loads(original)["cells"])
        _assert_ran_cleanly(path, cells)
        _assert_no_blank_figures(path, cells, "after Run All")
        if _shows_widgets(tracked):
            _assert_widgets_drawn(path, cells)
            moved = notebook.change_first_widget()
            notebook.screenshot(ARTIFACTS / f"{stem}-widget.png", at_first_widget=True)
            ticked = notebook.toggle_checkboxes()
            after = f"after the first {moved} moved and {ticked} checkbox(es) were ticked"
            shown = notebook.cells()
            _assert_no_widget_tracebacks(path, shown, after)
            _assert_no_blank_figures(path, shown, after)
        if name == EDITED[0]:
            notebook.screenshot(ARTIFACTS / f"{stem}-walkthrough.png", at_cell=EDITED[1].replace("trigger", "title"))
        if name in README_SCREENSHOTS and os.environ.get("UPDATE_SCREENSHOT") == "1":
            which, target = README_SCREENSHOTS[name]
            _replace_atomically(ARTIFACTS / f"{stem}-{which}.png", target)
    except BaseException:
        with contextlib.suppress(PlaywrightError):  # the picture helps; the first error matters
            notebook.screenshot(ARTIFACTS / f"{stem}-failure.png")
        with contextlib.suppress(PlaywrightError):
            notebook.close()
        tab.discard()
        raise
    finally:
        (ARTIFACTS / f"{stem}-console.log").write_text("\n".join(console))
        with contextlib.suppress(PlaywrightError):
            page.remove_listener("console", listen)
    notebook.close()
    assert tracked.read_bytes() == original, f"notebooks/{name} changed on disk while the browser ran its copy"


def test_a_learners_session_leaves_the_clone_clean_and_keeps_their_work(
        lab: LabServer, tab: Tab, clone_before: str) -> None:
    """After every notebook ran (autosave on), a trigger edited, re-run and saved: git
    sees nothing new, the edit is in the working copy, and a restart keeps it."""
    name, cell = EDITED
    # A fresh page, as a learner coming back opens JupyterLab: the tab's JupyterLab may still
    # hold the notebook's last session (closing does not wait for it to end), which a reopen
    # of the same notebook right after would get back, with its kernel already shut down.
    tab.discard()
    notebook = NotebookPage(tab.page(), lab, f"{LAB_DIR}/{name}")
    edit = "\n# my own try"
    try:
        notebook.open()
        notebook.run_all()
        notebook.edit_cell(cell, edit)
        notebook.save()
        assert notebook.cell_source(cell).endswith(edit)
    finally:
        with contextlib.suppress(PlaywrightError):
            notebook.close()
        tab.discard()  # the server stops next: this JupyterLab is gone
    assert _git_status() == clone_before, (
        "a session in JupyterLab changed what git sees:\n" + _git_status() + "\nbefore:\n" + clone_before)
    lab.stop()  # a restart: lab.sh copies only what is missing, never over the learner's copy
    subprocess.run([sys.executable, str(REPO / "scripts" / "lab_copies.py"), "--lab", LAB_DIR], cwd=REPO,
                   check=True, capture_output=True)
    saved = json.loads((REPO / LAB_DIR / name).read_text())
    sources = {c.get("id", ""): "".join(c["source"]) for c in saved["cells"]}
    assert any(k.endswith(cell) and v.endswith(edit) for k, v in sources.items()), \
        f"{LAB_DIR}/{name}: the learner's edit of {cell} did not survive a restart"
