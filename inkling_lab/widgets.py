"""ipywidgets explorers: thin ``interact``-style fronts over pure, seeded functions of
the library. Each returns the widget; the function it drives is tested on its own."""
from __future__ import annotations

# -- core (issue 2): the error lab -----------------------------------------------------

# -- adapters (issue 3) -------------------------------------------------------------------

# -- forward and profiling (issue 4) ----------------------------------------------------

# -- tensor parallelism (issue 5) -------------------------------------------------------

def tp_shard_explorer(n: int = 2, intermediate: int = 6):
    """Pick n, F, tp and the gate/up layout: see which rank holds which rows and
    columns, each rank's shapes, and the all-reduce bytes per token."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    import torch

    from .geometry import Geometry
    from .parallel import AllReduceCost, describe_shards, shard_owners
    from .viz import tp_shards_figure

    def divisors(F: int) -> list[int]:
        return [d for d in range(1, F + 1) if F % d == 0]

    n_box = w.IntSlider(value=n, min=1, max=4, description="n experts")
    f_box = w.IntSlider(value=intermediate, min=1, max=16, description="F")
    tp_box = w.Dropdown(options=divisors(intermediate), value=2 if intermediate % 2 == 0 else 1, description="tp")
    layout = w.ToggleButtons(options=["interleaved", "contiguous"], description="w13 layout")
    out = w.Output()

    def show(*_):
        out.clear_output(wait=True)
        with out:
            interleaved = layout.value == "interleaved"
            geometry = Geometry(n=n_box.value, hidden=8, intermediate=f_box.value, rank=2, slots=2)
            print(describe_shards(geometry, tp_box.value, interleaved))
            cost = AllReduceCost(hidden=4096, dtype=torch.bfloat16, tp=tp_box.value)
            print(f"all-reduce at H=4096 in bf16: {cost.payload} B per token per rank in, "
                  f"{cost.sent_per_rank:.0f} B sent per rank (ring); LoRA extra: {cost.lora_extra} B")
            tp_shards_figure(shard_owners(n_box.value, f_box.value, tp_box.value, interleaved), interleaved)
            plt.show()

    def new_f(change):
        tp_box.options = divisors(change["new"])  # only a tp that divides F is offered

    f_box.observe(new_f, names="value")
    for widget in (n_box, f_box, tp_box, layout):
        widget.observe(show, names="value")
    show()
    return w.VBox([w.HTML("<b>Tensor-parallel shards</b>: one colour per rank"),
                   w.HBox([n_box, f_box]), w.HBox([tp_box, layout]), out])


# -- the per-expert outer defect (issue 7) ----------------------------------------------

def defect_explorer(n: int = 2, hidden: int = 16):
    """One per-expert outer adapter: change its rank, F, seed, the base layout, and
    whether its outer factors are the same for every expert; see how far sglang
    0.5.23's output is from the intended one, and whether the collapse applies."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    from .pool import LoRAFactors
    from .upstream_defect import collapse_identical_outer, defect_report
    from .viz import defect_outputs_figure

    def draw(rank: int, intermediate: int, seed: int, interleaved: bool, same_outer_for_every_expert: bool):
        factors = LoRAFactors.random(n, hidden, intermediate, rank, outer=n, seed=seed)
        if same_outer_for_every_expert:  # expert 0's outer factors, exported once per expert
            factors = LoRAFactors(factors.gate_up_a[:1].expand(n, -1, -1), factors.gate_up_b, factors.down_a,
                                  factors.down_b[:1].expand(n, -1, -1), factors.lora_alpha)
        report = defect_report(factors, interleaved=interleaved, seed=seed)
        collapsed = collapse_identical_outer(factors.gate_up_a, factors.down_b)[2]
        print(f"relative error of sglang 0.5.23's sink output: {report.relative_error:.2f}")
        print("collapse to shared outer: " + ("applies (exact; then computed right upstream)" if collapsed
                                              else "does not apply (the experts' outer factors differ)"))
        defect_outputs_figure(report)
        plt.show()

    return w.interactive(draw, rank=w.IntSlider(value=4, min=1, max=8),
                         intermediate=w.IntSlider(value=6, min=2, max=12, description="F"),
                         seed=w.IntSlider(value=0, min=0, max=20), interleaved=w.Checkbox(value=True),
                         same_outer_for_every_expert=w.Checkbox(value=False))
