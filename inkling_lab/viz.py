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
    fig, axes = plt.subplots(len(rows) + 1, 1, figsize=(10, 5.6), constrained_layout=True,
                             gridspec_kw={"height_ratios": [1] * len(rows) + [0.45]})
    for ax, (title, own, label) in zip(axes, rows):
        width = own.shape[1]
        for e in range(n):
            for i in range(width):
                x = e * (width + 1) + i
                ax.add_patch(plt.Rectangle((x, 0), 0.92, 1, color=colors(int(own[e, i]) % 10)))
                if n * width <= 64:
                    ax.text(x + 0.46, 0.5, label(i), ha="center", va="center", color="white", fontsize=7)
            ax.text(e * (width + 1) + width / 2, 1.15, f"expert {e}", ha="center", fontsize=8)
        ax.set_xlim(-0.2, n * (width + 1))
        ax.set_ylim(0, 1.5)
        ax.set_axis_off()
        ax.set_title(title, loc="left", fontsize=9)
    last = axes[-1]
    last.add_patch(plt.Rectangle((0, 0), 1, 1, color="#bbbbbb", transform=last.transAxes))
    last.text(0.5, 0.5, "gate-up A [S, O, 2R, H] and down B [S, O, H, R]: replicated, every rank holds all",
              ha="center", va="center", fontsize=9, transform=last.transAxes)
    last.set_axis_off()
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors(r % 10)) for r in range(tp)]
    fig.legend(handles, [f"rank {r}" for r in range(tp)], loc="outside lower center", ncols=tp, fontsize=8)
    layout = "interleaved" if interleaved else "contiguous"
    fig.suptitle(f"Tensor parallelism, tp={tp}: each rank holds F/tp = {F // tp} of every expert's F={F} "
                 f"features ({layout} w13; g = gate, u = up)", fontsize=10)
    return fig


def allreduce_cost_figure(costs: list) -> Figure:
    """Bytes each rank sends per token for the sink's one all-reduce, from a list of
    ``parallel.AllReduceCost``, grouped by hidden size; the LoRA adds none."""
    import numpy as np

    from .parallel import dtype_name

    hiddens = sorted({c.hidden for c in costs})
    tps = sorted({c.tp for c in costs})
    fig, ax = plt.subplots(figsize=(8, 3.6), constrained_layout=True)
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
