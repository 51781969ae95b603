"""v14 and v29-v32 on a CUDA GPU: the one-token GEMV kernels (``Tiles.gemv``: ``gemv_up_kernel``,
``gemv_down_kernel``) against the backend's three launches (``triton_v13``: what ``pick_tiles``
gave one token before v14), sglang 0.5.23's no-LoRA base taken from its wheel, and the stream ceiling
(``h200_stream_ceiling.json``).

1. Correctness first, against the float64 reference on fresh random inputs: bf16 and fp16,
   both gate/up layouts, both outer layouts, a LoRA / base-only / rank-0 token, no adapter,
   a device-resident batch, graph replays (``h200_pdl.check``; the output poisoned with NaN
   before each run).
2. The sweep: R 64 S 4 at T = 1 per shape, every candidate with LoRA, and two also as the
   bare weight stream (no adapter: the two GEMVs alone); timed as graphs taking turns with
   ``triton_v13`` and ``sglang_base`` (read flush), medians.
3. The grid: every T = 1 point of the side-by-side grid, ``triton_v13``, ``gemv`` (the sweep's
   winner for that shape) and ``sglang_base``.

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=. python3 scripts/gpu/h200_gemv.py --wheel WHEEL --out $OUT/h200_gemv.json

v29 added ``--ceiling``: the stream-ceiling record of the same card (``h200_stream_ceiling.py``'s, made in the
same call on another card than the H200's), and candidates whose up GEMV split ``H`` over several programs per
feature block (commit bb56b21; removed: ``h100_gemv_v29.json``); v30 (commit 7d3662b) candidates that waited
for the shrink halfway through the up stream (removed: ``h100_gemv_v30.json``); v31 and v31b (commits 3f9bb60,
6b77490) candidates whose up kernel ran the gate/up shrink itself, and the grid timed each shape's best of
both kinds (removed: ``h100_gemv_v31.json``, ``_v31b.json``); v32 (commit 713d6e7) candidates whose up kernel
summed each step over ``K`` at once, in fewer registers (removed: ``h200_gemv_v32.json``).

``--host-only --host-seconds S`` (``--wheel none``): the host cost per call alone (target 4):
``h200_pdl.host_phases`` (the plain call, ``out=``, the static tensors, beside a fixed Python
loop), then ``static_check`` (the static tensors at T 1, 8, 32 against the reference, and
their host µs); exit status 1 if a check failed.
"""
from __future__ import annotations

import sys
import time
from dataclasses import replace

import torch

import h200_pdl  # this folder's (the script's own, first on sys.path): the checks, time_read_point
from inkling_lab import profile as pr, records
from inkling_lab.batch import SlotBatch
from inkling_lab.forward import triton_backend as tb
from inkling_lab.forward.reference import reference_forward

CANDIDATES = {
    "f4k1024": dict(bf=4, bk=1024, bn=4, dk=1024),
    "f8k512": dict(bf=8, bk=512, bn=8, dk=512),
    "f8k512w8": dict(bf=8, bk=512, bn=8, dk=512, warps=8),
    "f4k1024n16": dict(bf=4, bk=1024, bn=16, dk=256),
    "f8k512n16": dict(bf=8, bk=512, bn=16, dk=256),
    "f8k512n32": dict(bf=8, bk=512, bn=32, dk=128),
    "f8k512s4": dict(bf=8, bk=512, bn=8, dk=512, stages=4),
    "f4k1024s4": dict(bf=4, bk=1024, bn=4, dk=1024, stages=4),
    "f4k1024n16s4": dict(bf=4, bk=1024, bn=16, dk=256, stages=4),
    "f8k256s6": dict(bf=8, bk=256, bn=8, dk=256, stages=6),
}
"""``gemv_tiles`` candidates: features per up program and K step (``w8``: 8 warps; ``n16``, ``n32``: v35's down
programs of 16 or 32 rows of ``w2`` in 256- or 128-wide steps, where the others take as many rows as features; ``s4``,
``s6``: v47's streams as Triton's pipelined loops, 4 or 6 steps deep in shared memory, routed from Inkling's ``H`` as
``f4k1024n16s4``). v47's runs (``h100_gemv_v47.json``, ``_v47b.json``, commit 641c162) also had v46's ``x`` and ``act``
loaded in the weight tile's layout (1.04-1.35x the routed tiles) and the up stream pipelined alone (1.01-1.05x). v14's run
(``h200_gemv.json``) also had ``f2k2048`` and ``f4k1024w8``, behind at every shape; v29's to v31's
(``h100_gemv_v29.json``, ``_v30.json``, ``_v31.json``, ``_v31b.json``, ``h200_gemv_v32.json``) a split of
``H``, the LoRA's loads under the stream, the shrink inside the up kernel and a sum per step, each level or
behind; v34's (``h100_gemv_v34.json``) persistent programs, two a multiprocessor, 2-22 % behind; the two runs before v14's (``history/h200_gemv_v14a.json``, ``_v14b.json``) also swept 2-32 tokens
(one row-sum per token and step, an unreduced ``[T, 2*bf, bk]`` tile, ``tl.dot`` over a 16-token tile): all
slower than the three launches there."""
STREAMED = ("f4k1024", "f8k512", "f8k512s4", "f4k1024n16s4")
"""Candidates also timed without an adapter: the two GEMVs alone, against the stream ceiling."""
TOKENS = (1,)
CHECKED = ("f4k1024", "f8k512", "f4k1024n16s4")
"""The candidates the correctness pass checks (the two step shapes, v47's pipelined streams)."""


