"""The kit side by side with sglang 0.5.23's own paths taken from its wheel (issue 15,
``inkling-lab profile --vs-upstream WHEEL``): at every point of the ``side_by_side_cases``
grid each contender is checked against the float64 reference (``forward.reference``) and
timed as graphs taking turns (``timing.time_interleaved``) under both flush modes;
``side_by_side_rows(record)`` gives plot-ready rows, ``side_by_side_table`` and
``side_by_side_summary`` the notes' tables."""
from __future__ import annotations

import os
import statistics
from typing import Callable, Sequence

import torch

from .. import records
from ..forward.reference import reference_forward
from ..lora import SharedSinkLoRA
from .roofline_model import GRID_RANKS, GRID_SLOTS, SIDE_SHAPES, SIDE_TOKENS, TARGET_LARGE_T, TARGET_SMALL_T, \
    TARGET_VS_BASE_LARGE_T, Case, roofline
from .timing import L2Flush, capture, stats, time_interleaved


def side_by_side_variants(sink, x, gammas, batch, S: int) -> dict[str, Callable[[], torch.Tensor]]:
    """The contenders at one point, each a capturable ``fn() -> out [T, H]``:
    ``kit_triton`` (this kit), ``sglang_multi`` (upstream's multi-slot Triton kernels;
    a one-slot batch gets a pool padded to two slots so they run), ``sglang_one_slot``
    (``S == 1`` only: upstream's cuBLAS path), ``sglang_base`` (upstream with no
    adapter active: the base sink alone), and ``kit_kept`` where the pool is shared outer: the kit
    with every used slot's merged weights kept (``SharedSinkLoRA.keep_merged``, made before the
    timing as a slot write would make them; the sink keeps them until its pool is set again).
    Upstream's paths need ``upstream_wheel.unpack`` first."""
    from ..forward.triton_backend import launch, plan
    from ..upstream_wheel import UpstreamSink

    ops = sink.operands()
    p = plan(ops, x.shape[0], batch, x.device)
    out = torch.empty_like(x)
    multi = UpstreamSink(sink, batch, min_slots=2)
    fns = {"kit_triton": lambda: launch(ops, x, gammas, p, out),
           "sglang_multi": lambda: multi.forward(x, gammas)}
    if ops.shared_outer and batch.active_slots():
        sink.keep_merged({s: float(batch.scalings[s]) for s in batch.active_slots()})
        kept = sink.operands()
        pk, out_k = plan(kept, x.shape[0], batch, x.device), torch.empty_like(x)
        fns["kit_kept"] = lambda: launch(kept, x, gammas, pk, out_k)
    if S == 1:
        one = UpstreamSink(sink, batch)
        fns["sglang_one_slot"] = lambda: one.forward(x, gammas)
    fns["sglang_base"] = lambda: multi.forward(x, gammas, lora=False)
    return fns


def side_by_side_case(c: Case, ceilings: dict[str, float], flushes: dict[str, L2Flush], reps: int,
                      device: str = "cuda", base=None, seed: int = 0) -> dict:
    """One point: every contender checked against ``reference_forward`` (with LoRA; the
    base against the reference without), then the correct ones timed interleaved
    under each flush mode. Fresh random pool, ``x`` and gammas per point."""
    sc = c.scenario(device, seed=seed, sink=base)
    sink, x, gammas, batch = sc.sink, sc.x, sc.gammas, sc.batch
    fns = side_by_side_variants(sink, x, gammas, batch, c.geometry.slots)
    ops = sink.operands()
    ref = reference_forward(ops, x, gammas, batch)
    ref_base = reference_forward(ops, x, gammas, None)
    errors, failures = {}, {}
    for k, fn in fns.items():
        try:
            fn()  # the first call compiles; the second takes the launch path that is timed
            out = fn()
            torch.cuda.synchronize()
        except Exception as exc:  # an upstream path that cannot run here is recorded, not fatal
            errors[k], failures[k] = float("nan"), f"{type(exc).__name__}: {exc}"[:500]
            continue
        errors[k] = records.relative_error(out, ref_base if k == "sglang_base" else ref, norm="fro")
    del ref, ref_base
    ok = {k for k, e in errors.items() if e == e and e < 1e-2}
    graphs = {k: capture(fns[k]) for k in fns if k in ok}
    times = {mode: {k: stats(v) for k, v in time_interleaved(graphs, fl, reps).items()}
             for mode, fl in flushes.items()}
    del graphs
    roof = roofline(c, **ceilings)
    return {"case": c.record(), "roofline_us": roof.us, "bound": roof.bound, "bytes": roof.bytes, "flops": roof.flops,
            "rel_err": errors, "failures": failures, "times": times,
            "kept_bytes": 0 if sink.kept is None else sink.kept.nbytes}



