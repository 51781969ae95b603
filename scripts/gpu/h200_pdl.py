"""v13 on a CUDA GPU: the three weight-streaming launches chained by programmatic dependent
launch (``Tiles.pdl``) against the launches without it (``v9``), sglang 0.5.23's no-LoRA
base taken from its wheel, and the stream ceiling (``h200_stream_ceiling.json``), at every
T <= 32 point of the side-by-side grid; then the host cost per call over time (target 4).
(The recorded run, ``data/profiles/h200_pdl.json`` at 7456b20, also timed a ``w2`` prefetch
into L2 before the down kernel's wait: no gain at A, 5-15 µs lost elsewhere, so it was removed.)

1. Correctness first, each variant against the float64 reference (``forward.reference``)
   on fresh random inputs: bf16 and fp16, both gate/up layouts, both outer layouts, mixed /
   base-only / rank-0 tokens, a batch with no adapter, a device-resident batch, and a graph
   of the launches replayed twice; the output poisoned with NaN before each run.
2. Timing: per point, CUDA graphs of every contender replayed in turns (``time_interleaved``,
   read flush), medians.
3. Host cost: ``sink(x, gammas, batch=..., backend="triton")`` timed in windows for
   ``--host-seconds``, beside a fixed pure-Python loop, so a slow phase shows whether the
   CPU itself was slow then (the loop slows too) or the call was.

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=. python3 scripts/gpu/h200_pdl.py --wheel WHEEL --out $OUT/h200_pdl.json

``--gather`` (v28): also the three launches with ``Tiles.gather`` (each token's own slot's factors in the
LoRA epilogues, no loop over a tile's slots), with PDL and without, checked and timed beside the others;
``--up-act`` (v33): also the launches with ``up_act_kernel`` on the base ``w13`` and the LoRA in its epilogue as
the up launch (``Tiles.lora_up``), with PDL and without, and what ``auto`` routes (``auto``);
``--bare`` (v33's breakdown): also the forward without its LoRA three ways, ``kit_bare_base`` (``up_kernel`` and
``down_kernel``, the default kit's launches), ``upact_bare_base`` (``up_act_kernel`` and ``down_kernel``) and
``upact_cublas_base`` (``up_act_kernel`` and cuBLAS's down GEMM: ``kit_kept``'s two launches, on the base weights);
``--pdl-up`` (v50b): also ``pdl_up`` (``PDL_UP``), checked and timed, and what ``auto`` routes (v51's ``--late``
variants, the down launch released after the up streams, ran at 47338c0: ``h100_pdl_late_v51*.json``; not routed, so
taken out with ``Tiles.pdl_late``); ``--down-shrink`` (v52): also the down shrink made in the down kernel
(``DOWN_SHRINK``: without PDL, with it and with ``pdl_up``), checked (every variant also on a batch whose tokens are all
on one slot, where it applies) and timed, and what ``auto`` routes (v52's records, ``h100_fold_v52*.json``, ran it as
``--fold`` with variants named ``fold_*``, at f39a410 and 550caac); ``--check-tokens``
the correctness pass's token counts (it checks the shapes timed, ``--shapes``);
``--ranks`` and ``--slots`` the pool ranks and slot counts timed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from inkling_lab import profile as pr, records
from inkling_lab.batch import SlotBatch
from inkling_lab.forward import triton_backend as tb
from inkling_lab.forward.reference import reference_forward

VARIANTS = {"v9": dict(pdl=False), "pdl": dict(pdl=True)}
CHECKED = ["pdl"]
"""The variants the correctness pass checks (``--gather`` adds its own)."""
GATHER = {"gather": dict(pdl=True, gather=True), "gather_v9": dict(pdl=False, gather=True)}
"""v28's variants (``--gather``): the LoRA epilogues read each token's own slot's factors (``Tiles.gather``),
with PDL and without."""
PDL_UP = {"pdl_up": dict(pdl=False, pdl_up=True)}
"""v50b's variant (``--pdl-up``): the up launch the shrink's programmatic dependent, the down launch after the whole
up grid (``Tiles.pdl_up``): the shrink under the up stream without the waiting down programs that cost ``pdl`` 10-23 %
at the real model's weights."""
DOWN_SHRINK = {"down_shrink_v9": dict(pdl=False, down_shrink=True), "down_shrink_pdl": dict(pdl=True, down_shrink=True),
               "down_shrink_pdl_up": dict(pdl=False, pdl_up=True, down_shrink=True)}
