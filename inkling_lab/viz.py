"""matplotlib figures that explain the shared sink at a glance. Each function takes
plain values, returns a ``Figure`` and holds no domain logic of its own."""
from __future__ import annotations

import matplotlib

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

# -- core (issue 2): layouts, buffers, derived operands --------------------------------

# -- adapters (issue 3) -------------------------------------------------------------------

# -- forward and profiling (issue 4) ----------------------------------------------------

# -- tensor parallelism (issue 5) -------------------------------------------------------

# -- the per-expert outer defect (issue 7) ----------------------------------------------

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
    fig, axes = plt.subplots(1, 2, figsize=(11, 5.2), constrained_layout=True)
    panels = ((axes[0], intended, "intended (SPEC §4)"),
              (axes[1], upstream, "sglang 0.5.23, per-expert outer (SPEC §8)"))
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
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharey=True, constrained_layout=True)
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