def side_by_side_cases(shapes: Sequence[str] = SIDE_SHAPES, ranks: Sequence[int] = GRID_RANKS,
                       slots: Sequence[int] = GRID_SLOTS, tokens: Sequence[int] = SIDE_TOKENS) -> list[Case]:
    return [Case.of(s, R, S, T) for s in shapes for R in ranks for S in slots for T in tokens]


def run_side_by_side(cases: Sequence[Case], ceilings: dict[str, float], reps: int = 30,
                     modes: Sequence[str] = ("read", "write"), device: str = "cuda",
                     checkpoint: Callable[[list[dict]], object] | None = None) -> list[dict]:
    """``side_by_side_case`` over ``cases``, one base sink per shape (new pool and
    inputs at every point), progress printed per shape; ``checkpoint(points so far)``
    after each shape, so a run cut short still leaves its finished shapes."""
    flushes = {m: L2Flush(device, m) for m in modes}
    bases: dict[str, SharedSinkLoRA] = {}
    out = []
    for i, c in enumerate(cases):
        if c.shape not in bases:
            if checkpoint is not None and out:
                checkpoint(out)
            bases.clear()
            torch.cuda.empty_cache()
            bases[c.shape] = SharedSinkLoRA.from_geometry(c.geometry, c.interleaved, getattr(torch, c.dtype), device)
            print(f"[{i}/{len(cases)}] shape {c.shape}", flush=True)
        out.append(side_by_side_case(c, ceilings, flushes, reps, device, bases[c.shape], seed=i))
    return out


UPSTREAM_VARIANTS = ("sglang_multi", "sglang_one_slot")
"""The upstream paths with LoRA the kit must beat (``sglang_base`` has none)."""
KIT_VARIANTS = ("kit_triton", "kit_kept")
"""The kit's contenders: as it runs by default, and with every used slot's merges kept."""


def kits(record: dict) -> list[str]:
    """The kit's contenders a side-by-side record timed (``KIT_VARIANTS``), in that order."""
    ran = {k for p in record["points"] for t in p["times"].values() for k in t}
    return [k for k in KIT_VARIANTS if k in ran]


def side_by_side_rows(record: dict, flush: str = "read", kit: str = "kit_triton") -> list[dict]:
    """Viz-ready rows of a side-by-side record (pure: no GPU, no I/O): per point the
    case fields, ``roofline_us``, every contender's median µs (``None`` where it did
    not run or failed its check), the kit over the roofline (``ratio``), over the
    fastest upstream LoRA path (``vs_upstream``, < 1 is faster) and over the no-LoRA
    base (``vs_base``), the base over the roofline (``base_ratio``), and whether each of
    issue 15's targets is met at that point."""
    rows = []
    for p in record["points"]:
        c = p["case"]
        med = {k: v["median_us"] for k, v in p["times"][flush].items()}
        us = med.get(kit)
        ups = [med[k] for k in UPSTREAM_VARIANTS if k in med]
        best_up = min(ups) if ups else None
        base = med.get("sglang_base")
        row = {k: c[k] for k in ("shape", "n", "H", "F", "R", "S", "T")}
        row.update({"roofline_us": p["roofline_us"], "bound": p["bound"], "kit_us": us,
                    **{f"{k}_us": med.get(k) for k in ("sglang_multi", "sglang_one_slot", "sglang_base")},
                    "best_upstream_us": best_up,
                    "ratio": us / p["roofline_us"] if us else None,
                    "vs_upstream": us / best_up if us and best_up else None,
                    "vs_base": us / base if us and base else None,
                    "base_ratio": base / p["roofline_us"] if base else None,
                    "rel_err": p["rel_err"]})
        targets = {"beats_upstream": row["vs_upstream"] is not None and row["vs_upstream"] < 1.0}
        T = c["T"]
        if T <= 32:
            targets["roofline"] = row["ratio"] is not None and row["ratio"] <= TARGET_SMALL_T
            targets["beats_base"] = row["vs_base"] is not None and row["vs_base"] < 1.0
        elif T >= 2048:
            targets["roofline"] = row["ratio"] is not None and row["ratio"] <= TARGET_LARGE_T
            targets["beats_base"] = row["vs_base"] is not None and row["vs_base"] <= TARGET_VS_BASE_LARGE_T
        row["targets"] = targets
        row["met"] = all(targets.values())
        rows.append(row)
    return rows