"""v52's variants (``--down-shrink``): ``Tiles.down_shrink``, the down shrink made by the down kernel from the ``act``
tiles it streams (one slot, shared outer, the down launch unsplit; elsewhere the same as without it), on the chainings
``auto`` routes at one slot: none (``v9``), full PDL (A and B) and the shrink's edge alone (the real model, the TP-8
slice at 2-8 tokens)."""
UP_ACT = {"upact": dict(pdl=True, lora_up=True), "upact_v9": dict(pdl=False, lora_up=True)}
"""v33's variants (``--up-act``): ``up_act_kernel`` with the LoRA epilogue as the up launch (``lora_up_tiles``),
the shrink and the down kernel as ``pick_tiles`` has them (gathered where ``gathers`` says), with PDL and without."""
CHECK_TOKENS = (1, 9, 32)
"""Token counts of the correctness pass: one token, one token tile, two."""
CEILING = {"A": "A", "B": "B", "Inkling": "inkling", "Inkling-TP8": "inkling-tp8"}


def tiles(variant: str, T: int, ops, slots: int = 1) -> tb.Tiles:
    """``pick_tiles``' three-launch choice with PDL forced on or off (``plan`` would apply
    ``use_pdl``); one token is asked as two, which v14 sends to the GEMV kernels instead. A ``lora_up``
    variant (v33) takes ``lora_up_tiles`` and the gathered down epilogue where ``gathers`` has it for
    ``slots`` slots."""
    v = dict(VARIANTS[variant])
    t = tb.pick_tiles(max(T, 2), ops.n * ops.intermediate * ops.hidden)
    if v.pop("lora_up", False):
        v.update(lora_up=lora_up_tiles(T, ops), gather=tb.gathers(max(T, 2), ops, t, slots))
    return replace(t, **v)


