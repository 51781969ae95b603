"""ipywidgets explorers: thin fronts over pure, seeded functions of the library. Each
returns the widget; the drawing function it drives (``*_figure``, returning the text
and the figure) is tested on its own."""
from __future__ import annotations

import math
import numbers
import threading

# -- core: the error lab -----------------------------------------------------

ERROR_LAB_PRESETS: dict[str, tuple[int, str, str, str, str]] = {
    # name: (n, gate-up A, gate-up B, down A, down B)
    "valid, shared outer": (2, "3, 1, 8, 16", "3, 2, 12, 4", "3, 2, 4, 6", "3, 1, 16, 4"),
    "valid, per-expert outer": (2, "3, 2, 8, 16", "3, 2, 12, 4", "3, 2, 4, 6", "3, 2, 16, 4"),
    "one adapter, no slot axis": (2, "1, 8, 16", "2, 12, 4", "2, 4, 6", "1, 16, 4"),
    "built for 4 experts": (2, "3, 4, 8, 16", "3, 4, 12, 4", "3, 4, 4, 6", "3, 4, 16, 4"),
    "only A per expert": (2, "3, 2, 8, 16", "3, 2, 12, 4", "3, 2, 4, 6", "3, 1, 16, 4"),
    "flat B, expert axis 1": (2, "3, 1, 8, 16", "3, 1, 24, 4", "3, 2, 4, 6", "3, 1, 16, 4"),
    "gate A only (R rows)": (2, "3, 1, 4, 16", "3, 2, 12, 4", "3, 2, 4, 6", "3, 1, 16, 4"),
    "down A transposed": (2, "3, 1, 8, 16", "3, 2, 12, 4", "3, 2, 6, 4", "3, 1, 16, 4"),
    "odd 2F": (2, "3, 1, 8, 16", "3, 2, 11, 4", "3, 2, 4, 6", "3, 1, 16, 4"),
    "slot counts differ": (2, "3, 1, 8, 16", "3, 2, 12, 4", "2, 2, 4, 6", "3, 1, 16, 4"),
    "one slot's gate-up A": (2, "1, 8, 16", "3, 2, 12, 4", "3, 2, 4, 6", "3, 1, 16, 4"),
    "down B transposed": (2, "3, 1, 8, 16", "3, 2, 12, 4", "3, 2, 4, 6", "3, 1, 4, 16"),
}
"""Starting points for the error lab: a valid pool, and one classic mistake each."""


def _in_range(function: str, **values: tuple[object, int, int]) -> None:
    """Each ``name=(value, low, high)`` an integer in ``low..high``, else ``ValueError``
    naming the function and the argument: what an explorer shows in its widget."""
    for name, (value, low, high) in values.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{function}: {name} must be a whole number, got {value!r}")
        if not low <= value <= high:
            raise ValueError(f"{function}: {name} must be in {low}..{high}, got {value}")


def parse_shape(text: str) -> tuple[int, ...]:
    """``"3, 1, 8, 16"`` (or ``"[3,1,8,16]"``) -> ``(3, 1, 8, 16)``."""
    if not isinstance(text, str):
        raise TypeError(f"a shape is text such as '3, 1, 8, 16', got {text!r}")
    cleaned = text.strip().strip("[]()")
    if not cleaned:
        return ()
    try:
        shape = tuple(int(part) for part in cleaned.replace("x", ",").split(",") if part.strip())
    except ValueError:
        raise ValueError(f"could not read {text!r} as a shape: write sizes separated by commas, e.g. 3, 1, 8, 16")
    if any(d < 0 for d in shape):
        raise ValueError(f"{text!r} has a negative size: a shape's sizes are whole numbers of at least 0")
    return shape


_GENERATION_LABELS = {"v1": "first generation (InklingBatchDenseMLPWithLoRA)",
                      "v2": "second generation (InklingBatchDenseMLPWithLoRAV2, the dense engine)"}