def side_by_side_table(record: dict, flush: str = "read", kit: str = "kit_triton") -> str:
    """Markdown of ``side_by_side_rows``: µs per contender, the kit's ratios, the misses."""
    def f(v, fmt="{:.1f}"):
        return "-" if v is None else fmt.format(v)

    lines = [f"flush: {flush}; µs are medians of graph replays; ratio = kit / roofline; "
             "vs up = kit / fastest upstream LoRA path; vs base = kit / sglang's no-LoRA base",
             "",
             "| shape | R | S | T | kit µs | sglang multi µs | sglang 1-slot µs | sglang base µs | roofline µs "
             "| ratio | vs up | vs base | missed |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in side_by_side_rows(record, flush, kit):
        missed = ", ".join(k for k, v in r["targets"].items() if not v)
        lines.append(f"| {r['shape']} | {r['R']} | {r['S']} | {r['T']} | {f(r['kit_us'])} | {f(r['sglang_multi_us'])} "
                     f"| {f(r['sglang_one_slot_us'])} | {f(r['sglang_base_us'])} | {f(r['roofline_us'])} "
                     f"| {f(r['ratio'], '{:.2f}')} | {f(r['vs_upstream'], '{:.2f}')} | {f(r['vs_base'], '{:.2f}')} "
                     f"| {missed} |")
    return "\n".join(lines)


def side_by_side_summary(record: dict, flush: str = "read", kit: str = "kit_triton") -> str:
    """How many points meet each target, per shape (for the notes); ``kit``: the kit's contender
    (``kit_kept``: with merged weights kept; its points are those it ran at). Target 3's roofline
    clause holds the kit to ``TARGET_LARGE_T`` only where sglang's base is itself within it, so its
    column counts those points, and the last column gives the base's own ratio over them all."""
    rows = [r for r in side_by_side_rows(record, flush, kit) if r["kit_us"] is not None]
    out = ["| shape | points | beats upstream | T<=32 roofline | T<=32 beats base | T>=2048 roofline "
           "| T>=2048 roofline where the base is | T>=2048 vs base | base / roofline, T>=2048 |",
           "|---|---|---|---|---|---|---|---|---|"]
    for shape in dict.fromkeys(r["shape"] for r in rows):
        rs = [r for r in rows if r["shape"] == shape]
        small = [r for r in rs if r["T"] <= 32]
        large = [r for r in rs if r["T"] >= 2048]
        where = [r for r in large if r["base_ratio"] is not None and r["base_ratio"] <= TARGET_LARGE_T]
        base = [r["base_ratio"] for r in large if r["base_ratio"] is not None]

        def count(sel, key):
            return f"{sum(r['targets'][key] for r in sel)}/{len(sel)}"

        span = f"{min(base):.2f}-{max(base):.2f}" if base else "-"
        out.append(f"| {shape} | {len(rs)} | {count(rs, 'beats_upstream')} | {count(small, 'roofline')} "
                   f"| {count(small, 'beats_base')} | {count(large, 'roofline')} | {count(where, 'roofline')} "
                   f"| {count(large, 'beats_base')} | {span} |")
    return "\n".join(out)


BASE_SPREAD = 0.04
"""``base_outliers``: how far sglang's base at a point may sit from its shape's and token count's median before it is
named. The base runs no LoRA, so R and S should not move it; two passes of one grid agree to ~0.4 % (median) and 2 %
(90th percentile) per point, and the base at the real model's 8-token points ran 7-9 % slow in some passes
(KERNEL_NOTES)."""


def base_outliers(record: dict, flush: str = "read", kit: str = "kit_triton", spread: float = BASE_SPREAD) -> str:
    """The points whose ``sglang_base`` differs from the median of the base over the points of the same shape and
    token count (its ranks and slot counts) by more than ``spread``, one line each, and whether judging the kit against
    that median instead moves the point in or out of its target (``T <= 32``: under the base; ``T >= 2048``: within
    ``TARGET_VS_BASE_LARGE_T``); ``"none"`` if no point is."""
    rows = [r for r in side_by_side_rows(record, flush, kit) if r["sglang_base_us"] is not None]
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        groups.setdefault((r["shape"], r["T"]), []).append(r["sglang_base_us"])
    out = []
    for r in rows:
        group = groups[(r["shape"], r["T"])]
        median = statistics.median(group)
        off = r["sglang_base_us"] / median
        if abs(off - 1) <= spread:
            continue
        line = (f"- {r['shape']} R{r['R']} S{r['S']} T{r['T']}: sglang_base {r['sglang_base_us']:.1f} µs, {off:.3f}x "
                f"the median of its shape and tokens ({median:.1f} µs over {len(group)} points)")
        if r["kit_us"] is not None:
            vs = r["kit_us"] / median
            line += f"; {kit} {r['vs_base']:.3f}x it, {vs:.3f}x the median"
            bound = 1.0 if r["T"] <= 32 else TARGET_VS_BASE_LARGE_T if r["T"] >= 2048 else None
            if bound is not None and r["targets"]["beats_base"] != (vs < bound if r["T"] <= 32 else vs <= bound):
                line += " (in its target by the base's time alone)" if r["targets"]["beats_base"] else \
                    " (out of its target by the base's time alone)"
        out.append(line)
    return "\n".join(out) or "none"


def stream_ceiling_table(record: dict, ceiling: dict, flush: str = "read") -> str:
    """Issue 26's stream-ceiling fraction: per shape, at one token and at ``T <= 32``, the ceiling's µs over
    each contender's (1.00 would be the stream itself; min-max over R, S and the token counts). ``ceiling``:
    a record of ``scripts/gpu/h200_stream_ceiling.py`` made on the same card as ``record`` (its ``rows``, each
    a shape's ``us["stream"]``: the base weights' bytes read by a kernel that does nothing else)."""
    stream = {r["shape"].lower(): r["us"]["stream"] for r in ceiling["rows"]}
    contenders = kits(record) + ["sglang_base"]
    out = ["| shape | tokens | stream µs | " + " | ".join(contenders) + " |", "|---|---|---|" + "---|" * len(contenders)]
    for shape in dict.fromkeys(p["case"]["shape"] for p in record["points"]):
        if shape.lower() not in stream:
            continue
        us = stream[shape.lower()]
        for label, most in (("T = 1", 1), ("T <= 32", 32)):
            spans = []
            for k in contenders:
                v = [us / p["times"][flush][k]["median_us"] for p in record["points"]
                     if p["case"]["shape"] == shape and p["case"]["T"] <= most and k in p["times"][flush]]
                spans.append(f"{min(v):.2f}-{max(v):.2f}" if v else "-")
            out.append(f"| {shape} | {label} | {us:.1f} | " + " | ".join(spans) + " |")
    return "\n".join(out)


def load_side_by_side(path: str | os.PathLike) -> dict:
    """A side-by-side record (``inkling-lab profile --vs-upstream``)."""
    return records.load_record(path, ("environment", "ceilings", "upstream", "points"), "side-by-side record",
                               "`inkling-lab profile --vs-upstream WHEEL`")