def lora_up_tiles(T: int, ops) -> tb.Tiles:
    """``up_act_kernel``'s tiles for ``T`` tokens: ``up_acts``' pick, and past its token limits the tile it
    would take at fewer tokens (unsplit where the kernel has ``UP_ACT_PROGRAMS`` programs, else split)."""
    unsplit = ops.n * -(-ops.intermediate // tb.UP_ACT_TILES.bf) >= tb.UP_ACT_PROGRAMS
    return tb.up_acts(max(T, 2), ops) or (tb.UP_ACT_TILES if unsplit else tb.UP_ACT_SPLIT_TILES)


def run(ops, x, gammas, batch, t: tb.Tiles) -> torch.Tensor:
    """Two launches on one plan (the second is the repeat path), the second into NaN."""
    p = tb.plan(ops, x.shape[0], batch, x.device, t)
    tb.launch(ops, x, gammas, p, torch.empty_like(x))
    out = torch.full_like(x, float("nan"))
    tb.launch(ops, x, gammas, p, out)
    torch.cuda.synchronize()
    return out


def graph_replays(ops, x, gammas, batch, t: tb.Tiles) -> torch.Tensor:
    p = tb.plan(ops, x.shape[0], batch, x.device, t)
    out = torch.full_like(x, float("nan"))
    graph = pr.capture(lambda: tb.launch(ops, x, gammas, p, out))
    graph.replay()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return out


def correctness(shapes=None, tokens=None) -> list[dict]:
    """Point 1: every variant of ``CHECKED`` at ``tokens`` (default ``CHECK_TOKENS``), on ``shapes`` (default every
    shape)."""
    return checked_layouts(tokens or CHECK_TOKENS, CHECKED, lambda v, ops, x, gammas, batch, ref, ref_base, c: check(
        ops, x, gammas, batch, tiles(v, x.shape[0], ops), ref, ref_base, c), shapes)


def checked_layouts(tokens, variants, errors, shapes=None) -> list[dict]:
    """The correctness pass of this folder's scripts: every layout of A and two of each other shape (both outer
    layouts, both gate/up layouts, bf16 and fp16: the first and last of those), at each of ``tokens``, a batch of
    random slots (token 0 in slot 0, slot 2 of rank 0, base-only tokens), each of ``variants`` judged by
    ``errors(variant, ops, x, gammas, batch, ref, ref_base, case)`` -> its relative errors; a failure is recorded
    as NaN and the pass goes on; ``shapes`` (default ``profile.SHAPES``) narrows it. -> a row per check, ``ok`` where every error is under 1e-2."""
    rows = []
    layouts = [(o, i, d) for o in (1, 2) for i in (True, False) for d in ("bfloat16", "float16")]
    for shape in shapes or pr.SHAPES:
        for o, i, d in layouts if shape == "A" else layouts[:1] + layouts[-1:]:
            for T in tokens:
                c = pr.Case.of(shape, 16, 3, T, outer=o, interleaved=i, dtype=d)
                sc = c.scenario("cuda", seed=T)
                x, gammas = sc.x, sc.gammas
                g = c.geometry
                gen = torch.Generator().manual_seed(T + 7)
                ids = torch.randint(-1, g.slots, (T,), generator=gen)
                ids[0] = 0
                batch = SlotBatch.from_token_slots(ids, g.slots, lora_ranks=[g.max_rank, g.max_rank, 0])  # slot 2: rank 0
                ops = sc.sink.operands()
                ref = reference_forward(ops, x, gammas, batch)
                ref_base = reference_forward(ops, x, gammas, None)
                for v in variants:
                    try:
                        errs = errors(v, ops, x, gammas, batch, ref, ref_base, c)
                    except Exception as exc:  # recorded, and the run goes on
                        errs = {"failure": float("nan")}
                        print(f"check {shape} T={T} {v} FAILED: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                    worst = max(errs.values(), key=lambda e: float("inf") if e != e else e)
                    rows.append({**c.record(), "variant": v, "rel_err": errs,
                                 "ok": all(e == e and e < 1e-2 for e in errs.values())})
                    print(f"check {shape} T={T} O={o} il={i} {d} {v}: worst {worst:.1e}", flush=True)
    return rows


def check(ops, x, gammas, batch, t, ref, ref_base, c) -> dict:
    T = x.shape[0]
    one = SlotBatch.from_token_slots([0] * T, c.geometry.slots, lora_ranks=[c.geometry.max_rank] * c.geometry.slots)
    errs = {"mixed": records.relative_error(run(ops, x, gammas, batch, t), ref, "fro"),
            "one_slot": records.relative_error(run(ops, x, gammas, one, t), reference_forward(ops, x, gammas, one), "fro"),
            "no_adapter": records.relative_error(run(ops, x, gammas, None, t), ref_base, "fro"),
            "graph": records.relative_error(graph_replays(ops, x, gammas, batch, t), ref, "fro")}
    if c.geometry.outer == 1 and c.dtype == "bfloat16":
        errs["resident"] = records.relative_error(run(ops, x, gammas, batch.to("cuda"), t), ref, "fro")
        errs["base_only"] = records.relative_error(
            run(ops, x, gammas, SlotBatch.from_token_slots([-1] * T, c.geometry.slots), t), ref_base, "fro")
    return errs


def run_arguments(doc: str, shapes, ceiling: bool = False, wheel: bool = True) -> argparse.ArgumentParser:
    """The options every H200 run script of this folder takes: the sglang wheel (unless ``wheel`` is off: a
    sweep that times no sglang path), the record's path, the replays per point and the shapes (default
    ``shapes``), and with ``ceiling`` the card's stream-ceiling record (``stream_ceilings``); ``doc``'s first
    line describes it."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    if wheel:
        ap.add_argument("--wheel", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--shapes", default=",".join(shapes))
    if ceiling:
        ap.add_argument("--ceiling", default=CEILING_RECORD,
                        help="the stream-ceiling record of this card (h200_stream_ceiling.py's; one made on another "
                             "card is refused)")
    return ap


def record_checks(rec: dict, rows: list[dict], path: str, t0: float | None = None) -> None:
    """A correctness pass's ``rows`` into ``rec`` (written to ``path`` at once, so they survive a later failure),
    and how many are right printed (with the seconds since ``t0``)."""
    rec["correctness"] = rows
    records.write_json(path, rec)
    took = "" if t0 is None else f", {time.time() - t0:.0f} s"
    print(f"correctness: {sum(r['ok'] for r in rows)}/{len(rows)} ok{took}", flush=True)


def run_environment() -> dict:
    """The record's ``environment``, its ``command`` this script's own command line."""
    return records.environment("python3 " + " ".join(sys.argv))


def record_head(env: dict, wheel: str | None = None, **fields) -> dict:
    """What every H200 record of these scripts starts with: ``env``, this run's ceilings
    (printed, as the run's first line of numbers), ``fields``, and with a ``wheel`` the
    sglang files taken out of it (``upstream_wheel.unpack``, their RECORD check)."""
    ceilings = pr.measure_ceilings()
    print(env, ceilings, flush=True)
    rec = {"environment": env, "ceilings": ceilings, **fields}
    if wheel:
        from inkling_lab.upstream_wheel import unpack
        rec["upstream"] = unpack(wheel, Path.home() / ".cache" / "inkling_lab" / "sglang-0.5.23")
    return rec


def check_contender(name: str, fn, ref: torch.Tensor, errs: dict, label: str, graph: bool = True) -> None:
    """``errs[name]``: ``fn()``'s relative error against ``ref`` on its second launch into a
    NaN-poisoned output, then (``graph``) ``errs[name + "_graph"]`` after two graph replays the same
    way; a failure is recorded as NaN (printed with ``label``) and the run goes on."""
    try:
        out = fn()
        out.fill_(float("nan"))
        out = fn()
        torch.cuda.synchronize()
        errs[name] = records.relative_error(out, ref, "fro")
        if not graph:
            return
        replay = pr.capture(fn)
        for _ in range(2):
            out.fill_(float("nan"))
            replay.replay()
        torch.cuda.synchronize()
        errs[name + "_graph"] = records.relative_error(out, ref, "fro")
    except Exception as exc:  # recorded, and the run goes on
        errs[name] = float("nan")
        print(f"check {label} {name} FAILED: {type(exc).__name__}: {str(exc)[:300]}", flush=True)


def routed_fastest(points: list[dict], flush: str, contenders) -> int:
    """How many ``points`` time what ``auto`` routes (``routed``) within 1 % of the fastest of
    ``contenders`` under ``flush``; a point routed to none of them, or whose routed contender failed
    its check (no time), does not count."""
    inf = float("inf")
    return sum(1 for r in points if r["routed"] in contenders and r["us"].get(f"{r['routed']}@{flush}", inf)
               <= 1.01 * min(r["us"].get(f"{k}@{flush}", inf) for k in contenders))


def one_slot_batch(g, T: int) -> SlotBatch:
    """The one-slot checks' batch on geometry ``g`` (three slots): every one of ``T`` tokens on slot 2, not the first,
    at scaling 0.7, beside a rank-0 slot."""
    return SlotBatch.from_token_slots([2] * T, g.slots, lora_ranks=[g.max_rank, 0, g.max_rank],
                                      scalings=[0.7, 1.3, 0.7])


def checked_row(c: pr.Case, fns: dict, ref: torch.Tensor, label: str) -> dict:
    """``c``'s record with every contender of ``fns`` checked against ``ref`` (``check_contender``,
    graph replays included): ``rel_err`` per contender and ``ok`` (every one finite and under 1e-2)."""
    errs = {}
    for name, fn in fns.items():
        check_contender(name, fn, ref, errs, label)
    ok = all(e == e and e < 1e-2 for e in errs.values())
    print(f"check {label}: worst {max(errs.values()):.1e} ok={ok}", flush=True)
    return {**c.record(), "rel_err": errs, "ok": ok}


def kept_plan(tb, sink, p, x: torch.Tensor, batch) -> tuple:
    """Every slot of ``sink``'s pool kept merged at ``batch``'s scalings (``keep_merged``) and plan ``p``
    forced onto the copies at any token count (the rows of its runs' slots, ``kept_operands``), whatever
    ``keeps`` would route: ``(operands with the copies, the plan)``. ``tb``: the caller's backend module
    (the interpreted one in the CPU tests)."""
    sink.keep_merged({s: float(c) for s, c in enumerate(batch.scalings.tolist())})
    used = torch.unique_consecutive(p.slots.cpu()).tolist()
    return sink.operands(), replace(p, **tb.kept_operands(p.slots.cpu(), used, x.device), fast={},
                                    split=None, tiles=p.tiles if p.tiles.cublas else tb.ONE_SLOT_TILES)


def own_slot_products(src: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``[T, N]`` float64: each token times its own slot's ``a [S, N, K]`` (slot ``-1``: zeros)."""
    out = torch.zeros(src.shape[0], a.shape[1], dtype=torch.float64, device=src.device)
    for s in slots.unique().tolist():
        if s >= 0:
            rows = slots == s
            out[rows] = src[rows].double() @ a[s].double().T
    return out


def both_flushes() -> dict:
    """The L2 flush modes a sweep times each point under, by the name its record keys carry."""
    return {"read": pr.L2Flush("cuda"), "write": pr.L2Flush("cuda", mode="write")}


def timed_medians(fns: dict, flushes: dict, reps: int) -> dict:
    """``"<contender>@<flush>"`` medians of ``fns``, their graphs taking turns (``profile.time_interleaved``)."""
    graphs = {k: pr.capture(fn) for k, fn in fns.items()}
    return {f"{k}@{fl}": statistics.median(v) for fl, f in flushes.items()
            for k, v in pr.time_interleaved(graphs, f, reps).items()}


def finish_record(rec: dict, path: str, t0: float) -> int:
    """``rec`` with its ``seconds`` since ``t0``, written to ``path``; the seconds printed -> the exit status."""
    rec["seconds"] = round(time.time() - t0, 1)
    records.write_json(path, rec)
    print(f"{rec['seconds']} s")
    return 0


def launches(ops, x: torch.Tensor, gammas: torch.Tensor, contenders) -> dict:
    """Each ``(label, batch, tiles)`` of ``contenders`` as a forward of no arguments: ``triton_backend.launch`` on a
    plan of its own (``tiles`` ``None``: the one ``auto`` routes) into an output of its own."""
    fns = {}
    for label, b, t in contenders:
        p, out = tb.plan(ops, x.shape[0], b, x.device, t), torch.empty_like(x)
        fns[label] = (lambda p=p, out=out: tb.launch(ops, x, gammas, p, out))
    return fns


def with_sglang_base(fns: dict, upstream_cls, sink, batch, x: torch.Tensor, gammas: torch.Tensor):
    """``fns`` with sglang 0.5.23's no-LoRA base added as ``sglang_base`` (its multi-slot layer's forward with
    ``lora=False``: ``forward_with_lora`` of ``srt/lora/trtllm_lora_temp/inkling_dense.py`` with no active adapter,
    cuBLAS, ``silu_and_mul_triton`` of ``sglang/kernels/ops/moe/inkling_moe.py``, cuBLAS) -> the layer, for a caller
    that times its LoRA too."""
    multi = upstream_cls(sink, batch, min_slots=2)
    fns["sglang_base"] = lambda: multi.forward(x, gammas, lora=False)
    return multi


def print_against_base(label: str, row: dict, flushes) -> None:
    """One line per flush: each contender's median µs of ``row`` and its ratio to ``sglang_base``."""
    for fl in flushes:
        got = {k.split("@")[0]: u for k, u in row["us"].items() if k.endswith("@" + fl)}
        b = got.get("sglang_base")
        print(f"{label} {fl:<5} " + " ".join(f"{k} {u:.1f} ({u / b:.3f}x base)" if b else f"{k} {u:.1f}"
                                            for k, u in got.items()), flush=True)


def timed_cases(cases, contenders, upstream_cls, reps: int) -> list[dict]:
    """Each ``(label, case)`` of ``cases`` timed under both flushes (``time_point``): ``contenders(sink, x,
    gammas, batch)`` and sglang's no-LoRA base (``with_sglang_base``), the sink kept while the shape stays,
    one line per flush printed (``print_against_base``) -> the rows."""
    flushes, rows, base, shape = both_flushes(), [], None, None

    def fns_for(sink, ops, x, gammas, batch):
        fns = contenders(sink, x, gammas, batch)
        with_sglang_base(fns, upstream_cls, sink, batch, x, gammas)
        return fns

    for label, c in cases:
        if c.shape != shape:
            base, shape = None, c.shape
        base, row = time_point(c, fns_for, flushes, reps, base)
        rows.append(row)
        print_against_base(label, row, flushes)
    return rows


def within_base(points: list[dict], contender: str, flush: str, ratio: float = 1.1) -> int:
    """How many ``points`` time ``contender`` within ``ratio`` of sglang's no-LoRA base under ``flush``
    (target 3's test; a contender that failed its check has no time and does not count)."""
    return sum(1 for r in points if r["us"].get(f"{contender}@{flush}", float("inf"))
               <= ratio * r["us"][f"sglang_base@{flush}"])


def sweep_main(doc: str, modes, correctness, breakdown, sweep) -> dict:
    """The body of a sweep script's ``main``: its arguments (``run_arguments``, and ``--breakdown``
    where the script has a ``breakdown``), the record's head, ``correctness()``, ``breakdown(reps)``
    where asked, then ``sweep(UpstreamSink, reps, shapes)``, the record written after each step;
    -> the record."""
    ap = run_arguments(doc, pr.SIDE_SHAPES)
    if breakdown is not None:
        ap.add_argument("--breakdown", action="store_true")
    args = ap.parse_args()
    from inkling_lab.upstream_wheel import UpstreamSink

    t0 = time.time()
    rec = record_head(run_environment(), args.wheel, modes=list(modes))
    record_checks(rec, correctness(), args.out, t0)
    if breakdown is not None and args.breakdown:
        rec["breakdown"] = breakdown(args.reps)
        records.write_json(args.out, rec)
    rec["points"] = sweep(UpstreamSink, args.reps, args.shapes.split(","))
    rec["seconds"] = round(time.time() - t0, 1)
    records.write_json(args.out, rec)
    return rec


def time_point(c: pr.Case, fns_for, flushes: dict, reps: int, base=None):
    """Every contender of ``fns_for(sink, ops, x, gammas, batch)`` at case ``c``, checked
    against the float64 reference (``*_base`` against the reference without LoRA), then
    captured once and timed as graphs taking turns under each flush; -> (sink, row) with
    ``us["<contender>@<flush>"]`` medians."""
    sc = c.scenario("cuda", sink=base)
    sink, x, gammas, batch = sc.sink, sc.x, sc.gammas, sc.batch
    ops = sink.operands()
    ref, ref_base = reference_forward(ops, x, gammas, batch), reference_forward(ops, x, gammas, None)
    fns, errs, graphs = fns_for(sink, ops, x, gammas, batch), {}, {}
    for k, fn in fns.items():
        try:
            fn()
            o = fn()
            torch.cuda.synchronize()
            errs[k] = records.relative_error(o, ref_base if k.endswith("_base") else ref, "fro")
            if errs[k] < 1e-2:
                graphs[k] = pr.capture(fn)
        except Exception as exc:  # recorded, and the run goes on
            errs[k] = float("nan")
            print(f"{c.shape} T{c.T} {k} FAILED: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    del ref, ref_base
    us = {f"{k}@{mode}": statistics.median(v)
          for mode, fl in flushes.items() for k, v in pr.time_interleaved(graphs, fl, reps).items()}
    del graphs
    return sink, {**c.record(), "us": us, "rel_err": errs}


def time_read_point(c: pr.Case, fns_for, flush, reps: int, base=None):
    """``time_point`` under the read flush alone, the row's ``us`` naming each contender without its flush (the
    one-flush records of ``h200_gemv.py``, ``h200_few_tiles.py``, ``experiments/few_fma``); -> (sink, row)."""
    sink, row = time_point(c, fns_for, {"read": flush}, reps, base)
    row["us"] = {k.removesuffix("@read"): u for k, u in row["us"].items()}
    return sink, row


CEILING_RECORD = "data/profiles/h200_stream_ceiling.json"


def stream_ceilings(path: str) -> dict:
    """The stream ceiling per shape (``CEILING``'s names -> µs) of ``path``, a ``h200_stream_ceiling.py``
    record; ``SystemExit`` if it was made on another card than this one (a record's fractions would then
    mix two cards: h200_gemv_v32.json's did)."""
    rec = json.loads(Path(path).read_text())
    made_on, here = rec["environment"]["device"], torch.cuda.get_device_name()
    if made_on != here:
        raise SystemExit(f"{path} was made on {made_on}, this is {here}: give --ceiling a record of this card "
                         "(scripts/gpu/h200_stream_ceiling.py, in the same call)")
    return {r["shape"]: r["us"]["stream"] for r in rec["rows"]}


def bare_forwards(ops, x: torch.Tensor, gammas: torch.Tensor) -> dict:
    """``--bare``'s contenders (the module docstring names them): the forward of ``x [T, H]`` without its LoRA,
    each a function of no arguments returning ``out [T, H]``."""
    T = x.shape[0]
    t = tb.pick_tiles(max(T, 2), ops.n * ops.intermediate * ops.hidden)
    kit = tb.plan(ops, T, None, x.device, t)
    up = tb.plan(ops, T, None, x.device, replace(t, lora_up=lora_up_tiles(T, ops)))
    key = tb._launch_key(ops, x, gammas, x) + ("bare",)
    act, outs = torch.empty(T, ops.n * ops.intermediate, dtype=x.dtype, device=x.device), [torch.empty_like(x) for _ in range(3)]

    def upact_cublas():
        tb._up_act(ops, x, gammas, ops.w13, act, up, key, up.tiles.lora_up)
        return torch.mm(act, ops.w2_lin, out=outs[2])

    return {"kit_bare_base": lambda: tb.launch(ops, x, gammas, kit, outs[0]),
            "upact_bare_base": lambda: tb.launch(ops, x, gammas, up, outs[1]), "upact_cublas_base": upact_cublas}


def timing(wheel: str, reps: int, ceilings: dict, shapes, ranks, slots, tokens, auto: bool = False,
           ceiling_record: str = CEILING_RECORD, bare: bool = False) -> list[dict]:
    """Every point of ``shapes`` x ``ranks`` x ``slots`` x ``tokens``: each variant (and with ``auto`` the
    plan ``auto`` routes, ``auto``; with ``bare`` the ``bare_forwards``) and sglang's no-LoRA base, checked and
    timed in turns (read flush); each row's ``stream_ceiling_us`` from ``ceiling_record`` (``stream_ceilings``)."""
    from inkling_lab.upstream_wheel import UpstreamSink, unpack

    ceiling = stream_ceilings(ceiling_record)
    unpack(wheel, Path.home() / ".cache" / "inkling_lab" / "sglang-0.5.23")
    flush = pr.L2Flush("cuda")
    rows = []
    for shape in shapes:
        base = None
        for R in ranks:
            for S in slots:
                for T in tokens:
                    c = pr.Case.of(shape, R, S, T)
                    sc = c.scenario("cuda", sink=base)
                    sink, x, gammas, batch = sc.sink, sc.x, sc.gammas, sc.batch
                    base = sink
                    ops = sink.operands()
                    ref = reference_forward(ops, x, gammas, batch)
                    fns, errs = {}, {}
                    plans = {v: tb.plan(ops, T, batch, x.device, tiles(v, T, ops, S)) for v in VARIANTS}
                    if auto:
                        plans["auto"] = tb.plan(ops, T, batch, x.device)
                    for v, p in plans.items():
                        out = torch.empty_like(x)
                        fns[v] = (lambda p=p, out=out: tb.launch(ops, x, gammas, p, out))
                    if bare:
                        fns.update(bare_forwards(ops, x, gammas))
                    upstream = UpstreamSink(sink, batch, min_slots=2)
                    fns["sglang_base"] = lambda: upstream.forward(x, gammas, lora=False)
                    graphs = {}
                    for k, fn in fns.items():
                        try:
                            fn()
                            o = fn()
                            torch.cuda.synchronize()
                            errs[k] = records.relative_error(
                                o, reference_forward(ops, x, gammas, None) if k.endswith("_base") else ref, "fro")
                            if errs[k] < 1e-2:
                                graphs[k] = pr.capture(fn)
                        except Exception as exc:  # recorded, and the run goes on
                            errs[k] = float("nan")
                            print(f"{shape} R{R} S{S} T{T} {k} FAILED: {type(exc).__name__}: {str(exc)[:300]}",
                                  flush=True)
                    times = {k: statistics.median(v) for k, v in pr.time_interleaved(graphs, flush, reps).items()}
                    del graphs
                    row = {"shape": shape, "R": R, "S": S, "T": T, "us": times, "rel_err": errs,
                           "stream_ceiling_us": ceiling[CEILING[shape]],
                           "roofline_us": pr.roofline(c, **ceilings).us}
                    rows.append(row)
                    best = min((v for v in VARIANTS if v in times), key=times.get)
                    print(f"{shape:<11} R{R:<2} S{S} T{T:<2} " + " ".join(f"{k} {v:6.1f}" for k, v in times.items())
                          + f"  best {best} {times['sglang_base'] / times[best]:.2f}x base", flush=True)
    return rows


def host_phases(seconds: float, window: float = 0.5) -> list[dict]:
    """Per window: median host µs of a user-level call (A, R 16, S 4, T 8, resident and host
    batch) and of a fixed pure-Python loop; each batch three ways, one after the other in
    the window: the plain call (``{batch}_us``: a new output, the inputs copied in), with a
    caller's ``out=`` (``{batch}_out_us``: one output copy, no new tensor), and on the graph's
    own static tensors (``{batch}_static_us``: ``sink.static_io``, nothing copied); and the graphs around the caller's
    own tensors each batch's plan holds after the window (``{batch}_own_graphs``: one more than the window before, a
    capture in that window)."""
    sc = pr.Case.of("A", 16, 4, 8).scenario("cuda")
    sink, x, gammas, batch = sc.sink, sc.x, sc.gammas, sc.batch
    ops = sink.operands()
    resident, out = batch.to("cuda"), torch.empty_like(x)
    for b in (resident, batch):
        for _ in range(3):
            sink(x, gammas, batch=b, backend="triton")
    ios = {id(b): sink.static_io(b, backend="triton") for b in (resident, batch)}  # the captured graphs' own
    torch.cuda.synchronize()
    t_start, rows = time.perf_counter(), []
    while time.perf_counter() - t_start < seconds:
        row = {"t_s": round(time.perf_counter() - t_start, 3)}
        for label, b in (("resident", resident), ("host_batch", batch)):
            io = ios[id(b)]
            for kind, fn in (("", lambda: sink(x, gammas, batch=b, backend="triton")),
                             ("_out", lambda: sink(x, gammas, batch=b, backend="triton", out=out)),
                             ("_static", lambda: sink(io.x, io.gammas, batch=b, backend="triton", out=io.out))):
                row[f"{label}{kind}_us"] = pr.host_us(fn, 100)
                torch.cuda.synchronize()
            row[f"{label}_own_graphs"] = tb.own_graphs(ops, x, tb.cached_plan(ops, x.shape[0], b, x.device))
        row["python_loop_us"] = pr.host_us(lambda: sum(range(200)), 100)
        rows.append(row)
        rest = window - (time.perf_counter() - t_start - row["t_s"])
        if rest > 0:
            time.sleep(rest)
    return rows


def main() -> int:
    ap = run_arguments(__doc__, pr.SHAPES, ceiling=True)
    ap.add_argument("--tokens", default="1,8,32")
    ap.add_argument("--host-seconds", type=float, default=20.0)
    ap.add_argument("--gather", action="store_true", help="also v28's gathered LoRA epilogues (GATHER), checked and timed")
    ap.add_argument("--up-act", action="store_true", help="also v33's up_act_kernel with the LoRA epilogue (Tiles.lora_up)")
    ap.add_argument("--ranks", default="16,64")
    ap.add_argument("--slots", default="1,4,8")
    ap.add_argument("--bare", action="store_true", help="also the forward without its LoRA three ways (bare_forwards)")
    ap.add_argument("--check-tokens", default=",".join(map(str, CHECK_TOKENS)),
                    help="the correctness pass's token counts (it checks the --shapes timed)")
    ap.add_argument("--pdl-up", action="store_true", help="also v50b's PDL on the shrink-to-up edge alone (Tiles.pdl_up)")
    ap.add_argument("--down-shrink", action="store_true",
                    help="also v52's down shrink in the down kernel (Tiles.down_shrink)")
    args = ap.parse_args()
    for asked, extra in ((args.gather, GATHER), (args.up_act, UP_ACT), (args.pdl_up, PDL_UP),
                         (args.down_shrink, DOWN_SHRINK)):
        if asked:
            VARIANTS.update(extra)
            CHECKED.extend(extra)
    t0 = time.time()
    env = run_environment()
    hp = host_phases(args.host_seconds)  # first: the process's first seconds are one of the phases
    rec = record_head(env, variants=dict(VARIANTS), host_phases=hp)
    ceilings = rec["ceilings"]
    records.write_json(args.out, rec)
    record_checks(rec, correctness(args.shapes.split(","), [int(t) for t in args.check_tokens.split(",")]), args.out, t0)
    if not all(r["ok"] for r in rec["correctness"]):
        print("correctness FAILED for", [(r["shape"], r["T"], r["variant"]) for r in rec["correctness"] if not r["ok"]])
    rec["points"] = timing(args.wheel, args.reps, ceilings, args.shapes.split(","),
                           [int(r) for r in args.ranks.split(",")], [int(s) for s in args.slots.split(",")],
                           [int(t) for t in args.tokens.split(",")], auto=args.up_act or args.pdl_up or args.down_shrink, ceiling_record=args.ceiling, bare=args.bare)
    rec["seconds"] = round(time.time() - t0, 1)
    records.write_json(args.out, rec)
    wins = {v: sum(1 for r in rec["points"] if v in r["us"] and r["us"][v] < r["us"]["sglang_base"])
            for v in VARIANTS}
    print("points faster than sglang's no-LoRA base:", wins, "of", len(rec["points"]))
    for shape in args.shapes.split(","):
        pts = [r for r in rec["points"] if r["shape"] == shape]
        for v in VARIANTS:
            fr = [r["stream_ceiling_us"] / r["us"][v] for r in pts if v in r["us"]]
            print(f"{shape:<11} {v:<13} stream-ceiling fraction {min(fr):.2f}-{max(fr):.2f}")
    hp = [r["resident_us"] for r in rec["host_phases"]]
    if hp:  # none with --host-seconds 0
        print("host µs (resident) min/median/max", min(hp), statistics.median(hp), max(hp))
    print(f"{rec['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