def error_lab_report(n: int, gate_up_a: str, gate_up_b: str, down_a: str, down_b: str,
                     generation: str = "v1") -> str:
    """What ``set_lora_info`` of the given wrapper generation says about four buffer
    shapes, every finding with its fix, and whether applying the fixes gives four
    buffers that pass. Pure: shapes in, text out."""
    from .errors import find_entry
    from .validate import diagnose_pool, validate_pool

    try:
        shapes = [parse_shape(s) for s in (gate_up_a, gate_up_b, down_a, down_b)]
        diagnosis = diagnose_pool(*shapes, n_shared_experts=n)
    except (TypeError, ValueError) as exc:
        return str(exc)
    try:
        validate_pool(*shapes, n_shared_experts=n, generation=generation)
        said = "passes its checks"
    except (ValueError, IndexError) as exc:  # V2 has Python's own errors where it has no check
        entry = find_entry(exc)
        said = f"raises {type(exc).__name__}: {exc}" + (f"  [{entry.code}]" if entry else "")
    lines = [f"sglang 0.5.23 set_lora_info, {_GENERATION_LABELS[generation]}: {said}", str(diagnosis)]
    if not diagnosis.ok and diagnosis.fixable:
        fixed = [list(t.shape) for t in diagnosis.apply_fix(*shapes)]
        validate_pool(*fixed, n_shared_experts=n, generation=generation)
        lines.append("With every fix applied (the 'apply fix' button): " + ", ".join(map(str, fixed))
                     + f" -> set_lora_info ({generation}) passes")
    elif not diagnosis.ok:
        stuck = [k for k, m in diagnosis.moves.items() if m is None]
        lines.append(f"No plain fix for {', '.join(stuck) or 'these shapes'}: re-export "
                     f"{'it' if len(stuck) == 1 else 'them'} for this pool.")
    return "\n".join(lines)


def error_lab_fixed(n: int, gate_up_a: str, gate_up_b: str, down_a: str, down_b: str) -> list[str] | None:
    """The four shapes with every suggested fix applied, as the lab's text boxes hold
    them (``"3, 1, 8, 16"``), or ``None`` when there is nothing to fix or no plain fix."""
    from .validate import diagnose_pool

    try:
        shapes = [parse_shape(s) for s in (gate_up_a, gate_up_b, down_a, down_b)]
        diagnosis = diagnose_pool(*shapes, n_shared_experts=n)
    except (TypeError, ValueError):
        return None
    if diagnosis.ok or not diagnosis.fixable:
        return None
    return [", ".join(str(d) for d in t.shape) for t in diagnosis.apply_fix(*shapes)]


def error_lab():
    """Set ``n``, the wrapper generation and the four shapes (or pick a preset); see
    which check fires first, the diagnosis and the fix; "apply fix" applies it."""
    import ipywidgets as w

    first = next(iter(ERROR_LAB_PRESETS.values()))
    preset = w.Dropdown(options=list(ERROR_LAB_PRESETS), description="preset")
    n = w.BoundedIntText(value=first[0], min=1, max=64, description="n experts")
    generation = w.ToggleButtons(options=[("v1 (first)", "v1"), ("v2 (dense engine)", "v2")], value="v1",
                                 description="generation")
    boxes = [w.Text(value=v, description=d) for v, d in
             zip(first[1:], ("gate-up A", "gate-up B", "down A", "down B"))]
    apply = w.Button(description="apply fix", tooltip="replace the shapes by the fixed ones and re-validate")
    out = w.Output(layout=w.Layout(border="1px solid #ccc", padding="4px"))

    def show(*_):
        out.clear_output(wait=True)
        with out:
            print(error_lab_report(n.value, *(b.value for b in boxes), generation=generation.value))
        apply.disabled = error_lab_fixed(n.value, *(b.value for b in boxes)) is None

    def load(change):
        values = ERROR_LAB_PRESETS[change["new"]]
        n.value = values[0]
        for box, v in zip(boxes, values[1:]):
            box.value = v

    def fix(_):
        fixed = error_lab_fixed(n.value, *(b.value for b in boxes))
        for box, v in zip(boxes, fixed or ()):
            box.value = v

    preset.observe(load, names="value")
    apply.on_click(fix)
    for widget in (n, generation, *boxes):
        widget.observe(show, names="value")
    show()
    return w.VBox([w.HTML("<b>Error lab</b>: shapes are [S, O, 2R, H], [S, n, 2F, R], [S, n, R, F], [S, O, H, R]"),
                   preset, n, generation, *boxes, apply, out])


