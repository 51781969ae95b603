"""How two passes of the side by side agree (``inkling-lab profile --show FIRST --against SECOND``):
two side-by-side records of one grid (``side_by_side.load_side_by_side``), timed minutes or sessions
apart, give each contender's run-to-run spread (``|second / first - 1|`` of its median µs at every
point) and the points where one of the targets is met in one pass and missed in the other. Pure: no
GPU, no I/O."""
from __future__ import annotations

import statistics

from .side_by_side import kits, side_by_side_rows
from .timing import quantile

TARGETS = {"beats_upstream": ("beats upstream", "vs_upstream"), "beats_base": ("vs base", "vs_base"),
           "roofline": ("roofline", "ratio")}
"""Each key of ``side_by_side_rows``' ``targets``: its words in ``side_by_side_summary``'s columns and the
row's ratio it judges."""


def _label(case: dict) -> str:
    return f"{case['shape']} R{case['R']} S{case['S']} T{case['T']}"


def pass_agreement(first: dict, second: dict) -> dict:
    """``first`` against ``second``, two side-by-side records of the same grid, point by point.

    -> ``{"spread": [...], "flips": [...]}``: ``spread`` one row per flush both timed and contender both
    timed (``flush``, ``contender``, ``points``, ``median``, ``p90`` (``timing.quantile``, as the records'
    own ``p90_us``), ``max`` of ``|second / first - 1|``, and ``worst``, the point of the max); ``flips`` one row per kit
    (``side_by_side.kits``), flush, point and target whose verdict differs (``kit``, ``flush``,
    ``point``, ``target``, ``first``/``second``: the kit's ratio the target judges, ``met_first``).
    Raises ``ValueError`` naming the first point where the grids differ."""
    a, b = first["points"], second["points"]
    if len(a) != len(b):
        raise ValueError(f"the records time different grids: {len(a)} points in the first, {len(b)} in the "
                         "second; compare two passes of one grid (inkling-lab profile --vs-upstream, same options)")
    for i, (p, q) in enumerate(zip(a, b)):
        if p["case"] != q["case"]:
            raise ValueError(f"the records time different grids: point {i} is {_label(p['case'])} in the first "
                             f"and {_label(q['case'])} in the second; compare two passes of one grid")
    spread = []
    for flush in [f for f in a[0]["times"] if f in b[0]["times"]] if a else []:
        names = dict.fromkeys(k for p in a for k in p["times"][flush])
        for name in names:
            diffs = [(abs(q["times"][flush][name]["median_us"] / p["times"][flush][name]["median_us"] - 1), p["case"])
                     for p, q in zip(a, b) if name in p["times"][flush] and name in q["times"][flush]]
            if not diffs:
                continue
            values = [d for d, _ in diffs]
            worst = max(diffs, key=lambda d: d[0])
            spread.append({"flush": flush, "contender": name, "points": len(diffs), "median": statistics.median(values),
                           "p90": quantile(values, 0.9), "max": worst[0], "worst": _label(worst[1])})
    flips = []
    for kit in [k for k in kits(first) if k in kits(second)]:
        for flush in dict.fromkeys(s["flush"] for s in spread):
            for r, s in zip(side_by_side_rows(first, flush, kit), side_by_side_rows(second, flush, kit)):
                if r["kit_us"] is None or s["kit_us"] is None:
                    continue
                for target, met in r["targets"].items():
                    if met != s["targets"][target]:
                        ratio = TARGETS[target][1]
                        flips.append({"kit": kit, "flush": flush, "point": _label(r), "target": target,
                                      "first": r[ratio], "second": s[ratio], "met_first": met})
    return {"spread": spread, "flips": flips}


def pass_agreement_text(first: dict, second: dict) -> str:
    """Markdown of ``pass_agreement``: the spread table, then one line per target verdict that differs."""
    ag = pass_agreement(first, second)
    envs = first.get("environment", {}), second.get("environment", {})
    lines = [f"first pass {envs[0].get('date', '?')} (commit {str(envs[0].get('git_commit', '?'))[:7]}), "
             f"second {envs[1].get('date', '?')} (commit {str(envs[1].get('git_commit', '?'))[:7]}); "
             "|second / first - 1| of each median, over the points both timed",
             "",
             "| flush | contender | points | median | 90th percentile | worst | at |",
             "|---|---|---|---|---|---|---|"]
    for s in ag["spread"]:
        lines.append(f"| {s['flush']} | {s['contender']} | {s['points']} | {s['median']:.1%} | {s['p90']:.1%} "
                     f"| {s['max']:.1%} | {s['worst']} |")
    lines.append("")
    if not ag["flips"]:
        lines.append("every target verdict is the same in both passes")
    for f in ag["flips"]:
        side = "met in the first pass only" if f["met_first"] else "met in the second pass only"
        lines.append(f"- {f['kit']}, {f['flush']} flush, {f['point']}: {TARGETS[f['target']][0]} "
                     f"{f['first']:.3f}x then {f['second']:.3f}x ({side})")
    return "\n".join(lines)
