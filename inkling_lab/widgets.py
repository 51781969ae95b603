"""ipywidgets explorers: thin ``interact``-style fronts over pure, seeded functions of
the library. Each returns the widget; the function it drives is tested on its own."""
from __future__ import annotations

# -- core (issue 2): the error lab -----------------------------------------------------

# -- adapters (issue 3) -------------------------------------------------------------------

# -- forward and profiling (issue 4) ----------------------------------------------------

# -- tensor parallelism (issue 5) -------------------------------------------------------

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