# ipykernel 7 can hand widget messages to a kernel *subshell*, whose callbacks run in
# another thread, and matplotlib is not thread-safe: every explorer draws under one lock.
_DRAW_LOCK = threading.Lock()


def _png(fig) -> bytes:
    """``fig`` rendered to PNG bytes (closed afterwards if pyplot knows it)."""
    import io

    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", bbox_inches="tight")
    finally:
        if fig.canvas.manager is not None:
            import matplotlib.pyplot as plt

            plt.close(fig)
    return buffer.getvalue()


def _same_values(a: dict, b: dict) -> bool:
    """Whether two sets of control values draw the same picture: the front end echoes a
    float slider's value back rounded to its step grid (4.0 -> 3.9999999999999996)."""
    return a.keys() == b.keys() and all(
        math.isclose(a[k], b[k], rel_tol=1e-9) if isinstance(a[k], float) and isinstance(b[k], float)
        else a[k] == b[k] for k in a)


def _figure_explorer(draw, controls: dict, title: str = ""):
    """A thin front: ``controls`` ({argument: widget}) above an ``Output`` that
    ``draw(**values)`` (a pure function returning ``(text, Figure)``) redraws on every
    change. The figure is made ``viz.detached()`` (pyplot never sees it, so the inline
    backend's flush after a running cell cannot show, close or draw it while it renders:
    that is what made the pool explorer come up blank after Run All), rendered to PNG,
    then shown; drawing is serialized (``_DRAW_LOCK``), a request overtaken by a newer
    one is dropped, and an echo of the values already drawn draws nothing, so the
    Output always ends on the figure of the controls' last values."""
    import ipywidgets as w
    from IPython.display import Image, display

    from .viz import detached, message_figure

    out = w.Output()
    requests = [0]
    drawn: list[dict] = []

    def show(*_):
        requests[0] += 1
        mine = requests[0]
        with _DRAW_LOCK:
            if mine != requests[0]:
                return  # a newer change is waiting: it draws the newer values
            values = {name: widget.value for name, widget in controls.items()}
            if drawn and _same_values(drawn[-1], values):
                return  # the front end echoing a value back: the picture shown is already this one
            drawn[:] = [values]
            with detached():
                try:
                    text, fig = draw(**values)
                except (TypeError, ValueError, RuntimeError, AssertionError, MemoryError) as exc:
                    # values the drawing cannot take (a control set from code past its slider): say so in
                    # the widget, in words, instead of a traceback in the log
                    text, fig = f"cannot draw this: {exc}", message_figure(f"cannot draw this: {exc}")
            picture = _png(fig)
            with out:
                out.clear_output(wait=True)
                if text:
                    print(text)
                display(Image(data=picture, format="png"))

    for widget in controls.values():
        widget.observe(show, names="value")
    show()
    header = [w.HTML(title)] if title else []
    return w.VBox([*header, w.HBox(list(controls.values())[:3]), w.HBox(list(controls.values())[3:]), out])


