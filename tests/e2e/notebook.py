"""A person's steps in one JupyterLab notebook, through Playwright: open it, wait for its
kernel, save it, Run All from the Run menu, read what every cell shows (blank figures
included), play with the first slider or dropdown, and tick every checkbox.

Actions go through the page as a person makes them (menu clicks, mouse drags, choosing
an option); the checks read JupyterLab's own notebook model (``window.jupyterapp``,
exposed by the server flag in lab.py) for execution counts, tags and output types, and
the DOM for what is drawn.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from playwright.sync_api import Error as PlaywrightError, Locator, Page

from .lab import LabServer

APP_TIMEOUT_MS = 90_000
KERNEL_TIMEOUT_MS = 120_000
RUN_TIMEOUT_MS = 240_000
WIDGET_TIMEOUT_MS = 60_000
BLANK_SETTLE_S = 10
POLL_MS = 100  # how often a wait looks again: each wait ends this late at most, and 23 notebooks wait often

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
TRACEBACK = "Traceback (most recent call last)"
# What a notebook shows instead of a widget when the widget manager is not working.
WIDGET_FALLBACKS = ("Loading widgets...", "Error displaying widget")

# An <img> that shows nothing: not loaded, no size, or every pixel the same colour
# (matplotlib's figures are data: URLs, so the canvas may read them back).
_IS_BLANK = """const isBlank = async img => {
    // Read the picture's own bytes (matplotlib's figures are data: URLs), not the element:
    // Chromium decodes an <img> lazily, and one not decoded yet reads back as transparent.
    let bitmap;
    try { bitmap = await createImageBitmap(await (await fetch(img.src)).blob()); }
    catch (error) { return true; }  // no picture at all
    if (bitmap.width === 0 || bitmap.height === 0) return true;
    const canvas = document.createElement('canvas');
    canvas.width = bitmap.width; canvas.height = bitmap.height;
    const context = canvas.getContext('2d');
    context.drawImage(bitmap, 0, 0);
    const data = context.getImageData(0, 0, canvas.width, canvas.height).data;
    for (let i = 4; i < data.length; i += 4) {
        if (data[i] !== data[0] || data[i + 1] !== data[1] || data[i + 2] !== data[2]) return false;
    }
    return true;
};"""

# The notebook panel of `path` among JupyterLab's main-area widgets.
_PANEL = """const panel = window.jupyterapp && Array.from(window.jupyterapp.shell.widgets('main'))
    .find(w => w.context && w.context.path === path);"""

_KERNEL_IDLE = f"""path => {{ {_PANEL}
    const kernel = panel && panel.sessionContext.session && panel.sessionContext.session.kernel;
    return Boolean(kernel) && kernel.status === 'idle'; }}"""

# Done: the kernel idle, no cell running, and either every code cell ran or one showed an
# error it is not tagged to raise (Run All stops there). The kernel is idle for a moment
# between two cells of a long run: idle alone does not mean done.
_RUN_DONE = f"""path => {{ {_PANEL}
    const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
    if (!kernel || kernel.status !== 'idle') return false;
    const cells = panel.content.widgets.map(cell => cell.model);
    if (cells.some(model => model.executionState === 'running')) return false;
    const code = cells.filter(model => model.type === 'code' && model.sharedModel.getSource().trim());
    const stopped = code.some(model => !(model.getMetadata('tags') || []).includes('raises-exception')
        && Array.from({{length: model.outputs.length}}, (_, i) => model.outputs.get(i).type).includes('error'));
    return stopped || code.every(model => model.executionCount !== null); }}"""

_CELLS = f"""async path => {{ {_PANEL} {_IS_BLANK}
    return Promise.all(panel.content.widgets.map(async (cell, index) => {{
        const model = cell.model;
        const report = {{index, type: model.type, source: model.sharedModel.getSource(),
                        tags: model.getMetadata('tags') || [], count: null, outputs: []}};
        if (model.type !== 'code') return report;
        report.count = model.executionCount;
        for (let i = 0; i < model.outputs.length; i++) {{
            const output = model.outputs.get(i).toJSON();
            report.outputs.push({{type: output.output_type, ename: output.ename || '',
                                 evalue: output.evalue || '', mimes: Object.keys(output.data || {{}})}});
        }}
        // What is drawn: top-level outputs holding a live widget, and widget-held
        // outputs (ipywidgets.Output) showing a traceback.
        const area = cell.outputArea.node;
        const tops = Array.from(area.querySelectorAll(':scope > .jp-OutputArea-child'));
        report.drawnWidgets = tops.filter(top => top.querySelector('.jupyter-widgets')).length;
        report.widgetTracebacks = Array.from(area.querySelectorAll(
            '.widget-output [data-mime-type="application/vnd.jupyter.stderr"]'))
            .map(node => node.innerText).filter(text => text.includes({TRACEBACK!r}));
        report.text = area.innerText;
        const pictures = Array.from(area.querySelectorAll('img'));
        report.blankImages = (await Promise.all(pictures.map(isBlank))).filter(Boolean).length;
        report.images = area.querySelectorAll('img').length;
        return report;
    }})); }}"""

# Everything a widget's cell shows except the control itself (whose own readout changes
# with it): text, plus images by their data, so a redrawn plot counts as a change.
_SHOWN_BESIDE = """control => {
    const own = control.closest('.jupyter-widgets');
    const area = control.closest('.jp-Cell-outputArea');
    const parts = [];
    const walker = document.createTreeWalker(area, NodeFilter.SHOW_TEXT | NodeFilter.SHOW_ELEMENT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        if (own.contains(node)) continue;
        if (node.nodeType === Node.TEXT_NODE) parts.push(node.textContent);
        else if (node.tagName === 'IMG') parts.push(node.getAttribute('src'));
        else if (node.tagName === 'svg') parts.push(node.outerHTML);
    }
    return parts.join('');
}"""

# Where the active cell's editor stands for typing at its end: "unfocused" (keys go to the
# notebook, where Enter enters the editor), "elsewhere" (the cursor is not at the end), "end".
_EDITOR_STATE = f"""path => {{ {_PANEL}
    const editor = panel.content.activeCell && panel.content.activeCell.editor;
    if (!editor || !editor.hasFocus()) return 'unfocused';
    const at = editor.getCursorPosition(), last = editor.lineCount - 1;
    return at.line === last && at.column === editor.getLine(last).length ? 'end' : 'elsewhere'; }}"""

_CONTROLS = ".jp-Notebook .widget-slider .noUi-handle, .jp-Notebook .widget-dropdown select"
_CHECKBOXES = ".jp-Notebook .widget-checkbox input[type=checkbox]"


class KernelUnavailable(RuntimeError):
    """The notebook did not open, its kernel did not start or died, or its run did not finish."""


@dataclass(frozen=True)
class Cell:
    """What one cell shows after Run All.

    ``errors`` holds "Name: value" for each error output; ``widget_tracebacks`` the
    tracebacks drawn inside widgets; ``widget_outputs`` counts the outputs that are
    widget views in the model and ``drawn_widgets`` those drawn as live widgets;
    ``images`` counts the pictures the cell shows and ``blank_images`` those that
    show nothing.
    """

    index: int
    kind: str
    source: str
    tags: tuple[str, ...]
    count: int | None
    errors: tuple[str, ...]
    widget_outputs: int
    drawn_widgets: int
    widget_tracebacks: tuple[str, ...]
    text: str
    images: int = 0
    blank_images: int = 0

    @property
    def where(self) -> str:
        first = self.source.strip().splitlines()[0] if self.source.strip() else ""
        return f"cell {self.index} ({first[:60]!r})"


class NotebookPage:
    """One notebook (``path``, relative to the server root) open in ``page``."""

    def __init__(self, page: Page, lab: LabServer, path: str) -> None:
        self.page = page
        self.lab = lab
        self.path = path

    def _until(self, script: str, timeout_ms: float, waiting_for: str) -> None:
        """Wait until ``script(path)`` is true. A JupyterLab dialog (no kernel found, the
        kernel died) or the timeout ends the wait at once with KernelUnavailable."""
        try:
            outcome = self.page.wait_for_function(
                f"path => document.querySelector('.jp-Dialog') ? 'dialog' : ({script})(path)",
                arg=self.path, timeout=timeout_ms, polling=POLL_MS).json_value()
        except PlaywrightError as exc:
            raise KernelUnavailable(
                f"{self.path}: gave up after {timeout_ms / 1000:.0f} s waiting until {waiting_for} ({exc}).\n"
                f"Server log:\n{self.lab.log_tail()}") from exc
        if outcome == "dialog":
            raise KernelUnavailable(
                f"{self.path}: JupyterLab stopped to ask, while waiting until {waiting_for}:\n"
                f"{self.page.locator('.jp-Dialog').first.inner_text()}\nServer log:\n{self.lab.log_tail()}")

    def open(self) -> None:
        """Open this notebook and wait for an idle kernel: in the JupyterLab the page
        already shows (File > Open, as a person opens the next notebook in the same tab),
        or, on a new page, by loading JupyterLab on it (a fresh workspace).

        Raises KernelUnavailable, with the server's log, when the kernel never gets idle.
        """
        if self.page.evaluate("() => Boolean(window.jupyterapp && window.jupyterapp.shell)"):
            self.page.evaluate("async path => { await window.jupyterapp.commands.execute('docmanager:open', {path}); }",
                               self.path)
        else:
            self.page.goto(self.lab.url(f"lab/tree/{self.path}") + "&reset", timeout=APP_TIMEOUT_MS)
        self._until(f"path => {{ {_PANEL} return Boolean(panel); }}", APP_TIMEOUT_MS,
                    "JupyterLab showed the notebook")
        self._until(_KERNEL_IDLE, KERNEL_TIMEOUT_MS, "the kernel started and became idle")

    def run_all(self) -> None:
        """Run > Run All Cells, then wait until no cell is queued or running."""
        self.page.locator(".lm-MenuBar-item", has_text="Run").first.click()
        self.page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        self._until(_RUN_DONE, RUN_TIMEOUT_MS, "Run All finished")

    def cells(self) -> list[Cell]:
        """What every cell shows now (once every picture has loaded)."""
        try:
            self.page.wait_for_function(
                "() => Array.from(document.querySelectorAll('.jp-Notebook img')).every(img => img.complete)",
                timeout=WIDGET_TIMEOUT_MS, polling=POLL_MS)
        except PlaywrightError:
            pass  # the blank-picture check names those that never loaded
        # A picture still being swapped in (an explorer's redraw, a cell attached late) reads
        # as blank for an instant: look again for a few seconds; a blank figure stays blank.
        deadline = time.monotonic() + BLANK_SETTLE_S
        raws = self.page.evaluate(_CELLS, self.path)
        while any(raw.get("blankImages") for raw in raws) and time.monotonic() < deadline:
            self.page.wait_for_timeout(500)
            raws = self.page.evaluate(_CELLS, self.path)
        return [
            Cell(index=raw["index"], kind=raw["type"], source=raw["source"], tags=tuple(raw["tags"]),
                 count=raw["count"],
                 errors=tuple(f"{o['ename']}: {o['evalue']}" for o in raw["outputs"] if o["type"] == "error"),
                 widget_outputs=sum(WIDGET_MIME in o["mimes"] for o in raw["outputs"]),
                 drawn_widgets=raw.get("drawnWidgets", 0),
                 widget_tracebacks=tuple(raw.get("widgetTracebacks", ())), text=raw.get("text", ""),
                 images=raw.get("images", 0), blank_images=raw.get("blankImages", 0))
            for raw in raws
        ]

    def change_first_widget(self) -> str:
        """Move the notebook's first slider (drag its handle across the track) or choose
        another option of its first dropdown, and wait until the rest of that cell's
        output changes. Returns which kind of control moved ("slider" or "dropdown").

        Raises AssertionError when the notebook has no slider or dropdown, or when
        nothing beside the control changes within WIDGET_TIMEOUT_MS.
        """
        self._show_first_widget()
        controls = self.page.locator(_CONTROLS)
        try:  # a long notebook attaches the scrolled-to cells, and the widget renders, in their own time
            controls.first.wait_for(state="attached", timeout=WIDGET_TIMEOUT_MS)
        except PlaywrightError:
            raise AssertionError(f"{self.path}: no slider or dropdown drawn to play with") from None
        control = controls.first
        control.scroll_into_view_if_needed()
        before = control.evaluate(_SHOWN_BESIDE)
        kind = self._drag_slider(control) if control.evaluate("n => n.tagName") != "SELECT" \
            else self._choose_other_option(control)
        self._until_changed(control, before, kind)
        return kind

    def _show_first_widget(self) -> None:
        """Scroll to the first cell that shows a widget: JupyterLab attaches only the
        cells near the view of a long notebook, so a widget far down is not in the page yet."""
        self.page.evaluate(f"""async path => {{ {_PANEL}
            const index = panel.content.widgets.findIndex(cell => cell.model.type === 'code'
                && Array.from({{length: cell.model.outputs.length}}, (_, i) => cell.model.outputs.get(i))
                       .some(output => {WIDGET_MIME!r} in (output.data || {{}})));
            if (index >= 0) await panel.content.scrollToItem(index, 'start'); }}""", self.path)
        self.page.wait_for_timeout(500)

    def toggle_checkboxes(self) -> int:
        """Tick (or untick) every checkbox of the notebook's widgets, one after the other,
        each time waiting until the rest of its cell's output changes. Returns how many.

        Raises AssertionError when an output does not change within WIDGET_TIMEOUT_MS.
        """
        boxes = self.page.locator(_CHECKBOXES)
        for i in range(boxes.count()):
            box = boxes.nth(i)
            self._in_view(box)
            before = box.evaluate(_SHOWN_BESIDE)
            box.click()
            self._until_changed(box, before, f"checkbox {i}")
        return boxes.count()

    def _until_changed(self, control: Locator, before: str, kind: str) -> None:
        try:
            self.page.wait_for_function(
                f"([control, before]) => ({_SHOWN_BESIDE})(control) !== before",
                arg=[control.element_handle(), before], timeout=WIDGET_TIMEOUT_MS, polling=POLL_MS)
        except PlaywrightError:
            shown = control.evaluate("n => n.closest('.jp-Cell-outputArea').innerText")
            raise AssertionError(
                f"{self.path}: moved the first {kind}, but its cell's output did not change within "
                f"{WIDGET_TIMEOUT_MS / 1000:.0f} s; it shows:\n{shown[:2000]}") from None
        self._until(_RUN_DONE, WIDGET_TIMEOUT_MS, "the widget's callback finished")
        self.page.wait_for_timeout(500)  # the new figure's <img> decodes after the text arrives

    def save(self) -> None:
        """File > Save, as a person presses Ctrl+S: JupyterLab writes the notebook as it
        holds it (with the kernel's metadata), waits for the write to finish."""
        self.page.evaluate(f"async path => {{ {_PANEL} await panel.context.save(); }}", self.path)

    def _in_view(self, control: Locator) -> None:
        """Scroll ``control`` to the middle of the window and wait until it stays put:
        JupyterLab renders a long notebook lazily, and pictures above it still load."""
        viewport = self.page.viewport_size or {"height": 900}
        last = None
        for _ in range(20):
            control.evaluate("n => n.scrollIntoView({block: 'center'})")
            self.page.wait_for_timeout(250)
            box = control.bounding_box()
            if box and box == last and 0 <= box["y"] <= viewport["height"] - box["height"]:
                return
            last = box
        raise AssertionError(f"{self.path}: could not bring the control into view (it sits at {last})")

    def _drag_slider(self, handle: Locator) -> str:
        self._in_view(handle)
        track = handle.locator("xpath=ancestor::*[contains(@class, 'noUi-target')]").bounding_box()
        grip = handle.bounding_box()
        if track is None or grip is None:
            raise AssertionError(f"{self.path}: the first slider is not visible")
        y = grip["y"] + grip["height"] / 2
        start = grip["x"] + grip["width"] / 2
        # Across to the far side of the track from where the handle sits.
        left_half = start < track["x"] + track["width"] / 2
        end = track["x"] + track["width"] * (0.8 if left_half else 0.2)
        self.page.mouse.move(start, y)
        self.page.mouse.down()
        # Two moves, halfway then there: the sliders update continuously, and the kernel
        # draws every value a move passes (one after the other), so each extra step is a
        # figure more to wait for, not a more thorough drag.
        self.page.mouse.move(end, y, steps=2)
        self.page.mouse.up()
        return "slider"

    def _choose_other_option(self, select: Locator) -> str:
        options = select.locator("option")
        if options.count() < 2:
            raise AssertionError(f"{self.path}: the first dropdown has fewer than two options")
        current = select.evaluate("s => s.selectedIndex")
        select.select_option(index=(current + 1) % options.count())
        return "dropdown"

    def screenshot(self, path: Path, *, at_first_widget: bool = False, at_cell: str = "") -> None:
        """Save what the window shows: the notebook's top, its first widget's cell, or
        the first cell whose id ends with ``at_cell``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        if at_first_widget:
            self._show_first_widget()
        if at_cell:
            self.page.evaluate(f"""async path => {{ {_PANEL}
                const index = panel.content.widgets.findIndex(c => c.model.id.endsWith({at_cell!r}));
                if (index >= 0) await panel.content.scrollToItem(index, 'start'); }}""", self.path)
        elif at_first_widget:
            self.page.locator(_CONTROLS).first.evaluate(
                "n => n.closest('.jp-Cell').scrollIntoView({block: 'start'})")
        else:
            self.page.locator(".jp-Notebook .jp-Cell").first.scroll_into_view_if_needed()
        self.page.wait_for_timeout(300)  # let the scroll settle before the picture
        self.page.screenshot(path=str(path))

    def edit_cell(self, cell_id: str, text: str) -> None:
        """Type ``text`` at the end of the cell whose id ends with ``cell_id``, as a person
        does (click into it, type), then run it with Shift+Enter and wait until the
        kernel is done. Raises AssertionError when no such cell exists."""
        index = self.page.evaluate(f"""async path => {{ {_PANEL}
            const index = panel.content.widgets.findIndex(c => c.model.id.endsWith({cell_id!r}));
            if (index >= 0) {{ await panel.content.scrollToItem(index, 'center'); panel.content.activeCellIndex = index; }}
            return index; }}""", self.path)
        if index < 0:
            raise AssertionError(f"{self.path}: no cell {cell_id!r} to edit")
        editor = self.page.locator(".jp-Notebook .jp-Cell.jp-mod-active .cm-content").first
        editor.click()
        # As a person makes sure before typing: in the editor (a click that lands before the
        # cell is drawn leaves the keys to the notebook, where Enter opens the editor), then
        # at its end (Control+End). Keys sent blind would land where the click did.
        deadline = time.monotonic() + WIDGET_TIMEOUT_MS / 1000  # a hang guard, not a speed check
        while (state := self.page.evaluate(_EDITOR_STATE, self.path)) != "end":
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.path}: could not bring the cursor to the end of {cell_id!r} ({state})")
            self.page.keyboard.press("Enter" if state == "unfocused" else "Control+End")
            self.page.wait_for_timeout(POLL_MS)
        self.page.keyboard.type(text)
        self.page.keyboard.press("Shift+Enter")
        self.page.wait_for_timeout(500)  # the run request reaches the kernel
        self._until(_RUN_DONE, RUN_TIMEOUT_MS, "the edited cell ran")

    def cell_source(self, cell_id: str) -> str:
        """The source of the cell whose id ends with ``cell_id``, as JupyterLab holds it."""
        return self.page.evaluate(f"""path => {{ {_PANEL}
            const cell = panel.content.widgets.find(c => c.model.id.endsWith({cell_id!r}));
            return cell ? cell.model.sharedModel.getSource() : null; }}""", self.path)

    def close(self) -> None:
        """Close the notebook and shut its kernel down, so that the next notebook opens
        alone in the same JupyterLab. Its unsaved outputs are dropped (a learner's copy
        keeps what autosave wrote): closing asks nothing. The server is asked to shut the
        session down and not waited for: the kernel exits while the next notebook opens."""
        self.page.evaluate(f"""path => {{ {_PANEL}
            if (!panel) return;
            const session = panel.sessionContext.session;
            panel.dispose();
            if (session) window.jupyterapp.serviceManager.sessions.shutdown(session.id).catch(() => {{}}); }}""",
                           self.path)
