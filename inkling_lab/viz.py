"""matplotlib figures that explain the shared sink at a glance. Each function takes
plain values, returns a ``Figure`` and holds no domain logic of its own."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

_DETACHED = threading.local()


@contextmanager
def detached() -> Iterator[None]:
    """Figures made inside (in this thread) are plain ``Figure`` objects on their own Agg
    canvas, unknown to pyplot: nothing else (the notebook's inline backend flushing and
    closing pyplot's figures after a cell) can draw, show or close them while their
    owner renders them. Outside, figures come from ``plt.subplots`` so that a notebook
    cell shows them inline."""
    before = getattr(_DETACHED, "on", False)
    _DETACHED.on = True
    try:
        yield
    finally:
        _DETACHED.on = before


def _subplots(*args, figsize: tuple[float, float] | None = None, constrained_layout: bool = False, **kwargs):
    """``plt.subplots``, or inside ``detached()`` the same grid on a figure pyplot never sees."""
    if not getattr(_DETACHED, "on", False):
        return plt.subplots(*args, figsize=figsize, constrained_layout=constrained_layout, **kwargs)
    fig = Figure(figsize=figsize, layout="constrained" if constrained_layout else None)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(*args, **kwargs)


def message_figure(text: str) -> Figure:
    """A small figure that says ``text``: what an explorer shows where there is nothing
    to draw (an adapter the kit cannot read, values outside what the drawing takes)."""
    fig, ax = _subplots(1, 1, figsize=(8, 1.2))
    ax.axis("off")
    ax.text(0.0, 0.5, text, ha="left", va="center", fontsize=9, wrap=True, transform=ax.transAxes)
    return fig

# -- core: layouts, buffers, derived operands --------------------------------

_GATE, _UP, _EMPTY = "#3b7dd8", "#e8893a", "#f2f2f2"


def gate_up_layout_figure(intermediate: int = 4, n: int = 2) -> Figure:
    """The rows of ``w13 [n, 2F, H]`` in both layouts: which row is gate, which is up."""
    from .sink import gate_up_rows

    fig, axes = _subplots(2, 1, figsize=(9, 2.8), constrained_layout=True)
    for ax, interleaved in zip(axes, (True, False)):
        gate, _ = gate_up_rows(intermediate, interleaved)
        gate = set(gate.tolist())
        for e in range(n):
            for row in range(2 * intermediate):
                is_gate = row in gate
                f = row // 2 if interleaved else row % intermediate
                x = e * 2 * intermediate + row
                ax.add_patch(Rectangle((x, 0), 0.92, 1, color=_GATE if is_gate else _UP))
                ax.text(x + 0.46, 0.5, f"{'g' if is_gate else 'u'}{f}", ha="center", va="center",
                        color="white", fontsize=8)
            ax.text(e * 2 * intermediate + intermediate, 1.25, f"expert {e}", ha="center", fontsize=9)
            if e:
                ax.axvline(e * 2 * intermediate - 0.04, color="black", lw=2)
        name = "interleaved (default): row 2f = gate f, row 2f+1 = up f" if interleaved else \
            "contiguous: rows 0..F-1 gate, F..2F-1 up"
        ax.set_title(name, loc="left", fontsize=10)
        ax.set_xlim(0, n * 2 * intermediate)
        ax.set_ylim(0, 1.5)
        ax.set_yticks([])
        ax.set_xlabel("row of w13_lin = w13.view(n*2F, H)")
    fig.suptitle(f"Gate/up rows of w13 (n={n}, F={intermediate}); g = gate feature, u = up feature")
    return fig


def _zeros_grey_image(ax, t, vmax: float | None = None):
    """A 2D tensor on a symmetric blue-red scale (``vmax``: its end, else the tensor's
    largest magnitude), exact zeros in grey (padding, empty slots). Returns the image."""
    import numpy as np

    img = t.detach().float().cpu().numpy()
    vmax = vmax or float(np.abs(img).max()) or 1.0
    cmap = matplotlib.colormaps["coolwarm"].with_extremes(bad=_EMPTY)
    return ax.imshow(np.ma.masked_where(img == 0, img), cmap=cmap, vmin=-vmax, vmax=vmax, aspect="auto",
                     interpolation="nearest")


def _buffer_image(ax, t, title: str, inner: str, outer_name: str, half: int | None = None,
                  vmax: float | None = None):
    S, X, A, B = t.shape
    image = _zeros_grey_image(ax, t.reshape(S * X * A, B), vmax)
    for k in range(1, S * X):
        ax.axhline(k * A - 0.5, color="black", lw=2.2 if k % X == 0 else 0.8)
    if half is not None:  # the gate rows above, the up rows below
        for k in range(S * X):
            ax.axhline(k * A + half - 0.5, color="#2ca02c", lw=1.4, ls="--")
    ax.set_yticks([(k + 0.5) * A - 0.5 for k in range(S * X)])
    ax.set_yticklabels([f"slot {k // X}, {outer_name} {k % X}" for k in range(S * X)], fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel(inner, fontsize=9)
    ax.set_title(title, fontsize=9)
    return image


def pool_figure(pool, note: str = "") -> Figure:
    """The four buffers of a ``LoRAPool`` as images on **one** colour scale (the colour
    bar): thick lines between slots, thin between experts, green dashes between the
    gate rows and the up rows; grey cells are zeros (empty slots and rank padding).
    ``note``: a line printed on the figure (e.g. that a rank was clipped)."""
    g = pool.geometry
    O = "expert" if not g.shared_outer else "shared"
    buffers = pool.buffers()
    vmax = max(float(b.detach().abs().max()) for b in buffers) or 1.0
    fig, axes = _subplots(1, 4, figsize=(13.5, 4.6), constrained_layout=True)
    _buffer_image(axes[0], buffers[0], f"gate-up A {list(g.gate_up_a)}\n[S, O, 2R, H]",
                  "H (hidden)", O, half=g.rank, vmax=vmax)
    _buffer_image(axes[1], buffers[1], f"gate-up B {list(g.gate_up_b)}\n[S, n, 2F, R]", "R (rank)",
                  "expert", half=g.intermediate, vmax=vmax)
    _buffer_image(axes[2], buffers[2], f"down A {list(g.down_a)}\n[S, n, R, F]", "F (intermediate)", "expert",
                  vmax=vmax)
    image = _buffer_image(axes[3], buffers[3], f"down B {list(g.down_b)}\n[S, O, H, R]", "R (rank)", O, vmax=vmax)
    axes[0].set_ylabel("rows of each slot and expert, top to bottom", fontsize=9)
    fig.colorbar(image, ax=axes, shrink=0.8, label="value (one scale for all four buffers)")
    layout = "shared outer (O = 1)" if g.shared_outer else f"per-expert outer (O = n = {g.n})"
    fig.suptitle(f"LoRA pool, {layout}, max rank R={g.rank}, slot ranks {pool.lora_ranks}; "
                 "green dashes: gate rows above, up rows below; grey: zero", fontsize=10)
    if note:
        fig.supxlabel(note, color="#b00020", fontsize=10)
    return fig


def derived_operands_figure(sink, slot: int = 0) -> Figure:
    """``w1_delta[slot] [n*2F, 2R]`` and ``a_cat[slot] [R, n*F]`` of a shared-outer module."""
    if sink.w1_delta is None:
        raise ValueError("derived operands exist only after set_lora_info with a shared-outer pool")
    n, F = sink.n_shared_experts, sink.intermediate_size
    R = sink.a_cat.shape[1]
    fig, axes = _subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1, 2.2]},
                             constrained_layout=True)
    vmax = max(float(sink.w1_delta[slot].abs().max()), float(sink.a_cat[slot].abs().max())) or 1.0
    for ax, t, title in ((axes[0], sink.w1_delta[slot], f"w1_delta[{slot}]  [n*2F, 2R]"),
                         (axes[1], sink.a_cat[slot], f"a_cat[{slot}]  [R, n*F]")):
        image = _zeros_grey_image(ax, t, vmax)
        ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=axes, shrink=0.85, label="value (one scale; grey: zero)")
    axes[0].axvline(R - 0.5, color="black")
    axes[0].set_xlabel("column: the 2R shrink outputs")
    axes[0].set_xticks([R / 2 - 0.5, R + R / 2 - 0.5], ["gate shrink", "up shrink"])
    axes[0].set_ylabel("row of y (sink layout)")
    for e in range(1, n):
        axes[0].axhline(e * 2 * F - 0.5, color="black", lw=1.5)
        axes[1].axvline(e * F - 0.5, color="black", lw=1.5)
    axes[1].set_xlabel("expert-major features e*F + f: one GEMM sums the experts")
    axes[1].set_ylabel("rank r")
    axes[1].set_yticks(range(R))
    layout = "interleaved" if sink.interleaved else "contiguous"
    fig.suptitle(f"Derived operands ({layout} base): each y row takes gate B from the gate shrink or up B "
                 "from the up shrink", fontsize=10)
    return fig

# -- adapters -------------------------------------------------------------------

_STAGE_COLORS = {"file": "#8c8c8c", "normalized": "#3b7dd8", "pool": "#2a9d8f"}


def _blocks(ax, x0: float, shape: list[int], color: str, gap: float, halves: bool = False
            ) -> tuple[float, float]:
    """Draw a shape as matrices (rows down, columns across): ``[a, b]`` one, ``[k, a, b]``
    k side by side, ``[S, O, a, b]`` S rows of O; ``halves``: a dashed line between the
    gate rows and the up rows. Returns the right and bottom edges."""
    *outer, rows, cols = shape
    grid = outer if len(outer) == 2 else [1, outer[0] if outer else 1]
    for i in range(grid[0]):
        for j in range(grid[1]):
            x, y = x0 + j * (cols + gap), i * (rows + gap)
            ax.add_patch(Rectangle((x, y), cols, rows, facecolor=color, edgecolor="black", lw=0.6, alpha=0.85))
            if halves:
                ax.plot([x, x + cols], [y + rows / 2] * 2, color="white", lw=1.2, ls="--")
    return x0 + grid[1] * (cols + gap), grid[0] * (rows + gap)


# (rows, columns) of each buffer's matrices, per stage: what the axes of the journey figure are.
_JOURNEY_AXES = {
    "file": {"gate_up_a": ("r", "H"), "gate_up_b": ("n·F (experts stacked)", "r"),
             "down_a": ("r", "n·F (experts side by side)"), "down_b": ("H", "r")},
    "normalized": {"gate_up_a": ("2r: gate, up", "H"), "gate_up_b": ("2F: gate, up", "r"),
                   "down_a": ("r", "F"), "down_b": ("H", "r")},
    "pool": {"gate_up_a": ("2R: gate, up", "H"), "gate_up_b": ("2F: gate, up", "R"),
             "down_a": ("R", "F"), "down_b": ("H", "R")},
}
_JOURNEY_BLOCKS = {"file": "one matrix per PEFT factor", "normalized": "one block per expert (O or n)",
                   "pool": "slot 0: one block per expert"}


def adapter_journey_figure(journey: list[dict], title: str = "") -> Figure:
    """Each pool buffer's way from the PEFT file (grey: its 2D factors), through
    upstream's normalization (blue: ``[O or n, ...]``) to the pool (green:
    ``[S, O or n, ...]``), all drawn to one scale, with arrows from stage to stage and
    each panel's axes named. ``journey``: ``DoctorReport.journey[module]``."""
    from matplotlib.patches import ConnectionPatch

    from .validate import PRETTY

    stages = ("file", "normalized", "pool")
    fig, axes = _subplots(len(journey), 3, figsize=(12, 2.4 * len(journey)), constrained_layout=True,
                             squeeze=False)
    extent = [1.0, 1.0]
    for r, row in enumerate(journey):
        cells = {"file": row["peft"], "normalized": [("normalized", row["normalized"])],
                 "pool": [("pool", row["pool"])]}
        for c, stage in enumerate(stages):
            ax, x, bottom, labels = axes[r, c], 0.0, 0.0, []
            for label, shape in cells[stage]:
                if shape is None:
                    ax.text(0.5, 0.5, "fails before here", color="#b00020", ha="center", va="center",
                            transform=ax.transAxes, fontsize=9)
                    continue
                stacked = stage != "file" and row["buffer"].startswith("gate_up")
                right, low = _blocks(ax, x, shape, _STAGE_COLORS[stage], gap=0.6, halves=stacked)
                labels.append(f"{label} {shape}" if stage == "file" else str(shape))
                x, bottom = right + 1.5, max(bottom, low)
            extent = [max(extent[0], x), max(extent[1], bottom)]
            failed = any(shape is None for _, shape in cells[stage])
            ax.set_title("\n".join(labels) or ("" if failed else "(none: zeros)"), fontsize=8)
            rows_name, cols_name = _JOURNEY_AXES[stage].get(row["buffer"], ("rows", "columns"))
            ax.set_xlabel(f"columns: {cols_name}   ({_JOURNEY_BLOCKS[stage]})", fontsize=8)
            ax.set_ylabel(f"rows: {rows_name}", fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
            for spine in ax.spines.values():
                spine.set_visible(False)
        axes[r, 0].text(-0.12, 0.5, PRETTY[row["buffer"]], transform=axes[r, 0].transAxes, ha="right",
                        va="center", fontsize=10, fontweight="bold")
        for c in range(2):  # file -> normalized -> pool
            fig.add_artist(ConnectionPatch((0.92, 0.85), (0.0, 0.85), "axes fraction", "axes fraction",
                                           axesA=axes[r, c], axesB=axes[r, c + 1], arrowstyle="-|>",
                                           mutation_scale=16, lw=1.6, color="#444444"))
    for ax in axes.flat:
        ax.set_xlim(-0.5, extent[0])
        ax.set_ylim(extent[1], -0.5)  # rows grow downwards, as in a printed matrix
        ax.set_aspect("equal")
    for c, name in enumerate(("in the PEFT file (2D)", "after upstream's normalization", "in the pool, slot 0")):
        axes[0, c].annotate(name, (0.5, 1.0), xytext=(0, 28), xycoords="axes fraction", textcoords="offset points",
                            ha="center", fontsize=10, color=_STAGE_COLORS[stages[c]], fontweight="bold")
    fig.suptitle((title + "\n" if title else "") + "grey → blue → green: the same factors at each stage, all "
                 "to one scale; dashed: gate rows above, up rows below", fontsize=10)
    return fig

# -- forward and profiling ----------------------------------------------------

_SLOT_COLORS = ("#3b7dd8", "#e8893a", "#4caf50", "#9c27b0", "#e53935", "#00897b", "#8d6e63", "#fdd835")
_BACKEND_STYLE = {"triton": ("#d62728", "o", "triton (ours)"), "torch": ("#1f77b4", "s", "torch backend"),
                  "cublas_base": ("#7f7f7f", "^", "cuBLAS base only (no LoRA)")}


def _slot_color(slot: int) -> str:
    return "#d9d9d9" if slot < 0 else _SLOT_COLORS[slot % len(_SLOT_COLORS)]


def batch_figure(batch) -> Figure:
    """A ``SlotBatch`` drawn: each token's slot in arrival order, then the segments the
    kernels see (grouped order when the batch carries a permutation)."""
    slots = batch.token_slots().tolist()
    T = len(slots)
    lengths = _segment_lengths(batch.seg_indptr)
    fig, axes = _subplots(2, 1, figsize=(max(6.0, 0.45 * T + 2), 2.9), constrained_layout=True)
    for t, s in enumerate(slots):
        axes[0].add_patch(Rectangle((t, 0), 0.92, 1, color=_slot_color(s)))
        axes[0].text(t + 0.46, 0.5, "-" if s < 0 else str(s), ha="center", va="center", fontsize=8)
    axes[0].set_title("tokens in arrival order (number: slot; grey '-': base model only)", loc="left", fontsize=9)
    order = batch.permutation.tolist() if batch.permutation is not None else list(range(T))
    x = 0
    for g, length in enumerate(lengths):
        s = int(batch.weight_indices[g])
        rank = int(batch.lora_ranks[s]) if s >= 0 else 0
        for i in range(length):
            axes[1].add_patch(Rectangle((x + i, 0), 0.92, 1, color=_slot_color(s), alpha=0.35 if rank == 0 else 1))
            axes[1].text(x + i + 0.46, 0.5, f"t{order[x + i]}", ha="center", va="center", fontsize=7)
        axes[1].add_patch(Rectangle((x - 0.05, -0.08), length, 1.16, fill=False, lw=1.6))
        label = "base" if s < 0 else f"slot {s}" + (" (rank 0: skipped)" if rank == 0 else "")
        axes[1].text(x + length / 2, 1.3, label, ha="center", fontsize=8)
        x += length
    grouped = "grouped by slot (permutation)" if batch.permutation is not None else "contiguous runs"
    axes[1].set_title(f"segments: seg_indptr = {batch.seg_indptr.tolist()}, {grouped}", loc="left", fontsize=9)
    for ax in axes:
        ax.set_xlim(-0.2, max(T, 1) + 0.2)
        ax.set_ylim(-0.2, 1.6)
        ax.axis("off")
    return fig


def _segment_lengths(indptr) -> list[int]:
    """Segment lengths from ``seg_indptr`` (a plain list, for drawing)."""
    values = [int(v) for v in indptr]
    return [b - a for a, b in zip(values, values[1:])]


def roofline_figure(copy_TBps: float, matmul_TFLOPs: float, points: list[tuple[str, float, float]] | None = None
                    ) -> Figure:
    """The roofline: attainable TFLOP/s against arithmetic intensity (FLOP per byte),
    with ``points`` ``(label, intensity, achieved TFLOP/s)`` placed on it."""
    import numpy as np

    ridge = matmul_TFLOPs / copy_TBps
    ai = np.logspace(-1, 4, 200)
    fig, ax = _subplots(figsize=(7.5, 4.2), constrained_layout=True)
    ax.loglog(ai, np.minimum(ai * copy_TBps, matmul_TFLOPs), color="black", lw=2)
    ax.axvline(ridge, color="grey", ls=":", lw=1)
    ax.text(ridge * 1.1, matmul_TFLOPs * 0.08, f"ridge: {ridge:.0f} FLOP/B", fontsize=8, color="grey")
    ax.text(0.15, 0.15 * copy_TBps * 1.5, f"memory roof {copy_TBps:.2f} TB/s", rotation=28, fontsize=8)
    ax.text(ridge * 3, matmul_TFLOPs * 1.15, f"matmul roof {matmul_TFLOPs:.0f} TFLOP/s", fontsize=8)
    for label, intensity, achieved in points or []:
        ax.plot(intensity, achieved, "o", ms=6)
        ax.annotate(label, (intensity, achieved), textcoords="offset points", xytext=(5, -12), fontsize=7)
    ax.set_xlabel("arithmetic intensity (useful FLOPs / minimal bytes)")
    ax.set_ylabel("TFLOP/s")
    ax.set_ylim(0.05, matmul_TFLOPs * 2)
    ax.set_title("Roofline of one forward: few tokens are memory-bound, many tokens compute-bound", fontsize=10)
    return fig


def profile_grid_figure(record: dict, shape: str = "B", R: int = 64, S: int = 4) -> Figure:
    """A recorded grid: median µs against tokens per backend, the roofline, the
    targets and upstream's recorded numbers (left); each backend over the roofline (right)."""
    from .profile import TARGET_LARGE_T, TARGET_SMALL_T, issue4_upstream

    rows = [r for r in record["records"] if (r["case"]["shape"], r["case"]["R"], r["case"]["S"]) == (shape, R, S)]
    if not rows:
        raise ValueError(f"the record has no points for shape {shape}, R={R}, S={S}")
    fig, (ax, ax2) = _subplots(1, 2, figsize=(12, 4.4), constrained_layout=True)
    backends = sorted({r["backend"] for r in rows}, key=list(_BACKEND_STYLE).index)
    for b in backends:
        pts = sorted((r["case"]["T"], r["median_us"], r["ratio"]) for r in rows if r["backend"] == b)
        color, marker, label = _BACKEND_STYLE.get(b, ("black", "x", b))
        ax.loglog([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, label=label, ms=4)
        ax2.semilogx([p[0] for p in pts], [p[2] for p in pts], marker=marker, color=color, label=label, ms=4)
    roof = sorted({(r["case"]["T"], r["roofline_us"]) for r in rows})
    ax.loglog([p[0] for p in roof], [p[1] for p in roof], color="black", lw=2, label="roofline")
    for T, us in ((T, us) for T, us in roof if T <= 32):
        ax.plot(T, TARGET_SMALL_T * us, "_", color="green", ms=10)
    for T, us in ((T, us) for T, us in roof if T >= 2048):
        ax.plot(T, TARGET_LARGE_T * us, "_", color="green", ms=10)
    ax.plot([], [], "_", color="green", ms=10, label=f"target ({TARGET_SMALL_T:g}x / {TARGET_LARGE_T:g}x roofline)")
    issue4 = issue4_upstream()
    up = [(row[1], row[4]) for row in issue4.rows if (row[0], row[2], row[3]) == (shape, S, R)]
    if up:
        ax.plot(*zip(*up), "*", color="purple", ms=12, label="upstream sglang 0.5.23, multi-slot")
    single = [(T, us) for (sh, T), us in issue4.one_slot.items() if sh == shape]
    if single:
        ax.plot(*zip(*single), "P", color="purple", ms=9, mfc="none", label="upstream single-slot cuBLAS")
    ax.set_xlabel("tokens T")
    ax.set_ylabel("median µs (CUDA graph, L2 flushed)")
    ax.set_title(f"shape {shape}: n {rows[0]['case']['n']}, H {rows[0]['case']['H']}, F {rows[0]['case']['F']}; "
                 f"R {R}, S {S}", fontsize=10)
    ax.legend(fontsize=7)
    ax2.axhline(1, color="black", lw=2)
    ax2.hlines(TARGET_SMALL_T, 1, 32, color="green")
    ax2.hlines(TARGET_LARGE_T, 2048, 8192, color="green")
    ax2.set_yscale("log")
    ax2.set_xlabel("tokens T")
    ax2.set_ylabel("measured / roofline (1 = the hardware limit)")
    ax2.set_title("distance from the roofline (green: the target)", fontsize=10)
    env = record["environment"]
    fig.suptitle(f"{env['device']}, torch {env['torch']}, triton {env['triton']}, {env['date'][:10]}", fontsize=9)
    return fig


def side_by_side_figure(record: dict, R: int = 64, S: int = 4, flush: str = "read") -> Figure:
    """A side-by-side record at one rank and slot count: for each shape, the kit's time and sglang's
    LoRA paths' times over sglang's own forward without LoRA, against tokens (below 1: faster than
    upstream serving no adapter at all), with issue 26's targets marked; dashed, the kit with the
    used slots' merges kept (``kit_kept``), where the record has it. sglang's three paths are the
    record's ``sglang_multi``, ``sglang_one_slot`` and ``sglang_base``: the wheel's ``forward_with_lora``
    (``srt/lora/trtllm_lora_temp/inkling_dense.py``) as ``upstream_wheel.UpstreamSink`` runs it."""
    from .profile import SIDE_SHAPES, TARGET_VS_BASE_LARGE_T, side_by_side_rows

    rows = [r for r in side_by_side_rows(record, flush) if (r["R"], r["S"]) == (R, S)]
    if not rows:
        raise ValueError(f"the record has no points at R={R}, S={S}")
    kept = [r for r in side_by_side_rows(record, flush, "kit_kept") if (r["R"], r["S"]) == (R, S)]
    fig, axes = _subplots(1, len(SIDE_SHAPES), figsize=(3.4 * len(SIDE_SHAPES), 4.2), sharey=True,
                          constrained_layout=True)
    lines = {"kit_us": ("the kit (triton)", "#d62728", "o"), "sglang_multi_us": ("sglang multi-slot", "purple", "*"),
             "sglang_one_slot_us": ("sglang one-slot cuBLAS", "purple", "P")}
    for ax, shape in zip(axes, SIDE_SHAPES):
        pts = sorted((r for r in rows if r["shape"] == shape), key=lambda r: r["T"])
        for key, (label, color, marker) in lines.items():
            xy = [(r["T"], r[key] / r["sglang_base_us"]) for r in pts if r[key] and r["sglang_base_us"]]
            if xy:
                ax.semilogx(*zip(*xy), marker=marker, color=color, ms=5, label=label, base=2,
                            lw=2 if key == "kit_us" else 1, mfc="none" if key != "kit_us" else color)
        xy = [(r["T"], r["vs_base"]) for r in sorted(kept, key=lambda r: r["T"]) if r["shape"] == shape and r["vs_base"]]
        if xy:  # the kit with each used slot's merge kept (keep_merged), where the record timed it
            ax.semilogx(*zip(*xy), marker="s", color="#d62728", ls="--", ms=4, mfc="none", base=2, lw=1.2,
                        label="the kit, merges kept (opt-in)")
        ax.axhline(1, color="black", lw=1.5)
        ax.axhspan(0, 1, color="green", alpha=0.06)
        ax.hlines(TARGET_VS_BASE_LARGE_T, 2048, 8192, color="green", lw=2)
        ax.set_title(f"{shape}: n {pts[0]['n']}, H {pts[0]['H']}, F {pts[0]['F']}", fontsize=9)
        ax.set_xlabel("tokens T")
    low = min([0.8] + [r["vs_base"] for r in rows + kept if r["vs_base"]])
    axes[0].set_ylim(low * 0.9, None)  # the shaded band starts just under the fastest point, not at 0
    axes[0].set_ylabel("time / sglang without LoRA")
    axes[0].text(16, 0.98, "faster than sglang without LoRA", fontsize=7, color="green", va="top")
    axes[-1].plot([], [], color="green", lw=2, label=f"target at T >= 2048 ({TARGET_VS_BASE_LARGE_T:g}x)")
    handles = {h.get_label(): h for ax in axes for h in ax.get_lines() if not h.get_label().startswith("_")}
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=len(handles), fontsize=8)
    env = record["environment"]
    fig.suptitle(f"R {R}, S {S}, L2 flush {flush}: {env['device']}, commit {env['git_commit'][:7]}, "
                 f"{env['date'][:10]}", fontsize=9)
    return fig


_SLOT_COST_STYLE = {"v9": ("the loop over a tile's slots", "#1f77b4", "o", "-"),
                    "pdl": ("the loop, PDL", "#1f77b4", "s", ":"),
                    "gather_v9": ("each token's own slot (v28)", "#d62728", "o", "-"),
                    "gather": ("each token's own slot, PDL", "#d62728", "s", ":"),
                    "sglang_base": ("sglang without LoRA", "black", "", "--")}


def slot_cost_figure(record: dict, R: int = 16, T: int = 8) -> Figure:
    """What more adapters in one decode batch cost: for each shape, the median µs of the kit's three
    weight-streaming launches against the number of slots the ``T`` tokens use, at rank ``R``, for each
    way the record timed the LoRA epilogues (looping over the slots a tile of tokens holds, or reading
    each token's own slot's factors, each with and without PDL), beside sglang's forward without LoRA
    (``sglang_base``: ``forward_with_lora`` of ``srt/lora/trtllm_lora_temp/inkling_dense.py`` with no
    active adapter, as ``upstream_wheel.UpstreamSink`` runs it). ``record``: one of ``scripts/gpu/h200_pdl.py --gather`` (``points`` of shape, R, S, T and ``us``)."""
    rows = [p for p in record["points"] if (p["R"], p["T"]) == (R, T)]
    if not rows:
        raise ValueError(f"the record has no points at R={R}, T={T}")
    shapes = list(dict.fromkeys(p["shape"] for p in rows))
    fig, axes = _subplots(1, len(shapes), figsize=(3.3 * len(shapes), 3.9), constrained_layout=True, squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        pts = sorted((p for p in rows if p["shape"] == shape), key=lambda p: p["S"])
        for key, (label, color, marker, ls) in _SLOT_COST_STYLE.items():
            xy = [(p["S"], p["us"][key]) for p in pts if key in p["us"]]
            if xy:
                ax.plot(*zip(*xy), marker=marker, color=color, ls=ls, ms=5, label=label,
                        lw=2 if key == "gather_v9" else 1.2)
        ax.set_xticks([p["S"] for p in pts])
        ax.set_ylim(0, None)  # from zero: the slots' cost is read against the whole forward
        ax.set_xlabel("slots the tokens use")
        ax.set_title(shape, fontsize=9)
    axes[0][0].set_ylabel("median µs (CUDA graph, L2 flushed)")
    handles = {h.get_label(): h for ax in axes[0] for h in ax.get_lines() if not h.get_label().startswith("_")}
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=3, fontsize=8)
    env = record["environment"]
    fig.suptitle(f"{T} tokens, rank {R}: {env['device']}, commit {env['git_commit'][:7]}, {env['date'][:10]}",
                 fontsize=9)
    return fig


_LORA_COST_BARS = (("sglang_base", "sglang,\nno LoRA", "black"), ("kit", "the kit,\nLoRA", "#d62728"),
                   ("upact_cublas_base", "kept merge's\nlaunches", "#1f77b4"))


def lora_cost_figure(record: dict, T: int = 8) -> Figure:
    """Where the default kit's few-token gap to sglang's base goes (v33b): for each shape at ``T`` tokens of one
    slot, sglang's forward without LoRA (``forward_with_lora`` of ``srt/lora/trtllm_lora_temp/inkling_dense.py``
    with no active adapter), the kit's forward with the LoRA as a stack of its own launches without it
    (``kit_bare_base``) and what the LoRA adds (``auto`` minus that), and the two launches the kit runs on a kept
    merge (``upact_cublas_base``: no LoRA work at all). ``record``: ``scripts/gpu/h200_pdl.py --bare --up-act``'s
    (``points`` of shape, R, S, T and ``us``, with those four contenders)."""
    need = {"sglang_base", "auto", "kit_bare_base", "upact_cublas_base"}
    rows = [p for p in record["points"] if p["T"] == T and p["S"] == 1 and need <= set(p["us"])]
    if not rows:
        raise ValueError(f"the record has no one-slot points at T={T} with {sorted(need)} timed (h200_pdl.py --bare --up-act)")
    fig, axes = _subplots(1, len(rows), figsize=(2.9 * len(rows), 3.8), constrained_layout=True, squeeze=False)
    for ax, p in zip(axes[0], rows):
        us = p["us"]
        bare, lora = us["kit_bare_base"], us["auto"] - us["kit_bare_base"]
        for i, (key, label, color) in enumerate(_LORA_COST_BARS):
            if key == "kit":
                ax.bar(i, bare, color="#f4a6a6", edgecolor=color, label="the kit's launches without the LoRA")
                ax.bar(i, lora, bottom=bare, color=color, label="what the LoRA adds")
                ax.annotate(f"+{lora:.1f} µs", (i, bare + lora), ha="center", va="bottom", fontsize=8)
            else:
                ax.bar(i, us[key], color=color, label=label.replace("\n", " "))
        ax.axhline(us["sglang_base"], color="black", ls="--", lw=0.8)
        ax.set_xticks(range(len(_LORA_COST_BARS)), [label for _, label, _ in _LORA_COST_BARS], fontsize=7)
        ax.set_ylim(0, 1.12 * max(us["auto"], us["sglang_base"]))  # from zero: the LoRA's share of the whole
        ax.set_title(f"{p['shape']}, R {p['R']}", fontsize=9)
    axes[0][0].set_ylabel("median µs (CUDA graph, L2 flushed)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, fontsize=8)
    env = record["environment"]
    fig.suptitle(f"{T} tokens of one adapter: {env['device']}, commit {env['git_commit'][:7]}, {env['date'][:10]}",
                 fontsize=9)
    return fig


def kernel_breakdown_figure(record: dict, backend: str = "triton") -> Figure:
    """Where the time goes: the profiler's kernels per forward, one bar per probed case."""
    tables = [t for t in record["kernel_tables"] if t["backend"] == backend]
    if not tables:
        raise ValueError(f"the record has no kernel table for backend {backend!r}")
    fig, axes = _subplots(1, len(tables), figsize=(3.2 * len(tables), 3.6), constrained_layout=True)
    for ax, t in zip(list(axes) if len(tables) > 1 else [axes], tables):
        rows = t["kernels"][:6]
        names = [_short_kernel(r["kernel"]) for r in rows]
        ax.barh(range(len(rows)), [r["us_per_forward"] for r in rows], color="#d62728")
        ax.set_yticks(range(len(rows)), names, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("µs per forward", fontsize=8)
        c = t["case"]
        ax.set_title(f"{c['shape']}, T={c['T']}, S={c['S']}, R={c['R']}", fontsize=9)
    fig.suptitle(f"torch.profiler: the {backend} backend's kernels (warm L2, no graph)", fontsize=10)
    return fig


def _short_kernel(name: str) -> str:
    if name.startswith("nvjet") or "gemm" in name.lower():
        return "cuBLAS GEMM" + (" (+C)" if "badd" in name else "")
    return name.replace("void ", "").split("<")[0][:28]

# -- tensor parallelism -------------------------------------------------------

def tp_shards_figure(owners: dict, interleaved: bool = True) -> Figure:
    """Which rank holds what, from ``parallel.shard_owners(n, F, tp, interleaved)``:
    the rows of ``w13`` and gate-up B, the feature columns of ``w2`` and down A, one
    colour per rank; the outer factors are replicated."""
    from .sink import gate_up_rows

    n, two_f = owners["w13"].shape
    F = two_f // 2
    tp = int(owners["w13"].max()) + 1
    colors = matplotlib.colormaps["tab10"]
    gate_w13 = set(gate_up_rows(F, interleaved)[0].tolist())
    rows = [(f"w13 [n, 2F, H] rows ({'interleaved' if interleaved else 'contiguous'}): the gate and up rows of "
             "the rank's features", owners["w13"], lambda i: ("g" if i in gate_w13 else "u")
             + str(i // 2 if interleaved else i % F)),
            ("gate-up B [S, n, 2F, R] rows (always [gate ‖ up]): cut in two places", owners["gate_up_b"], lambda i: ("g" if i < F else "u") + str(i % F)),
            ("w2 [n, H, F] feature columns: cut along F", owners["w2"], str),
            ("down A [S, n, R, F] feature columns: cut along F", owners["down_a"], str)]
    fig, axes = _subplots(len(rows) + 1, 1, figsize=(10, 5.6), constrained_layout=True,
                             gridspec_kw={"height_ratios": [1] * len(rows) + [0.45]})
    for ax, (title, own, label) in zip(axes, rows):
        width = own.shape[1]
        for e in range(n):
            for i in range(width):
                x = e * (width + 1) + i
                ax.add_patch(Rectangle((x, 0), 0.92, 1, color=colors(int(own[e, i]) % 10)))
                if n * width <= 64:
                    ax.text(x + 0.46, 0.5, label(i), ha="center", va="center", color="white", fontsize=7)
            ax.text(e * (width + 1) + width / 2, 1.15, f"expert {e}", ha="center", fontsize=8)
        ax.set_xlim(-0.2, n * (width + 1))
        ax.set_ylim(0, 1.5)
        ax.set_axis_off()
        ax.set_title(title, loc="left", fontsize=9)
    last = axes[-1]
    last.add_patch(Rectangle((0, 0), 1, 1, color="#bbbbbb", transform=last.transAxes))
    last.text(0.5, 0.5, "gate-up A [S, O, 2R, H] and down B [S, O, H, R]: replicated, every rank holds all",
              ha="center", va="center", fontsize=9, transform=last.transAxes)
    last.set_axis_off()
    handles = [Rectangle((0, 0), 1, 1, color=colors(r % 10)) for r in range(tp)]
    fig.legend(handles, [f"rank {r}" for r in range(tp)], loc="outside lower center", ncols=tp, fontsize=8)
    layout = "interleaved" if interleaved else "contiguous"
    fig.suptitle(f"Tensor parallelism, tp={tp}: each rank holds F/tp = {F // tp} of every expert's F={F} "
                 f"features ({layout} w13; g = gate, u = up)", fontsize=10)
    return fig


def allreduce_cost_figure(costs: list) -> Figure:
    """Bytes each rank sends per token for the sink's one all-reduce, from a list of
    ``parallel.AllReduceCost``, grouped by hidden size; the LoRA adds none."""
    import numpy as np

    from .records import dtype_name

    hiddens = sorted({c.hidden for c in costs})
    tps = sorted({c.tp for c in costs})
    fig, ax = _subplots(figsize=(8, 3.6), constrained_layout=True)
    width = 0.8 / len(hiddens)
    for k, hidden in enumerate(hiddens):
        by_tp = {c.tp: c for c in costs if c.hidden == hidden}
        xs = np.arange(len(tps)) + k * width
        values = [by_tp[t].sent_per_rank / 1024 if t in by_tp else 0 for t in tps]
        bars = ax.bar(xs, values, width, label=f"H={hidden}")
        ax.bar_label(bars, [f"{v:.1f}" for v in values], fontsize=8)
    dtype = dtype_name(costs[0].dtype)
    ax.set_xticks(np.arange(len(tps)) + width * (len(hiddens) - 1) / 2, [f"tp={t}" for t in tps])
    ax.set_ylabel("KiB sent per rank per token")
    ax.set_title(f"The one all-reduce per sink call ({dtype}, ring): 2(tp-1)/tp x H x itemsize per token;\n"
                 "LoRA partials ride the same all-reduce: 0 extra bytes", fontsize=10)
    ax.legend(fontsize=8)
    return fig


# -- the per-expert outer defect ----------------------------------------------

def _feature_labels(intermediate: int, interleaved: bool) -> list[str]:
    """Names of one expert's ``y`` columns in the sink's layout: ``g0, u0, ...`` or ``g0.., u0..``."""
    from .sink import gate_up_rows

    labels = [""] * (2 * intermediate)
    gate, up = gate_up_rows(intermediate, interleaved)
    for f in range(intermediate):
        labels[int(gate[f])], labels[int(up[f])] = f"gate {f}", f"up {f}"
    return labels


def gate_up_routing_figure(intermediate: int = 4, interleaved: bool = True) -> Figure:
    """Which gate-up B row reaches which ``y`` column, through which shrink: the intended
    math next to what sglang 0.5.23 computes for a per-expert outer pool (one expert)."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    from .upstream_defect import gate_up_routing

    F = intermediate
    intended = gate_up_routing(F, interleaved, "intended")
    upstream = gate_up_routing(F, interleaved, "sglang_0_5_23")
    cmap = ListedColormap([_EMPTY, _GATE, _UP])
    y_labels = _feature_labels(F, interleaved)
    b_labels = [f"gate B {f}" for f in range(F)] + [f"up B {f}" for f in range(F)]
    fig, axes = _subplots(1, 2, figsize=(11, 5.2), constrained_layout=True)
    panels = ((axes[0], intended, "intended (the adapter's math)"),
              (axes[1], upstream, "sglang 0.5.23, per-expert outer"))
    for ax, routing, title in panels:
        ax.imshow(routing.numpy(), cmap=cmap, vmin=0, vmax=2, interpolation="nearest")
        ax.set_xticks(range(2 * F), b_labels, rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(2 * F), y_labels, fontsize=8)
        ax.axvline(F - 0.5, color="black", lw=0.8)
        ax.set_xlabel("row of gate-up B [gate ‖ up]")
        ax.set_title(title, fontsize=10)
    axes[0].set_ylabel("column of y (the activation input, sink layout)")
    wrong = (upstream != 0) & (upstream != intended)
    for c, k in wrong.nonzero().tolist():
        axes[1].text(k, c, "✗", ha="center", va="center", color="#c0392b", fontsize=11, weight="bold")
    fig.legend(handles=[Patch(color=_GATE, label="fed by the gate shrink (gate A)"),
                        Patch(color=_UP, label="fed by the up shrink (up A)")],
               loc="lower center", ncol=2, bbox_to_anchor=(0.5, -0.06))
    layout = "interleaved" if interleaved else "contiguous"
    fig.suptitle(f"Where each B row lands ({layout} base, F={F}): {int(wrong.sum())} of {2 * F} rows land "
                 "wrong or through the wrong shrink (✗); up A is never read", fontsize=10)
    return fig


def defect_outputs_figure(report) -> Figure:
    """A ``DefectReport``'s intended and sglang 0.5.23 sink outputs ``[T, H]`` side by side
    on one colour scale, and their difference as a heatmap."""
    if report.intended is None or report.upstream is None:
        raise ValueError(f"{report.what}: nothing was computed (shared outer, or no adapter loaded)")
    intended, upstream = report.intended.float().numpy(), report.upstream.float().numpy()
    diff = upstream - intended
    vmax = float(max(abs(intended).max(), abs(upstream).max(), abs(diff).max())) or 1.0
    fig, axes = _subplots(1, 3, figsize=(13, 4), sharey=True, constrained_layout=True)
    panels = ((intended, "intended output (the kit's forward)"), (upstream, "sglang 0.5.23's output"),
              (diff, f"difference: relative error {report.relative_error:.2f}"))
    for ax, (img, title) in zip(axes, panels):
        im = ax.imshow(img, cmap="coolwarm", vmin=-vmax, vmax=vmax, aspect="auto", interpolation="nearest")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("hidden feature h")
    axes[0].set_ylabel("token")
    fig.colorbar(im, ax=axes, shrink=0.85, label="value (one scale for all three)")
    fig.suptitle(f"{report.what}, per-expert outer (O = {report.outer}): the sink output for "
                 f"{report.tokens} random tokens", fontsize=10)
    return fig


def kernel_reads_figure(intermediate: int = 4, rank: int = 2, interleaved: bool = True) -> Figure:
    """Which rows of one expert's gate-up A ``[2R, H]`` and gate-up B ``[2F, R]`` the
    program writing each ``y`` column reads (blue: through the gate shrink, orange:
    the up shrink), intended next to sglang 0.5.23's per-expert path; ✗: a read the
    intended math does not make."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    from .upstream_defect import GATE_SHRINK, UP_SHRINK, gate_up_routing

    F, R = intermediate, rank

    def reads(computed_by: str) -> np.ndarray:
        routing = gate_up_routing(F, interleaved, computed_by).numpy()  # [y column, B row]
        grid = np.zeros((2 * R + 2 * F, 2 * F), dtype=int)  # [pool row (A rows, then B rows), program]
        for column, b_row in zip(*routing.nonzero()):
            shrink = routing[column, b_row]
            a_rows = slice(0, R) if shrink == GATE_SHRINK else slice(R, 2 * R)
            grid[a_rows, column] = shrink
            grid[2 * R + b_row, column] = shrink
        return grid

    intended, upstream = reads("intended"), reads("sglang_0_5_23")
    cmap = ListedColormap([_EMPTY, _GATE, _UP])
    programs = _feature_labels(F, interleaved)
    rows = ([f"A gate {r}" for r in range(R)] + [f"A up {r}" for r in range(R)]
            + [f"B gate {f}" for f in range(F)] + [f"B up {f}" for f in range(F)])
    fig, axes = _subplots(1, 2, figsize=(11, 0.32 * len(rows) + 2.4), sharey=True, constrained_layout=True)
    for ax, grid, title in ((axes[0], intended, "intended: what each program should read"),
                            (axes[1], upstream, "sglang 0.5.23, per-expert outer: what it reads")):
        ax.imshow(grid, cmap=cmap, vmin=0, vmax=2, aspect="auto", interpolation="nearest")
        ax.axhline(2 * R - 0.5, color="black", lw=1.6)
        ax.axhline(R - 0.5, color="black", lw=0.6, ls=":")
        ax.axhline(2 * R + F - 0.5, color="black", lw=0.6, ls=":")
        ax.set_xticks(range(2 * F), [f"y {c}\n{name}" for c, name in enumerate(programs)], fontsize=8)
        ax.set_xlabel("program: the y column it writes (one expert, sink layout)")
        ax.set_title(title, fontsize=10)
    axes[0].set_yticks(range(len(rows)), rows, fontsize=8)
    axes[0].set_ylabel("pool row read: gate-up A [2R, H] above, gate-up B [2F, R] below")
    for row, column in zip(*((upstream != 0) & (upstream != intended)).nonzero()):
        axes[1].text(column, row, "✗", ha="center", va="center", color="#c0392b", fontsize=11, weight="bold")
    fig.legend(handles=[Patch(color=_GATE, label="read for the gate shrink"),
                        Patch(color=_UP, label="read for the up shrink"),
                        Patch(color=_EMPTY, label="not read")],
               loc="outside lower center", ncols=3, fontsize=9)
    layout = "interleaved" if interleaved else "contiguous"
    fig.suptitle(f"Which pool rows each program reads (F={F}, R={R}, {layout} base): upstream never reads "
                 "up A, and reads B row k for y column k", fontsize=10)
    return fig


def lora_forward_path_figure(n: int = 2, hidden: int = 16, intermediate: int = 12, rank: int = 4,
                             tokens: int = 1) -> Figure:
    """One token's path through the shared-outer LoRA forward of one slot ``s``: the
    tensors (boxes, with their shapes) and the operand of each step (arrows, with its
    shape). The base path runs along the middle, the LoRA path above it."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    T, H, F, R = tokens, hidden, intermediate, rank
    nodes = {  # name: (x, y, label)
        "x": (0.0, 1.0, f"x\n[T, H] = [{T}, {H}]"),
        "shrink": (2.4, 2.2, f"shrink\n[T, 2R] = [{T}, {2 * R}]"),
        "y": (4.8, 1.0, f"y (interleaved)\n[T, n·2F] = [{T}, {n * 2 * F}]"),
        "act": (7.2, 1.0, f"act\n[T, n·F] = [{T}, {n * F}]"),
        "mid": (9.6, 2.2, f"mid\n[T, R] = [{T}, {R}]"),
        "out": (12.0, 1.0, f"out\n[T, H] = [{T}, {H}]"),
    }
    edges = [  # (from, to, operand label, LoRA?)
        ("x", "shrink", f"× gate-up A[s, 0]ᵀ\n[H, 2R] = [{H}, {2 * R}]", True),
        ("shrink", "y", f"× w1_delta[s]ᵀ (expand)\n[2R, n·2F] = [{2 * R}, {n * 2 * F}]", True),
        ("x", "y", f"× w13_linᵀ (base)\n[H, n·2F] = [{H}, {n * 2 * F}]", False),
        ("y", "act", "SwiGLU × γ\n(float32)", False),
        ("act", "mid", f"× a_cat[s]ᵀ (down shrink)\n[n·F, R] = [{n * F}, {R}]", True),
        ("act", "out", f"× w2_lin (base)\n[n·F, H] = [{n * F}, {H}]", False),
        ("mid", "out", f"× down B[s, 0]ᵀ (expand)\n[R, H] = [{R}, {H}]", True),
    ]
    fig, ax = _subplots(figsize=(14, 4.8), constrained_layout=True)
    for x, y, label in nodes.values():
        ax.add_patch(FancyBboxPatch((x - 0.75, y - 0.32), 1.5, 0.64, boxstyle="round,pad=0.05",
                                    facecolor="white", edgecolor="black", lw=1.2))
        ax.text(x, y, label, ha="center", va="center", fontsize=9)
    for a, b, label, lora in edges:
        (x0, y0, _), (x1, y1, _) = nodes[a], nodes[b]
        color = _UP if lora else "#444444"
        ax.add_patch(FancyArrowPatch((x0 + 0.8, y0), (x1 - 0.8, y1), arrowstyle="-|>", mutation_scale=16,
                                     color=color, lw=1.8))
        # LoRA labels beside their slanted arrow, outwards; base labels under theirs.
        dx = (-0.75 if y1 > y0 else 0.75) if lora else 0.0
        ax.text((x0 + x1) / 2 + dx, (y0 + y1) / 2 + (0.1 if lora else -0.42), label, ha="center", va="center",
                fontsize=8.5, color=color, bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.9})
    for x in (4.8, 12.0):  # where the LoRA expand is added to the base
        ax.text(x - 0.55, 1.48, "+", fontsize=16, ha="center", color=_UP, weight="bold")
    ax.set_xlim(-1, 13)
    ax.set_ylim(0.2, 2.8)
    ax.set_axis_off()
    ax.set_title(f"One token's path through the LoRA forward, shared outer, slot s (n={n}, H={H}, F={F}, R={R}): "
                 "orange the LoRA path, grey the base", fontsize=10)
    return fig


def export_before_after_figure(report, module: str | None = None) -> Figure:
    """``compare`` of an adapter (slot 0) and its export (slot 1): per expert, how far what
    sglang 0.5.23 serves is from PEFT's delta *of the adapter as trained* (slot 0's PEFT
    column), before the export and after, relative to that delta's size. A slot sglang
    does not load (no ``sglang`` column: its load raises) gets no bar, and says so."""
    module = module or next(m for m, s in report.deltas if s == 0)
    peft = report.deltas[module, 0]["peft"]
    off = {}
    for label, slot in (("before: the adapter as trained", 0), ("after: its export", 1)):
        served = report.deltas[module, slot].get("sglang")
        off[label if served is not None else f"{label} (sglang fails to load it)"] = None if served is None else [
            float((served[e] - peft[e]).norm() / (peft[e].norm() or 1.0)) for e in range(peft.shape[0])]
    fig, ax = _subplots(figsize=(6.5, 3.2), constrained_layout=True)
    width = 0.38
    for i, ((label, values), color) in enumerate(zip(off.items(), ("#dd8452", "#55a868"))):
        xs = [e + (i - 0.5) * width for e in range(peft.shape[0])]
        ax.bar(xs, values or [0.0] * len(xs), width, label=label, color=color)
        for x, v in zip(xs, values or [None] * len(xs)):
            ax.annotate("fails" if v is None else f"{v:.2g}", (x, v or 0.0), ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 1.15 * max([1.0, *(v for values in off.values() for v in values or ())]))
    ax.set_xticks(range(peft.shape[0]), [f"expert {e}" for e in range(peft.shape[0])])
    ax.set_ylabel("‖sglang − peft‖ / ‖peft‖")
    ax.set_title("what sglang 0.5.23 serves, against PEFT's delta of the adapter as trained", fontsize=10)
    ax.legend(fontsize=8)
    return fig


_SELFCHECK_COLORS = {"agree": "#4caf50", "absent": "#bdbdbd", "disagree": "#e53935", "missing": "#e53935"}


def release_table_figure(record: dict) -> Figure:
    """A recorded selfcheck run (``data/releases/selfcheck.json``) as a table: one column
    per sglang release, one row per area; green where the kit agrees with the code in
    that release's wheel (the number: cases run), grey where the wheel has no such code
    and the release table says so, red where they disagree (or the code is missing)."""
    releases = list(record["releases"])
    areas = list(next(iter(record["releases"].values()))["areas"])
    fig, ax = _subplots(figsize=(1.0 + 0.85 * len(releases), 0.8 + 0.45 * len(areas)), constrained_layout=True)
    for j, version in enumerate(releases):
        for i, area in enumerate(areas):
            cell = record["releases"][version]["areas"][area]
            status = cell["status"]
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor=_SELFCHECK_COLORS[status], edgecolor="white", lw=2))
            ax.text(j + 0.5, i + 0.5, str(cell["cases"]) if status == "agree" else
                    {"absent": "none", "disagree": "✗", "missing": "?"}[status], ha="center", va="center", fontsize=8)
    ax.set_xlim(0, len(releases))
    ax.set_ylim(len(areas), 0)
    ax.set_xticks([j + 0.5 for j in range(len(releases))], releases, fontsize=8)
    ax.set_yticks([i + 0.5 for i in range(len(areas))], areas, fontsize=9)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title("the kit against each sglang wheel (green: agrees, the number: cases; grey: no such code)",
                 fontsize=9)
    env = record["environment"]
    ax.set_xlabel(f"sglang release (recorded {env['date'][:10]}, {record['cases_per_area']} cases per area)",
                  fontsize=8)
    return fig