def pool_explorer_figure(slots: int, max_rank: int, rank: int, lora_alpha: float, per_expert_outer: bool,
                         n: int = 2, hidden: int = 8, intermediate: int = 6):
    """``pool_explorer``'s drawing: one adapter of ``rank`` (clipped to ``max_rank``,
    and said so on the figure) in slot 0 of a fresh pool. Returns ``(text, Figure)``."""
    from .pool import LoRAFactors, LoRAPool
    from .viz import pool_figure

    _in_range("pool_explorer_figure", slots=(slots, 1, 64), max_rank=(max_rank, 1, 64), rank=(rank, 0, 64),
              n=(n, 1, 16), hidden=(hidden, 1, 256), intermediate=(intermediate, 1, 256))
    if isinstance(lora_alpha, bool) or not isinstance(lora_alpha, numbers.Real) or not math.isfinite(lora_alpha):
        raise ValueError(f"pool_explorer_figure: lora_alpha must be a finite number, got {lora_alpha!r}")
    pool = LoRAPool(n, hidden, intermediate, slots, max_rank, outer=n if per_expert_outer else 1)
    loaded = min(rank, max_rank)
    pool.load(0, LoRAFactors.random(n, hidden, intermediate, loaded, lora_alpha=lora_alpha,
                                    outer=pool.geometry.outer, seed=0))
    note = (f"rank {rank} > max rank {max_rank}: drawn clipped to rank {max_rank}; loading it for real "
            "fails with ISL-E016" if rank > max_rank else "")
    scaling = f"scaling lora_alpha / r = {lora_alpha:g} / {loaded} = {lora_alpha / loaded:.3g}" if loaded else \
        "rank 0: nothing loaded"
    return f"slot 0 holds a rank-{loaded} adapter; B carries its {scaling}", pool_figure(pool, note)


def pool_explorer(n: int = 2, hidden: int = 8, intermediate: int = 6):
    """Slots, max rank, an adapter's rank and alpha, the outer layout: watch the four
    buffers fill, pad and scale (one colour scale, its bar shows the range)."""
    import functools

    import ipywidgets as w

    controls = {"slots": w.IntSlider(value=2, min=1, max=4, description="slots"),
                "max_rank": w.IntSlider(value=4, min=1, max=8, description="max rank"),
                "rank": w.IntSlider(value=2, min=0, max=8, description="rank"),
                "lora_alpha": w.FloatSlider(value=4.0, min=0.5, max=16, description="lora_alpha"),
                "per_expert_outer": w.Checkbox(value=False, description="per-expert outer")}
    draw = functools.partial(pool_explorer_figure, n=n, hidden=hidden, intermediate=intermediate)
    return _figure_explorer(draw, controls)


def layout_explorer():
    """The interleaved and contiguous gate/up rows of w13 for a chosen F and n."""
    import ipywidgets as w

    from .viz import gate_up_layout_figure

    controls = {"intermediate": w.IntSlider(value=4, min=1, max=8, description="F"),
                "n": w.IntSlider(value=2, min=1, max=3, description="n")}
    return _figure_explorer(lambda intermediate, n: ("", gate_up_layout_figure(intermediate, n)), controls)

# -- adapters -------------------------------------------------------------------

def adapter_explorer_figure(adapter: str, n: int, max_rank: int, tp: int, folder: str = "../data/adapters",
                            hidden: int = 8, intermediate: int = 6):
    """``adapter_explorer``'s drawing: the doctor's report on one sample adapter and its
    first module's journey from file to pool. Returns ``(text, Figure)``."""
    from pathlib import Path

    from .doctor import doctor
    from .viz import adapter_journey_figure, message_figure

    _in_range("adapter_explorer_figure", n=(n, 1, 64), max_rank=(max_rank, 1, 1024), tp=(tp, 1, 64),
              hidden=(hidden, 1, 4096), intermediate=(intermediate, 1, 4096))
    report = doctor(Path(folder) / adapter, n, hidden, intermediate, max_rank, tp)
    if not report.journey:  # nothing the kit could read: no factor to follow from file to pool
        return str(report), message_figure(f"{adapter}: no factor to follow from file to pool "
                                           f"(the kit {report.kit.outcome} it; the report says why)")
    module, rows = next(iter(report.journey.items()))
    return str(report), adapter_journey_figure(rows, f"{adapter}: {module}")