def gemv(name: str) -> tb.Tiles:
    return tb.gemv_tiles(**CANDIDATES[name])


def fits(name: str, T: int) -> bool:
    return T == 1


def three_launches(ops, batch) -> tb.Tiles:
    """What ``pick_tiles`` and ``plan`` gave one token before v14: the 16-token tiles, PDL
    where ``use_pdl`` turns it on (one token: one slot at most)."""
    elems = ops.n * ops.intermediate * ops.hidden
    return replace(tb.pick_tiles(2, elems), pdl=tb.use_pdl(1, elems, int(batch is not None and bool(batch.active_slots()))))


def correctness() -> list[dict]:
    def errors(v, ops, x, gammas, batch, ref, ref_base, c):
        errs = h200_pdl.check(ops, x, gammas, batch, gemv(v), ref, ref_base, c)
        rank0 = SlotBatch.from_token_slots([2], c.geometry.slots, lora_ranks=[c.geometry.max_rank] * 2 + [0])
        errs["rank0"] = records.relative_error(h200_pdl.run(ops, x, gammas, rank0, gemv(v)), ref_base, "fro")
        return errs
    return h200_pdl.checked_layouts((1,), CHECKED, errors)


def contenders(names, upstream_cls):
    def fns_for(sink, ops, x, gammas, batch):
        T = x.shape[0]
        fns = h200_pdl.launches(ops, x, gammas, [("triton_v13", batch, three_launches(ops, batch))]
                                + [(v, batch, gemv(v)) for v in names if fits(v, T)]
                                + [(v + "_stream_base", None, gemv(v)) for v in STREAMED if fits(v, T)])
        h200_pdl.with_sglang_base(fns, upstream_cls, sink, batch, x, gammas)
        return fns
    return fns_for


