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


def test_explorers_draw_one_after_another_under_one_lock():
    # JupyterLab's subshells run callbacks in threads: drawing is serialized.
    import threading

    import inkling_lab.widgets as module

    assert isinstance(module._DRAW_LOCK, type(threading.Lock()))
    text, fig = widgets.pool_explorer_figure(2, 4, 2, 4.0, False)
    png = module._png(fig)
    assert png.startswith(b"\x89PNG") and not plt.get_fignums()  # rendered, then closed