def adapter_explorer(folder: str = "../data/adapters", hidden: int = 8, intermediate: int = 6,
                     start: str = "gate_up"):
    """Pick a sample adapter, ``n``, the pool's max rank and ``tp``: the doctor's report
    and each factor's shapes from file to pool, redrawn."""
    import functools
    from pathlib import Path

    import ipywidgets as w

    if not isinstance(folder, (str, Path)) or not str(folder) or not Path(folder).is_dir():
        raise ValueError(f"adapter_explorer: folder must be a folder of adapter folders (../data/adapters), got "
                         f"{folder!r}")
    names = sorted(p.name for p in Path(folder).iterdir() if p.is_dir())
    if not names:
        raise ValueError(f"adapter_explorer: {folder} holds no adapter folder")
    controls = {"adapter": w.Dropdown(options=names, value=start if start in names else names[0],
                                      description="adapter"),
                "tp": w.Dropdown(options=[1, 2, 3, 6], value=1, description="tp"),
                "n": w.IntSlider(value=2, min=1, max=4, description="n experts"),
                "max_rank": w.IntSlider(value=4, min=1, max=16, description="max rank R")}
    draw = functools.partial(adapter_explorer_figure, folder=folder, hidden=hidden, intermediate=intermediate)
    return _figure_explorer(draw, controls, f"<b>Adapter doctor</b>: a sink of H={hidden}, F={intermediate}")


# -- forward and profiling ----------------------------------------------------

def roofline_explorer(record: dict | None = None):
    """Pick a shape, rank, slots and tokens: the case's bytes, FLOPs and roofline time
    by ``profile.roofline`` (ceilings from ``record``, else profile's recorded ones), and, when the
    record holds that point, each backend's measured time against it."""
    import ipywidgets as w

    from . import profile as pr

    if record is not None and not (isinstance(record, dict) and isinstance(record.get("ceilings"), dict)):
        raise ValueError("roofline_explorer: record must be a profile record with its ceilings "
                         "(records.load_record('data/profiles/h200_grid.json', ...)), or None for the recorded ones")
    ceilings = record["ceilings"] if record else pr.issue4_upstream().ceilings
    shape = w.Dropdown(options=sorted(pr.SHAPES), value="B", description="shape")
    rank = w.Dropdown(options=list(pr.GRID_RANKS), value=64, description="rank R")
    slots = w.Dropdown(options=list(pr.GRID_SLOTS), value=4, description="slots S")
    tokens = w.SelectionSlider(options=list(pr.GRID_TOKENS), value=32, description="tokens T")
    out = w.Output()

    def show(*_):
        out.clear_output(wait=True)
        with out:
            c = pr.Case.of(shape.value, rank.value, slots.value, tokens.value)
            roof = pr.roofline(c, **ceilings)
            print(f"{c.slots_used} slot(s) used; bytes {roof.bytes / 1e6:.2f} MB -> {roof.memory_us:.1f} µs at "
                  f"{ceilings['copy_TBps']:.2f} TB/s; FLOPs {roof.flops / 1e9:.2f} G -> {roof.compute_us:.1f} µs at "
                  f"{ceilings['matmul_TFLOPs']:.0f} TFLOP/s")
            print(f"roofline {roof.us:.1f} µs ({roof.bound}-bound); target "
                  f"{pr.target_ratio(c.T) or '-'} x roofline")
            for r in (record or {}).get("records", []):
                k = r["case"]
                if (k["shape"], k["R"], k["S"], k["T"]) == (c.shape, c.geometry.max_rank, c.geometry.slots, c.T):
                    print(f"  {r['backend']:<12} {r['median_us']:8.1f} µs  = {r['ratio']:.2f} x roofline")

    for widget in (shape, rank, slots, tokens):
        widget.observe(show, names="value")
    show()
    return w.VBox([w.HTML("<b>Roofline explorer</b>: minimal bytes and useful FLOPs of one forward"),
                   w.HBox([shape, rank, slots]), tokens, out])