def static_check(tokens=(1, 8, 32), calls: int = 200) -> list[dict]:
    """The forward on the graph's own static tensors (``sink.static_io``), A R16 S4, per
    token count and batch (device-resident, host): four calls with new inputs written into
    ``io.x`` / ``io.gammas`` (the first launches, the second captures and replays, the
    third replays, the fourth after the resident batch's slots were rewritten in place),
    each against the float64 reference, checking that ``io.out`` is what comes back and
    that the plan's graph was captured around ``io``; a caller's ``out=`` and the plain
    call on the same inputs; then the median host µs per call of the three ways."""
    rows = []
    for T in tokens:
        c = pr.Case.of("A", 16, 4, T)
        sc = c.scenario("cuda", seed=T)
        sink, x, gammas, host = sc.sink, sc.x, sc.gammas, sc.batch
        gen = torch.Generator().manual_seed(T)
        for label, batch in (("resident", host.to("cuda")), ("host_batch", host)):
            ops, now = sink.operands(), host
            io = sink.static_io(batch, backend="triton")
            row, errs, same = {**c.record(), "batch": label}, [], []
            for step in range(4):
                if step == 3 and label == "resident":  # new slots, written in place: the graph follows them
                    ids = torch.randint(-1, 4, host.weight_indices.shape, generator=gen)
                    batch.weight_indices.copy_(ids)
                    now = replace(host, weight_indices=ids)
                xs, gs = torch.randn_like(x), torch.rand_like(gammas)
                io.x.copy_(xs)
                io.gammas.copy_(gs)
                got = sink(io.x, io.gammas, batch=batch, backend="triton", out=io.out)
                torch.cuda.synchronize()
                same.append(got is io.out)
                errs.append(records.relative_error(got, reference_forward(ops, xs, gs, now), "fro"))
            ref = reference_forward(ops, x, gammas, now)
            mine = torch.full_like(x, float("nan"))
            row["static_rel_err"] = errs
            row["static_out_returned"] = all(same)
            row["captured_around_io"] = tb.cached_plan(ops, T, batch, x.device).fast.get("io") is io
            row["out_rel_err"] = records.relative_error(sink(x, gammas, batch=batch, backend="triton", out=mine),
                                                        ref, "fro")
            row["plain_rel_err"] = records.relative_error(sink(x, gammas, batch=batch, backend="triton"), ref, "fro")
            row["own_rel_err"] = own_check(sink, batch, now, x, gammas, mine)
            row["own_graphs"] = tb.own_graphs(ops, x, tb.cached_plan(ops, T, batch, x.device))
            row["host_us"] = {}
            for kind, fn in (("plain", lambda: sink(x, gammas, batch=batch, backend="triton")),
                             ("out", lambda: sink(x, gammas, batch=batch, backend="triton", out=mine)),
                             ("static", lambda: sink(io.x, io.gammas, batch=batch, backend="triton", out=io.out))):
                torch.cuda.synchronize()
                row["host_us"][kind] = pr.host_us(fn, calls)
            torch.cuda.synchronize()
            row["ok"] = (row["static_out_returned"] and row["captured_around_io"] and row["own_graphs"] > 0
                         and max(errs + row["own_rel_err"] + [row["out_rel_err"], row["plain_rel_err"]]) < 1e-2)
            rows.append(row)
            print(f"static T={T} {label}: ok {row['ok']} errs {max(errs):.1e} host µs "
                  + " ".join(f"{k} {v:.1f}" for k, v in row["host_us"].items()), flush=True)
    return rows


def own_check(sink, batch, slots_batch, x, gammas, out, calls: int = 4) -> list[float]:
    """v57's graphs around the caller's own tensors (``_own_graph``): ``calls`` rounds of new inputs written into
    ``x`` and ``gammas`` in place, each round a call with ``out=`` and a plain call (its result dropped before the
    next round, so the caching allocator hands its block back), each against the float64 reference."""
    errs, gen = [], torch.Generator().manual_seed(7)
    ops = sink.operands()
    for _ in range(calls):
        x.copy_(torch.randn(x.shape, generator=gen))
        gammas.copy_(torch.rand(gammas.shape, generator=gen))
        ref = reference_forward(ops, x, gammas, slots_batch)
        errs.append(records.relative_error(sink(x, gammas, batch=batch, backend="triton", out=out), ref, "fro"))
        plain = sink(x, gammas, batch=batch, backend="triton")
        errs.append(records.relative_error(plain, ref, "fro"))
        del plain
    return errs


def print_host(host: list[dict]) -> None:
    """The host windows by the CPU's phase (``profile.host_phase_table``), then each window's fixed loop."""
    if host:
        print(pr.host_phase_table(host))
        print("host python_loop_us:", " ".join(f"{w['python_loop_us']:.1f}" for w in host))


