"""The explorers' pure drawing functions, for every value a control can take that
changes what is drawn, and the widgets built around them."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from inkling_lab import widgets  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _not_blank(fig, images: bool = True) -> bool:
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba())
    return bool(pixels.std() > 0) and (not images or any(ax.get_images() for ax in fig.axes))


@pytest.mark.parametrize("same", [False, True])
def test_defect_explorer_draws_for_both_outer_choices(same):
    text, fig = widgets.defect_explorer_figure(rank=4, intermediate=6, seed=0, interleaved=True,
                                               same_outer_for_every_expert=same)
    assert _not_blank(fig)
    assert ("collapse to shared outer: applies" in text) is same
    assert "relative error" in text


def test_pool_explorer_says_when_the_rank_is_clipped():
    text, fig = widgets.pool_explorer_figure(slots=2, max_rank=4, rank=6, lora_alpha=4.0, per_expert_outer=False)
    assert "clipped to rank 4" in fig._supxlabel.get_text() and "rank-4" in text
    text, fig = widgets.pool_explorer_figure(slots=2, max_rank=4, rank=2, lora_alpha=4.0, per_expert_outer=True)
    assert fig._supxlabel is None and "4 / 2 = 2" in text
    assert _not_blank(fig)


def test_pool_explorer_draws_rank_zero():
    text, fig = widgets.pool_explorer_figure(slots=1, max_rank=2, rank=0, lora_alpha=1.0, per_expert_outer=False)
    assert "nothing loaded" in text


def test_parse_shape_reads_what_people_type():
    assert widgets.parse_shape("3, 1, 8, 16") == (3, 1, 8, 16)
    assert widgets.parse_shape("[3,1,8,16]") == (3, 1, 8, 16)
    assert widgets.parse_shape("3x1x8") == (3, 1, 8)
    assert widgets.parse_shape("") == ()
    with pytest.raises(ValueError, match="could not read"):
        widgets.parse_shape("3, a")


@pytest.mark.parametrize("make", [widgets.pool_explorer, widgets.layout_explorer, widgets.defect_explorer,
                                  widgets.tp_shard_explorer])
def test_explorers_build(make):
    import ipywidgets

    assert isinstance(make(), ipywidgets.Widget)


def test_tp_shard_explorer_draws_both_layouts():
    for layout in ("interleaved", "contiguous"):
        text, fig = widgets.tp_shard_explorer_figure(n=2, intermediate=6, tp=3, layout=layout)
        assert "all-reduce" in text and _not_blank(fig, images=False)


def test_explorers_draw_under_one_lock_on_figures_pyplot_never_sees():
    # After Run All in JupyterLab the pool explorer's redraw came up as an empty PNG when its
    # figure lived in pyplot's registry, which the inline backend flushes (shows, closes)
    # after every cell; drawn detached, the same redraw gave the first draw's bytes.
    import threading

    import inkling_lab.widgets as module

    assert isinstance(module._DRAW_LOCK, type(threading.Lock()))
    module.pool_explorer()
    module.layout_explorer()
    module.defect_explorer()
    module.tp_shard_explorer()
    assert not plt.get_fignums()  # four explorers drawn, nothing left for pyplot to flush


@pytest.mark.parametrize("draw", [
    lambda: widgets.pool_explorer_figure(2, 4, 2, 4.0, False)[1],
    lambda: widgets.defect_explorer_figure(rank=4, intermediate=6, seed=0, interleaved=True,
                                           same_outer_for_every_expert=True)[1],
    lambda: widgets.tp_shard_explorer_figure(n=2, intermediate=6, tp=3, layout="interleaved")[1],
])
def test_detached_figures_render_the_same_picture_as_pyplot_ones(draw):
    from inkling_lab import viz

    with_pyplot = widgets._png(draw())
    assert not plt.get_fignums()  # _png closed the pyplot figure
    with viz.detached():
        fig = draw()
        assert fig.canvas.manager is None and not plt.get_fignums()
        plt.close("all")  # what the inline backend does after a cell: no effect on it
    assert widgets._png(fig) == with_pyplot


def test_detached_is_per_thread_and_nests():
    import threading

    from inkling_lab import viz

    seen = {}
    with viz.detached():
        with viz.detached():
            pass
        assert viz._subplots()[0].canvas.manager is None  # still detached after the inner block
        worker = threading.Thread(target=lambda: seen.update(other=viz._subplots()[0].canvas.manager))
        worker.start()
        worker.join()
    assert seen["other"] is not None  # another thread's figures still go through pyplot
    assert viz._subplots()[0].canvas.manager is not None


def test_an_echoed_float_draws_nothing_new():
    import ipywidgets as w

    calls = []
    alpha, rank = w.FloatSlider(value=4.0, min=0.5, max=16), w.IntSlider(value=2, min=0, max=8)

    def draw(lora_alpha, rank):
        calls.append((lora_alpha, rank))
        return "", widgets.pool_explorer_figure(2, 4, rank, lora_alpha, False)[1]

    widgets._figure_explorer(draw, {"lora_alpha": alpha, "rank": rank})
    alpha.value = 3.9999999999999996   # the front end's echo of 4.0 on a 0.1 step grid
    assert calls == [(4.0, 2)]
    alpha.value = 4.5
    rank.value = 3
    assert calls == [(4.0, 2), (4.5, 2), (4.5, 3)]
    assert widgets._same_values({"a": 1.0, "b": 2}, {"a": 1.0 + 1e-15, "b": 2})
    assert not widgets._same_values({"a": 1.0, "b": 2}, {"a": 1.0, "b": 3})


def test_side_by_side_explorer_counts_what_the_record_says():
    import json
    from pathlib import Path

    record = json.loads((Path(__file__).resolve().parents[1] / "data" / "profiles" / "h200_side_by_side.json").read_text())
    text, fig = widgets.side_by_side_explorer_figure(record, 16, 1, "write")
    t = [p["times"]["write"] for p in record["points"] if (p["case"]["R"], p["case"]["S"]) == (16, 1)]
    faster = sum(x["kit_triton"]["median_us"] < x["sglang_base"]["median_us"] for x in t)
    assert f"faster than sglang without LoRA at {faster} of {len(t)} points" in text and len(fig.axes) == 4
    kept = sum(x["kit_kept"]["median_us"] < x["sglang_base"]["median_us"] for x in t)
    large = [p["times"]["write"] for p in record["points"] if (p["case"]["R"], p["case"]["S"]) == (16, 1) and p["case"]["T"] >= 2048]
    near = sum(x["kit_kept"]["median_us"] <= 1.1 * x["sglang_base"]["median_us"] for x in large)
    assert text.endswith(f"with the merges kept, {kept} of {len(t)} and {near} of {len(large)}")
    box = widgets.side_by_side_explorer(record)
    assert [c.description for c in box.children[1].children] == ["rank R", "slots S", "L2 flush"]
    with pytest.raises(ValueError, match="side-by-side record"):
        widgets.side_by_side_explorer({"records": []})