def side_by_side_explorer_figure(record: dict, R: int, S: int, flush: str):
    """``side_by_side_explorer``'s drawing: ``viz.side_by_side_figure`` at rank ``R``, ``S`` slots,
    L2 flush ``flush``, and a line counting where the kit beats sglang's forward without LoRA.
    Returns ``(text, Figure)``."""
    from .profile import TARGET_VS_BASE_LARGE_T, side_by_side_rows
    from .viz import side_by_side_figure

    fig = side_by_side_figure(record, R, S, flush)

    def counts(kit: str) -> tuple[int, int, int, int]:
        rows = [r for r in side_by_side_rows(record, flush, kit) if (r["R"], r["S"]) == (R, S) and r["vs_base"]]
        large = [r for r in rows if r["T"] >= 2048]
        return (sum(r["vs_base"] < 1 for r in rows), len(rows),
                sum(r["vs_base"] <= TARGET_VS_BASE_LARGE_T for r in large), len(large))
    faster, of, near, large = counts("kit_triton")
    text = (f"R {R}, S {S}: the kit with its LoRA is faster than sglang without LoRA at {faster} of {of} "
            f"points; at T >= 2048 within {TARGET_VS_BASE_LARGE_T:g}x of it at {near} of {large}")
    faster, of, near, large = counts("kit_kept")
    if of:
        text += f"; with the merges kept, {faster} of {of} and {near} of {large}"
    return text, fig


def side_by_side_explorer(record: dict):
    """Rank, slots and L2 flush of a side-by-side record (``data/profiles/h200_side_by_side.json``):
    the kit's and sglang's LoRA paths' time over sglang's forward without LoRA, every shape."""
    import functools

    import ipywidgets as w

    from .profile import GRID_RANKS, GRID_SLOTS

    if not (isinstance(record, dict) and isinstance(record.get("points"), list)):
        raise ValueError("side_by_side_explorer: record must be a side-by-side record "
                         "(profile.load_side_by_side('data/profiles/h200_side_by_side.json'))")
    controls = {"R": w.Dropdown(options=list(GRID_RANKS), value=64, description="rank R"),
                "S": w.Dropdown(options=list(GRID_SLOTS), value=4, description="slots S"),
                "flush": w.Dropdown(options=["read", "write"], value="read", description="L2 flush")}
    return _figure_explorer(functools.partial(side_by_side_explorer_figure, record), controls,
                            "<b>Side by side</b>: time over sglang's forward without LoRA (below 1: faster)")

# -- tensor parallelism -------------------------------------------------------

def tp_shard_explorer_figure(n: int, intermediate: int, tp: int, layout: str):
    """``tp_shard_explorer``'s drawing: who holds what for ``tp`` ranks, each rank's
    shapes and the all-reduce bytes per token. Returns ``(text, Figure)``."""
    import torch

    from .geometry import Geometry
    from .parallel import AllReduceCost, describe_shards, shard_owners
    from .viz import tp_shards_figure

    _in_range("tp_shard_explorer_figure", n=(n, 1, 16), intermediate=(intermediate, 1, 256),
              tp=(tp, 1, 256))
    if layout not in ("interleaved", "contiguous"):
        raise ValueError(f"tp_shard_explorer_figure: layout must be 'interleaved' or 'contiguous', got {layout!r}")
    interleaved = layout == "interleaved"
    geometry = Geometry(n=n, hidden=8, intermediate=intermediate, rank=2, slots=2)
    cost = AllReduceCost(hidden=4096, dtype=torch.bfloat16, tp=tp)
    text = (f"{describe_shards(geometry, tp, interleaved)}\n"
            f"all-reduce at H=4096 in bf16: {cost.payload} B per token per rank in, "
            f"{cost.sent_per_rank:.0f} B sent per rank (ring); LoRA extra: {cost.lora_extra} B")
    return text, tp_shards_figure(shard_owners(n, intermediate, tp, interleaved), interleaved)


