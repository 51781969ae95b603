"""v21 and v22 on a CUDA GPU (issue 26 target 3): the LoRA merged into copies of the base weights per
slot for each forward (``triton_backend._launch_merged``, ``merge_kernel``), then the base
forward's GEMMs on them, against the path ``auto`` took before it (``kit``: ``plan`` with ``merges``
routing nothing) and sglang 0.5.23's no-LoRA base: one slot and S 4 and 8 at 512-8192
tokens, R 16 and 64, every shape, both flushes. ``merge``: one run a ``torch.mm``, several a grouped
GEMM on the gate/up side and a ``torch.mm`` per run on the down side; ``kept`` (v22): the same GEMMs on
copies kept from before the forward (``SharedSinkLoRA.keep_merged``), no merge in the forward. Each point
records what ``auto`` routes there (``routed``; ``routed_kept``: whether it takes the kept copies).

1. Correctness first, against the float64 reference on fresh random inputs (bfloat16 and float16,
   both gate/up layouts; uneven runs with an empty slot between them and scalings 0.6-1.4, and one
   slot throughout; 600 tokens), each contender launched twice and replayed from a graph twice into
   NaN-poisoned outputs.
2. The merge kernel alone against a copy of the same weight (``--breakdown``, read flush).
3. The sweep; every contender is checked again at each point (``h200_pdl.time_point``).

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=. python3 scripts/gpu/h200_merge.py --wheel WHEEL --out $OUT/NAME.json
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import sys

import torch

import h200_pdl  # this folder's (the script's own, first on sys.path): time_point, check_contender, sweep_main
from inkling_lab import profile as pr
from inkling_lab.batch import SlotBatch
from inkling_lab.forward import triton_backend as tb
from inkling_lab.forward.reference import reference_forward

ONE_SLOT_TOKENS = (512, 1024, 2048, 4096, 8192)
MULTI_TOKENS = (512, 1024, 2048, 4096, 8192)
MERGED = ("merge", "kept")
CHECK_SHAPES, CHECK_DTYPES = ("A", "Inkling-TP8"), ("bfloat16", "float16")
TILE_SWEEP = ((32, 128, 4), (64, 64, 4), (64, 256, 8), (128, 128, 8), (128, 64, 4))
"""``--breakdown``: ``merge_kernel`` tiles (rows, columns, warps) beside ``MERGE_TILE``."""


def unmerged_plan(ops, x, batch):
    """The plan ``auto`` made before v21: ``merges`` routing nothing."""
    ratio, tb.MERGE_RATIO = tb.MERGE_RATIO, float("inf")
    try:
        return tb.plan(ops, x.shape[0], batch, x.device)
    finally:
        tb.MERGE_RATIO = ratio


def contenders(sink, x, gammas, batch) -> dict:
    """``kit`` and ``merge`` on ``sink``'s pool as it is, then ``kept`` (v22): every slot of the pool kept
    merged at the batch's scalings (``keep_merged``), the batch forced onto the copies at any token count
    (the rows of its runs' slots, ``kept_operands``), whatever ``keeps`` would route."""
    sink.keep_merged(None)  # the kit's own path keeps nothing (the last point's copies are dropped)
    ops = sink.operands()
    p = unmerged_plan(ops, x, batch)
    m = dataclasses.replace(p, **tb.merge_operands(p.slots.cpu(), x.device), fast={})
    kept_ops, k = h200_pdl.kept_plan(tb, sink, p, x, batch)
    return {"kit": lambda out=torch.empty_like(x): tb.launch(ops, x, gammas, p, out),
            "merge": lambda out=torch.empty_like(x): tb._launch_merged(ops, x, gammas, m, out),
            "kept": lambda out=torch.empty_like(x): tb._launch_merged(kept_ops, x, gammas, k, out)}


def correctness() -> list[dict]:
    rows = []
    for shape in CHECK_SHAPES:
        for dtype in CHECK_DTYPES:
            for interleaved in (True, False):
                c = pr.Case.of(shape, 16, 4, 600, interleaved=interleaved, dtype=dtype)
                sc = c.scenario("cuda", seed=7 + int(interleaved))
                x, gammas = sc.x, sc.gammas
                ops = sc.sink.operands()  # the reference reads the pool, never the kept merges
                for segs, slots in (([150, 0, 320, 130], [0, 1, 2, 3]), ([600], [2])):
                    batch = SlotBatch.from_segments(segs, slots, 4, lora_ranks=[16] * 4, scalings=[0.6, 1.0, 1.4, 0.8])
                    ref = reference_forward(ops, x, gammas, batch)
                    errs = {}
                    for name, fn in contenders(sc.sink, x, gammas, batch).items():
                        if name in MERGED and len(segs) > 1 and dtype != "bfloat16":
                            continue  # torch's grouped GEMM: bfloat16 on CUDA only (grouped_mode)
                        h200_pdl.check_contender(name, fn, ref, errs, shape)
                    ok = all(e == e and e < 1e-2 for e in errs.values())
                    rows.append({**c.record(), "runs": len(segs), "rel_err": errs, "ok": ok})
                    print(f"check {shape} {dtype} il={interleaved} runs={len(segs)}: worst {max(errs.values()):.1e} "
                          f"ok={ok}", flush=True)
    return rows


def breakdown(reps: int) -> list[dict]:
    """``merge_kernel`` on each side alone at R 64, one slot and four, against ``clone`` of the same
    base weight (a copy: the weight read once and written once, as the merge moves it)."""
    flush, rows = pr.L2Flush("cuda"), []
    for shape in pr.SIDE_SHAPES:
        sc = pr.Case.of(shape, 64, 4, 64).scenario("cuda")
        ops = sc.sink.operands()
        ga, _, _, db = ops.buffers
        scal = torch.ones(4, dtype=torch.float32, device="cuda")
        n, F, H = ops.n, ops.intermediate, ops.hidden
        fns = {"copy_w13": lambda: ops.w13_lin.clone(), "copy_w2": lambda: ops.w2_lin.clone()}
        one = torch.zeros(1, dtype=torch.int32, device="cuda")
        w13_1 = torch.empty(1, n * 2 * F, H, dtype=ops.dtype, device="cuda")
        w2_1 = torch.empty(1, n * F, H, dtype=ops.dtype, device="cuda")
        for bm, bn, warps in TILE_SWEEP:  # one slot: the tile's effect on each side
            t = (bm, bn, warps)
            fns[f"merge_up_{bm}x{bn}w{warps}"] = lambda t=t: tb._merge(ops.w13_lin, ops.w1_delta, ga[:, 0], one, scal, w13_1, t)
            fns[f"merge_down_{bm}x{bn}w{warps}"] = lambda t=t: tb._merge(
                ops.w2_lin, ops.a_cat.transpose(1, 2), db[:, 0].transpose(1, 2), one, scal, w2_1, t)
        for G in (1, 4):
            idx = torch.arange(G, dtype=torch.int32, device="cuda")
            w13 = torch.empty(G, n * 2 * F, H, dtype=ops.dtype, device="cuda")
            w2 = torch.empty(G, n * F, H, dtype=ops.dtype, device="cuda")
            fns[f"merge_up_G{G}"] = lambda idx=idx, w13=w13: tb._merge(ops.w13_lin, ops.w1_delta, ga[:, 0], idx, scal, w13)
            fns[f"merge_down_G{G}"] = lambda idx=idx, w2=w2: tb._merge(
                ops.w2_lin, ops.a_cat.transpose(1, 2), db[:, 0].transpose(1, 2), idx, scal, w2)
        graphs = {}
        for k, fn in fns.items():
            fn()
            graphs[k] = pr.capture(fn)
        mb = {"w13": ops.w13_lin.numel() * 2 / 1e6, "w2": ops.w2_lin.numel() * 2 / 1e6}
        for k, v in pr.time_interleaved(graphs, flush, reps).items():
            side = "w13" if ("w13" in k or "up" in k) else "w2"
            moved = 2 * mb[side] * (int(k[-1]) if "_G" in k else 1)  # MB read + written (G slots)
            us = statistics.median(v)
            rows.append({"shape": shape, "launch": k, "us": us, "moved_mb": moved, "tb_s": moved / us})
            print(f"breakdown {shape:<11} {k:<14} {us:7.1f} us  {moved / us:.2f} TB/s", flush=True)
        del graphs, fns
    return rows


def sweep(upstream_cls, reps: int, shapes) -> list[dict]:
    flushes = h200_pdl.both_flushes()
    routed = {}

    def fns_for(sink, ops, x, gammas, batch):
        routed["at"] = "merge" if tb.plan(ops, x.shape[0], batch, x.device).grouped == "merge" else "kit"
        fns = contenders(sink, x, gammas, batch)
        routed["kept"] = tb.plan(sink.operands(), x.shape[0], batch, x.device).grouped == "kept"
        h200_pdl.with_sglang_base(fns, upstream_cls, sink, batch, x, gammas)
        return fns

    rows = []
    for shape in shapes:
        base = None
        for R in (16, 64):
            for S, tokens in ((1, ONE_SLOT_TOKENS), (4, MULTI_TOKENS), (8, MULTI_TOKENS)):
                for T in tokens:
                    base, row = h200_pdl.time_point(pr.Case.of(shape, R, S, T), fns_for, flushes, reps, base)
                    rows.append({**row, "routed": routed["at"], "routed_kept": routed["kept"]})
                    for fl in flushes:
                        got = {k.split("@")[0]: u for k, u in row["us"].items() if k.endswith("@" + fl)}

                        def over(a, b):  # a contender that failed its check has no time: said, not a KeyError
                            return f"{got[a] / got[b]:.3f}x" if a in got and b in got else "-"
                        print(f"{shape:<11} R{R:<2} S{S} T{T:<4} {fl:<5} " + " ".join(f"{k} {u:.1f}" for k, u in got.items())
                              + "  " + ", ".join(f"{a} {over(a, 'kit')} kit, {over(a, 'sglang_base')} base"
                                                 for a in MERGED)
                              + f", kit {over('kit', 'sglang_base')} base, routed {routed['at']} (kept: {routed['kept']})",
                              flush=True)
    return rows


def keep_crossovers(points: list[dict], flush: str = "read") -> list[dict]:
    """Per (shape, R, S) of several slots: the fewest tokens ``T0`` from which ``kept`` was at most the
    kit's time at every larger token count of the grid under ``flush`` (``None``: nowhere), and ``T0``
    as ``keeps``' ``KEEP_TOKENS``, ``T0 / S * sqrt(R / 16)`` (every slot has tokens in the sweep's batch)."""
    groups: dict[tuple, list[dict]] = {}
    for r in points:
        if r["S"] > 1:
            groups.setdefault((r["shape"], r["R"], r["S"]), []).append(r)
    out = []
    for (shape, R, S), rows in groups.items():
        first = None
        for r in sorted(rows, key=lambda r: r["T"], reverse=True):
            kept, kit = r["us"].get(f"kept@{flush}"), r["us"].get(f"kit@{flush}")
            if kept is None or kit is None or kept > kit:
                break
            first = r
        per_slot = None if first is None else first["T"] / S * math.sqrt(R / 16)
        out.append({"shape": shape, "R": R, "S": S, "T0": None if first is None else first["T"],
                    "keep_tokens": per_slot})
    return out


def keep_score(points: list[dict], flush: str, keep_tokens: float) -> tuple[int, int]:
    """How many measured points of several slots ``keeps`` sends, at ``keep_tokens``, to the faster of
    ``kept`` and the path ``plan`` took without the copies (``routed``), within 1 %; of how many."""
    scored = [r for r in points if r["S"] > 1 and f"kept@{flush}" in r["us"] and f"{r['routed']}@{flush}" in r["us"]]
    was, tb.KEEP_TOKENS = tb.KEEP_TOKENS, keep_tokens
    try:
        hits = 0
        for r in scored:
            kept, other = r["us"][f"kept@{flush}"], r["us"][f"{r['routed']}@{flush}"]
            hits += (kept if tb.keeps(r["T"], r["R"], r["S"]) else other) <= 1.01 * min(kept, other)
    finally:
        tb.KEEP_TOKENS = was
    return hits, len(scored)


def keep_fit(points: list[dict], flush: str = "read") -> float:
    """The ``KEEP_TOKENS`` with the best ``keep_score``: the candidates are the crossovers' values and
    ``KEEP_TOKENS`` now; a tie keeps the larger (fewer forwards on the copies)."""
    candidates = {tb.KEEP_TOKENS, *(c["keep_tokens"] for c in keep_crossovers(points, flush) if c["keep_tokens"])}
    return max(sorted(candidates, reverse=True), key=lambda k: keep_score(points, flush, k)[0])


def main() -> int:
    rec = h200_pdl.sweep_main(__doc__, MERGED, correctness, breakdown, sweep)
    for fl in ("read", "write"):
        pts = [r for r in rec["points"] if r["T"] >= 2048]

        def within(k):
            return h200_pdl.within_base(pts, k, fl)
        fastest = h200_pdl.routed_fastest(rec["points"], fl, ("kit", "merge"))
        # with the copies kept: what plan takes then (the copies where keeps routes them), among all three
        kept_routing = [{**r, "routed": "kept" if r["routed_kept"] else r["routed"]} for r in rec["points"]]
        fastest_kept = h200_pdl.routed_fastest(kept_routing, fl, ("kit", *MERGED))
        print(f"{fl}: T>=2048 within 1.1x base (of {len(pts)}): kit {within('kit')}, merge {within('merge')}, "
              f"kept {within('kept')}; with the copies kept, routed within 1% of the fastest of the three: "
              f"{fastest_kept}/{len(rec['points'])}; "
              f"routed within 1% of the faster: {fastest}/{len(rec['points'])}", flush=True)
    for fl in ("read", "write"):
        crossings = keep_crossovers(rec["points"], fl)
        for c in crossings:
            print(f"{fl}: kept from {c['T0']} tokens at {c['shape']} R{c['R']} S{c['S']} "
                  f"(KEEP_TOKENS {c['keep_tokens']})")
        best = keep_fit(rec["points"], fl)
        (hits, of), (now, _) = keep_score(rec["points"], fl, best), keep_score(rec["points"], fl, tb.KEEP_TOKENS)
        print(f"{fl}: KEEP_TOKENS routing the most points to the faster: {best:g} ({hits}/{of}; "
              f"now {tb.KEEP_TOKENS}: {now}/{of})", flush=True)
    print(f"{rec['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
