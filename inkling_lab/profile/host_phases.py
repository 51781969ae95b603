"""The host cost per call in the CPU's phases (issue 26 target 4), read from a recorded run's
``host_phases`` windows (``scripts/gpu/h200_pdl.py``'s ``host_phases``: per window, the median
host µs of each way of calling the forward and of a fixed 200-step Python loop).

The GPU machines' CPUs run in two phases, the same Python at about half speed in the slow one;
the fixed loop says which phase a window was in, so a window is *slow* where its loop took at
least ``SLOW_LOOP`` times the record's fastest loop."""
from __future__ import annotations

import statistics
from collections.abc import Iterable

SLOW_LOOP = 1.5
"""A window whose fixed loop took this many times the fastest window's is in the slow phase (the
recorded loops fall in two groups, 1.0-1.2 and 2.0-2.4 µs on the H100 machine)."""

WAYS = {"plain": "{}_us", "out=": "{}_out_us", "static": "{}_static_us"}
"""The ways of calling the forward a window times, each batch (``resident``, ``host_batch``) in turn:
a new output, a caller's ``out=``, the graph's static tensors (``static_io``)."""

TARGET_HOST_US = 40.0
"""Issue 26 target 4: the host cost per call at T <= 32, in every window of every phase."""


def phase_windows(windows: Iterable[dict]) -> dict[str, list[dict]]:
    """``{"fast": [...], "slow": [...]}``: the windows split by their fixed loop (``SLOW_LOOP``);
    a phase with no window is left out."""
    windows = list(windows)
    if not windows:
        return {}
    fastest = min(w["python_loop_us"] for w in windows)
    out: dict[str, list[dict]] = {}
    for w in windows:
        out.setdefault("slow" if w["python_loop_us"] >= SLOW_LOOP * fastest else "fast", []).append(w)
    return {k: out[k] for k in ("fast", "slow") if k in out}


def host_phase_rows(windows: Iterable[dict]) -> list[dict]:
    """One row per phase, batch and way: ``phase``, ``batch``, ``way``, ``windows``, ``min``,
    ``median``, ``max`` (µs), ``loop`` (the fixed loop's median µs in that phase) and ``met``
    (every window of the phase at or under ``TARGET_HOST_US``)."""
    rows = []
    for phase, ws in phase_windows(windows).items():
        loop = statistics.median(w["python_loop_us"] for w in ws)
        for batch in ("resident", "host_batch"):
            for way, column in WAYS.items():
                col = column.format(batch)
                v = sorted(w[col] for w in ws if col in w)
                if v:
                    rows.append({"phase": phase, "batch": batch, "way": way, "windows": len(v), "min": v[0],
                                 "median": statistics.median(v), "max": v[-1], "loop": loop,
                                 "met": v[-1] <= TARGET_HOST_US})
    return rows


def host_phase_table(windows: Iterable[dict]) -> str:
    """``host_phase_rows`` as aligned text: per phase its windows and fixed loop, then each batch's
    ways as ``min-max (median)`` µs and whether target 4 holds in every window."""
    lines, last = [], None
    for r in host_phase_rows(windows):
        if r["phase"] != last:
            last = r["phase"]
            lines.append(f"{last} phase: {r['windows']} windows, the fixed loop {r['loop']:.1f} µs")
        lines.append(f"  {r['batch']:<10} {r['way']:<6} {r['min']:5.1f}-{r['max']:5.1f} µs (median {r['median']:5.1f})"
                     f"  target 4 {'met' if r['met'] else 'not met'}")
    return "\n".join(lines)
