"""Smoke tests of the figures: each draws from the library's values, names its axes,
and carries a colour bar where colour holds a value; the pool's panels share one scale."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import inkling_lab as il  # noqa: E402
from inkling_lab import viz  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _pool(alpha: float = 4.0, outer: int = 1) -> il.LoRAPool:
    pool = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=2, max_rank=4, outer=outer)
    pool.load(0, il.LoRAFactors.random(2, 8, 6, rank=4, lora_alpha=alpha, outer=outer, seed=0))
    return pool


def _images(fig):
    return [image for ax in fig.axes for image in ax.get_images()]


def test_pool_figure_puts_all_four_buffers_on_one_scale_with_a_colour_bar():
    fig = viz.pool_figure(_pool())
    images = _images(fig)
    assert len(images) == 4 and len({image.get_clim() for image in images}) == 1
    assert any(ax.get_label() == "<colorbar>" for ax in fig.axes)
    assert all(ax.get_xlabel() for ax in fig.axes if ax.get_images())


def test_pool_figure_shows_the_scaling_change():
    # B carries lora_alpha / r: a smaller alpha must change what the reader sees.
    strong, weak = (_images(viz.pool_figure(_pool(alpha))) for alpha in (16.0, 0.5))
    assert strong[0].get_clim() != weak[0].get_clim()


def test_pool_figure_prints_its_note():
    fig = viz.pool_figure(_pool(), note="rank 6 > max rank 4: drawn clipped")
    assert "clipped" in fig._supxlabel.get_text()


def test_derived_operands_figure_has_one_scale_and_a_colour_bar():
    sink = il.SharedSinkLoRA(2, 8, 6)
    sink.set_lora_info(*_pool().buffers())
    fig = viz.derived_operands_figure(sink)
    assert len({image.get_clim() for image in _images(fig)}) == 1
    assert any(ax.get_label() == "<colorbar>" for ax in fig.axes)


def test_kernel_reads_figure_marks_every_wrong_read():
    fig = viz.kernel_reads_figure(intermediate=4, rank=2, interleaved=True)
    marks = [t for t in fig.axes[1].texts if t.get_text() == "✗"]
    # Upstream: gate A read in the 4 up programs (2 rows each), and 7 of 8 B rows read by the wrong program.
    assert len(marks) == 4 * 2 + 7
    assert fig.axes[0].get_ylabel() and fig.axes[0].get_xlabel() and fig.axes[1].get_xlabel()


def test_lora_forward_path_figure_labels_every_step_with_its_shape():
    fig = viz.lora_forward_path_figure(n=2, hidden=16, intermediate=12, rank=4)
    text = " ".join(t.get_text() for t in fig.axes[0].texts)
    for shown in ("[1, 16]", "[1, 8]", "[1, 48]", "[1, 24]", "[1, 4]", "w1_delta", "a_cat", "down B", "SwiGLU"):
        assert shown in text


def test_adapter_journey_figure_has_arrows_and_named_axes():
    journey = [{"buffer": "down_a", "peft": [("down_proj.lora_A", [4, 12])], "normalized": [2, 4, 6],
                "pool": [1, 2, 4, 6]}]
    fig = viz.adapter_journey_figure(journey, "toy")
    assert len(fig.artists) == 2  # file -> normalized -> pool
    assert all(ax.get_xlabel().startswith("columns:") and ax.get_ylabel().startswith("rows:") for ax in fig.axes)


def test_gate_up_layout_and_routing_figures_draw():
    assert viz.gate_up_layout_figure(4, 2).axes[0].get_xlabel()
    fig = viz.gate_up_routing_figure(4, True)
    assert fig.axes[0].get_ylabel() and fig.axes[1].get_xlabel()


def test_batch_figure_draws_every_token():
    batch = il.SlotBatch.from_token_slots([0, 0, -1, 1], num_slots=2)
    fig = viz.batch_figure(batch)
    assert len(fig.axes[0].patches) == 4


def test_defect_outputs_figure_shares_its_scale():
    from inkling_lab.upstream_defect import defect_report

    report = defect_report(il.LoRAFactors.random(2, 8, 6, rank=2, outer=2, seed=0))
    fig = viz.defect_outputs_figure(report)
    assert len({image.get_clim() for image in _images(fig)}) == 1
    assert any(ax.get_label() == "<colorbar>" for ax in fig.axes)
    assert torch.is_tensor(report.intended)


def test_side_by_side_figure_plots_the_recorded_medians_over_the_base():
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "profiles" / "h200_side_by_side.json"
    record = json.loads(path.read_text())
    fig = viz.side_by_side_figure(record, R=64, S=4, flush="write")
    assert len(fig.axes) == 4 and fig.axes[0].get_ylabel()
    # the raw medians of the record, read here without the kit's rows
    raw = sorted((p["case"]["T"], p["times"]["write"]["kit_triton"]["median_us"] / p["times"]["write"]["sglang_base"]["median_us"])
                 for p in record["points"] if (p["case"]["shape"], p["case"]["R"], p["case"]["S"]) == ("Inkling", 64, 4))
    kit = next(line for line in fig.axes[2].get_lines() if line.get_label() == "the kit (triton)")
    assert list(kit.get_xdata()) == [t for t, _ in raw]
    assert list(kit.get_ydata()) == pytest.approx([r for _, r in raw])
    raw_kept = sorted((p["case"]["T"], p["times"]["write"]["kit_kept"]["median_us"] / p["times"]["write"]["sglang_base"]["median_us"])
                      for p in record["points"] if (p["case"]["shape"], p["case"]["R"], p["case"]["S"]) == ("Inkling", 64, 4))
    kept = next(line for line in fig.axes[2].get_lines() if line.get_label() == "the kit, merges kept (opt-in)")
    assert list(kept.get_xdata()) == [t for t, _ in raw_kept] and kept.get_linestyle() == "--"
    assert list(kept.get_ydata()) == pytest.approx([r for _, r in raw_kept])
    assert "Inkling" in fig.axes[2].get_title() and "target" in " ".join(t.get_text() for t in fig.legends[0].get_texts())
    older = {**record, "points": [{**p, "times": {fl: {k: v for k, v in t.items() if k != "kit_kept"}
                                                  for fl, t in p["times"].items()}} for p in record["points"]]}
    assert all("merges kept" not in line.get_label() for ax in viz.side_by_side_figure(older).axes
               for line in ax.get_lines())  # a record from before v22 draws no kept line
    with pytest.raises(ValueError, match="R=3"):
        viz.side_by_side_figure(record, R=3)


def test_slot_cost_figure_plots_the_recorded_medians_against_the_slots():
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "profiles" / "h100_gather_v28b.json"
    record = json.loads(path.read_text())
    fig = viz.slot_cost_figure(record, R=16, T=8)
    assert [ax.get_title() for ax in fig.axes] == ["A", "B", "Inkling", "Inkling-TP8"]
    for ax, shape in zip(fig.axes, ("A", "B", "Inkling", "Inkling-TP8")):
        raw = {p["S"]: p["us"] for p in record["points"] if (p["shape"], p["R"], p["T"]) == (shape, 16, 8)}
        lines = {line.get_label(): line for line in ax.get_lines()}
        for key, label in (("v9", "the loop over a tile's slots"), ("gather_v9", "each token's own slot (v28)"),
                           ("sglang_base", "sglang without LoRA")):
            assert list(lines[label].get_xdata()) == sorted(raw)
            assert list(lines[label].get_ydata()) == pytest.approx([raw[S][key] for S in sorted(raw)])
    older = json.loads((path.parent / "h100_gather_v28.json").read_text())  # no gather_v9 there: no such line
    assert all(line.get_label() != "each token's own slot (v28)" for ax in viz.slot_cost_figure(older).axes
               for line in ax.get_lines())
    with pytest.raises(ValueError, match="R=64, T=8"):
        viz.slot_cost_figure(record, R=64)



def test_lora_cost_figure_stacks_the_kits_launches_and_what_the_lora_adds():
    """v33b's record: per shape, sglang's base, the kit's bare launches with the LoRA's share stacked on them (the
    two summing to the LoRA forward's own median) and the kept merge's two launches, read off the record."""
    import json
    from pathlib import Path

    record = json.loads((Path(__file__).resolve().parents[1] / "data" / "profiles" / "h100_bare_v33b.json").read_text())
    fig = viz.lora_cost_figure(record, T=32)
    rows = [p for p in record["points"] if p["T"] == 32]
    assert [ax.get_title() for ax in fig.axes] == [f"{p['shape']}, R 16" for p in rows]
    for ax, p in zip(fig.axes, rows):
        bars = [(round(b.get_x() + b.get_width() / 2), b.get_y(), b.get_height()) for b in ax.patches]
        us = p["us"]
        assert bars[0] == (0, 0, pytest.approx(us["sglang_base"]))
        assert bars[1] == (1, 0, pytest.approx(us["kit_bare_base"]))
        assert bars[2][:2] == (1, pytest.approx(us["kit_bare_base"])) and bars[1][2] + bars[2][2] == pytest.approx(us["auto"])
        assert bars[3] == (2, 0, pytest.approx(us["upact_cublas_base"]))
        assert f"+{us['auto'] - us['kit_bare_base']:.1f} µs" in [t.get_text() for t in ax.texts]
    assert "what the LoRA adds" in [t.get_text() for t in fig.legends[0].get_texts()]
    with pytest.raises(ValueError, match="T=16"):
        viz.lora_cost_figure(record, T=16)