def _slider_start(what: str, value: object, low: int, high: int) -> int:
    """A slider's starting ``value`` if it is a whole number on the slider, else a
    ``ValueError`` naming the argument and the slider's range (ipywidgets' own
    ``TraitError`` names neither)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} starts its slider, which runs over {low}..{high}: got {value!r}")
    return value


def tp_shard_explorer(n: int = 2, intermediate: int = 6):
    """Pick n, F, tp and the gate/up layout: see which rank holds which rows and
    columns, each rank's shapes, and the all-reduce bytes per token."""
    import ipywidgets as w

    n = _slider_start("tp_shard_explorer: n", n, 1, 4)
    intermediate = _slider_start("tp_shard_explorer: intermediate", intermediate, 1, 16)

    def divisors(F: int) -> list[int]:
        return [d for d in range(1, F + 1) if F % d == 0]

    controls = {"n": w.IntSlider(value=n, min=1, max=4, description="n experts"),
                "intermediate": w.IntSlider(value=intermediate, min=1, max=16, description="F"),
                "tp": w.Dropdown(options=divisors(intermediate), value=2 if intermediate % 2 == 0 else 1,
                                 description="tp"),
                "layout": w.ToggleButtons(options=["interleaved", "contiguous"], description="w13 layout")}

    def new_f(change):
        controls["tp"].options = divisors(change["new"])  # only a tp that divides F is offered

    controls["intermediate"].observe(new_f, names="value")
    return _figure_explorer(tp_shard_explorer_figure, controls, "<b>Tensor-parallel shards</b>: one colour per rank")


# -- the per-expert outer defect ----------------------------------------------

def defect_explorer_figure(rank: int, intermediate: int, seed: int, interleaved: bool,
                           same_outer_for_every_expert: bool, n: int = 2, hidden: int = 16):
    """``defect_explorer``'s drawing: one per-expert outer adapter, sglang 0.5.23's
    sink output next to the intended one. Returns ``(text, Figure)``."""
    from .pool import LoRAFactors
    from .upstream_defect import collapse_identical_outer, defect_report
    from .viz import defect_outputs_figure

    _in_range("defect_explorer_figure", rank=(rank, 1, 64), intermediate=(intermediate, 2, 256),
              seed=(seed, 0, 2 ** 32 - 1), n=(n, 1, 16), hidden=(hidden, 1, 256))
    factors = LoRAFactors.random(n, hidden, intermediate, rank, outer=n, seed=seed)
    if same_outer_for_every_expert:  # expert 0's outer factors, exported once per expert
        factors = LoRAFactors(factors.gate_up_a[:1].expand(n, -1, -1), factors.gate_up_b, factors.down_a,
                              factors.down_b[:1].expand(n, -1, -1), factors.lora_alpha)
    report = defect_report(factors, interleaved=interleaved, seed=seed)
    collapsed = collapse_identical_outer(factors.gate_up_a, factors.down_b)[2]
    text = (f"relative error of sglang 0.5.23's sink output: {report.relative_error:.2f}\n"
            "collapse to shared outer: " + ("applies (exact; then computed right upstream)" if collapsed
                                            else "does not apply (the experts' outer factors differ)"))
    return text, defect_outputs_figure(report)


def defect_explorer(n: int = 2, hidden: int = 16):
    """One per-expert outer adapter: change its rank, F, seed, the base layout, and
    whether its outer factors are the same for every expert; see how far sglang
    0.5.23's output is from the intended one, and whether the collapse applies."""
    import functools

    import ipywidgets as w

    controls = {"rank": w.IntSlider(value=4, min=1, max=8, description="rank"),
                "intermediate": w.IntSlider(value=6, min=2, max=12, description="F"),
                "seed": w.IntSlider(value=0, min=0, max=20, description="seed"),
                "interleaved": w.Checkbox(value=True, description="interleaved"),
                "same_outer_for_every_expert": w.Checkbox(value=False, description="same outer for every expert")}
    return _figure_explorer(functools.partial(defect_explorer_figure, n=n, hidden=hidden), controls)