def main() -> int:
    ap = h200_pdl.run_arguments(__doc__, pr.SHAPES, ceiling=True)
    ap.add_argument("--host-seconds", type=float, default=0.0, help="time the host cost per call first (h200_pdl)")
    ap.add_argument("--host-only", action="store_true",
                    help="only the host cost (with --host-seconds), then the static-tensor check (static_check)")
    args = ap.parse_args()
    from inkling_lab.upstream_wheel import UpstreamSink

    t0 = time.time()
    env = h200_pdl.run_environment()
    host = h200_pdl.host_phases(args.host_seconds) if args.host_seconds else []  # first: the process's first seconds
    if args.host_only:
        rec = {"environment": env, "host_phases": host, "seconds": round(time.time() - t0, 1)}
        records.write_json(args.out, rec)  # first: the phases survive a later failure
        print_host(host)
        rec["static_check"] = static_check()
        rec["seconds"] = round(time.time() - t0, 1)
        records.write_json(args.out, rec)
        return 0 if all(r["ok"] for r in rec["static_check"]) else 1
    ceiling = h200_pdl.stream_ceilings(args.ceiling)  # h200_gemv_v32.json carries an H100's: the check came after it
    rec = h200_pdl.record_head(env, args.wheel, candidates=CANDIDATES, host_phases=host)
    ceilings = rec["ceilings"]
    h200_pdl.record_checks(rec, correctness(), args.out, t0)
    flush = pr.L2Flush("cuda")
    shapes = args.shapes.split(",")
    rec["sweep"], best = [], {}
    for shape in shapes:
        base = None
        for T in TOKENS:
            base, row = h200_pdl.time_read_point(pr.Case.of(shape, 64, 4, T), contenders(CANDIDATES, UpstreamSink),
                                                 flush, args.reps, base)
            row["stream_ceiling_us"] = ceiling[h200_pdl.CEILING[shape]]
            rec["sweep"].append(row)
            us = row["us"]
            best[shape, T] = min((v for v in CANDIDATES if v in us), key=us.get)
            print(f"sweep {shape:<11} T{T:<2} " + " ".join(f"{k} {v:.1f}" for k, v in us.items())
                  + f"  best {best[shape, T]}", flush=True)
        records.write_json(args.out, rec)
    rec["best"] = {f"{s} {T}": v for (s, T), v in best.items()}
    rec["points"] = []
    for shape in shapes:
        base = None
        for R in (16, 64):
            for S in (1, 4, 8):
                for T in TOKENS:
                    c = pr.Case.of(shape, R, S, T)
                    v = best[shape, T]

                    def fns_for(sink, ops, x, gammas, batch, v=v):
                        p, p_out = tb.plan(ops, x.shape[0], batch, x.device, three_launches(ops, batch)), torch.empty_like(x)
                        q, q_out = tb.plan(ops, x.shape[0], batch, x.device, gemv(v)), torch.empty_like(x)
                        a, a_out = tb.plan(ops, x.shape[0], batch, x.device), torch.empty_like(x)
                        up = UpstreamSink(sink, batch, min_slots=2)
                        return {"triton_v13": lambda: tb.launch(ops, x, gammas, p, p_out),
                                "gemv": lambda: tb.launch(ops, x, gammas, q, q_out),
                                "auto": lambda: tb.launch(ops, x, gammas, a, a_out),
                                "sglang_base": lambda: up.forward(x, gammas, lora=False)}

                    base, row = h200_pdl.time_read_point(c, fns_for, flush, args.reps, base)
                    row.update(gemv_config=v, stream_ceiling_us=ceiling[h200_pdl.CEILING[shape]],
                               roofline_us=pr.roofline(c, **ceilings).us)
                    rec["points"].append(row)
                    us = row["us"]
                    print(f"{shape:<11} R{R:<2} S{S} T{T:<2} " + " ".join(f"{k} {u:6.1f}" for k, u in us.items())
                          + f"  gemv/base {us.get('gemv', float('nan')) / us['sglang_base']:.2f}", flush=True)
        records.write_json(args.out, rec)
    rec["seconds"] = round(time.time() - t0, 1)
    records.write_json(args.out, rec)
    pts = rec["points"]
    for v in ("triton_v13", "gemv"):
        print(v, "faster than sglang's base at", sum(1 for r in pts if v in r["us"] and r["us"][v] < r["us"]["sglang_base"]),
              "of", len(pts), "; gemv faster than triton at", sum(1 for r in pts if r["us"].get("gemv", 1e9) < r["us"]["triton_v13"]))
    for shape in shapes:
        fr = [r["stream_ceiling_us"] / r["us"]["gemv"] for r in pts if r["shape"] == shape and "gemv" in r["us"]]
        print(f"{shape:<11} gemv stream-ceiling fraction {min(fr):.2f}-{max(fr):.2f}")
    print_host(host)
    print(f"{rec['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
