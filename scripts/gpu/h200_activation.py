"""v43 on a CUDA GPU (issue 26 target 3): the activation alone, the one launch between the two base GEMMs, against
sglang 0.5.23's own (``silu_and_mul_triton`` of ``sglang/kernels/ops/moe/inkling_moe.py``, which
``InklingBatchDenseMLP._swiglu`` of ``sglang/srt/models/inkling_common/dense_mlp.py`` calls for interleaved ``w13``), at 512-8192 tokens on every shape, R 16 / 64, one slot
and four, both flushes, the sink's gate/up rows interleaved (the layout sglang's kernel reads):

* ``expand``: ``expand_act_kernel`` with the LoRA's gate/up expand in it, as the forward runs it (on ``expand_tiles``:
  one slot, or several slots over the batch's runs, ``plan``'s ``act_runs``), and on ``TILES``;
* ``bare``: the kit's activation without the LoRA (``up_kernel``'s epilogue over ``y``, ``plan``'s tiles: what the
  merged and folded paths run);
* ``swiglu``: sglang's (with ``--wheel``).

Each is checked against the float64 activation computed here from ``y``, ``sh`` and the pool's gate-up ``B``
before it is timed. Run it on two trees in one call to compare kernels (``PYTHONPATH=OLD_TREE:.`` first, the
record's ``commit`` says which; then ``--against`` the first record: each contender over its own there).

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=. python3 scripts/gpu/h200_activation.py --wheel WHEEL --out $OUT/NAME.json
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

import h200_pdl  # this folder's: run_arguments, record_head, both_flushes, timed_medians, finish_record
from inkling_lab import profile as pr, records
from inkling_lab.forward import triton_backend as tb
from inkling_lab.sink import gate_up_rows

TOKENS = (512, 2048, 8192)
RANKS = (16, 64)
SLOTS = (1, 4)
TILES = {"x32f128w4": (32, 128, 4, 2), "x64f64w4": (64, 64, 4, 2)}
"""``expand``'s other tiles: tokens and features a tile, warps, row tiles in flight (``ONE_SLOT_TILES``: 32, 64, 4, 2;
``EXPAND_TILES``: 32, 64, 4, 3, v54)."""


def reference(ops, y: torch.Tensor, sh: torch.Tensor, gammas: torch.Tensor, slots: torch.Tensor,
              scalings: torch.Tensor) -> torch.Tensor:
    """``act [T, n*F]`` float64: ``silu(gate) * up * gamma`` with each token's ``scale_s * sh[:, o] @ B_s[e].T`` added
    to its gate and up (slot ``-1``: nothing), ``y [T, n*2F]`` in the sink's row order (interleaved or not), ``sh [T,
    O*2R]``, the pool's gate-up ``B [S, n, 2F, R]`` (gate rows then up rows)."""
    T, (n, F) = y.shape[0], (ops.n, ops.intermediate)
    gb = ops.buffers[1].double()
    O, R = ops.buffers[0].shape[1], ops.buffers[0].shape[2] // 2
    yy = y.double().view(T, n, 2 * F)
    gate_rows, up_rows = gate_up_rows(F, ops.interleaved, y.device)
    gate, up = yy[..., gate_rows], yy[..., up_rows]               # copies: the expand adds onto them
    for s in slots.unique().tolist():
        if s < 0:
            continue
        rows = slots == s
        for e in range(n):
            o = (e if O > 1 else 0) * 2 * R
            sg, su = sh[rows, o:o + R].double(), sh[rows, o + R:o + 2 * R].double()
            gate[rows, e] += float(scalings[s]) * sg @ gb[s, e, :F].T
            up[rows, e] += float(scalings[s]) * su @ gb[s, e, F:].T
    return (torch.nn.functional.silu(gate) * up * gammas.double()[:, :, None]).reshape(T, n * F)


def contenders(ops, x: torch.Tensor, y: torch.Tensor, sh: torch.Tensor, gammas: torch.Tensor, p: tb.Plan,
               act: torch.Tensor, swiglu=None) -> dict:
    """Each activation at a point as a callable returning its ``act``; ``p`` the point's plan (``plan``'s own tiles, the
    tokens in slot order)."""
    gb = ops.buffers[1].contiguous()
    runs = p.act_runs or tb.expand_runs(p.slots.cpu(), x.device, 1)
    one = runs.slots.numel() == 1  # the one-slot chain's launch: its slot and scale as arguments
    slot = int(runs.slots[0])
    scale = float(p.scalings[slot])  # read before capture: a device-to-host copy cannot sit inside a CUDA graph

    def expand(t: "tb.Tiles | None"):
        def run():
            if one:
                tb._expand_act(ops, y, gammas, act, sh, gb, t, slot, scale)
            else:
                tb._expand_act(ops, y, gammas, act, sh, gb, t, runs=runs, scalings=p.scalings)
            return act
        return run

    def bare():
        tb._up(ops, x, y, gammas, act, p, tb.Lora.none(x))
        return act

    fns = {"expand": expand(None), "bare": bare}  # None: the tiles the forward routes (expand_tiles)
    for name, (bm, bf, warps, stages) in TILES.items():
        fns[f"expand_{name}"] = expand(dataclasses.replace(tb.ONE_SLOT_TILES, bm=bm, bf=bf, warps=warps, stages=stages))
    if swiglu is not None:
        fns["swiglu"] = lambda: swiglu(y.view(y.shape[0], ops.n, -1), gammas).view(y.shape[0], -1)
    return fns


def point(shape: str, R: int, S: int, T: int, flushes: dict, reps: int, device: str = "cuda", timer=None,
          upstream_cls=None) -> dict:
    """One point's row: each contender's relative error against ``reference`` (``bare`` and ``swiglu`` against it
    with no LoRA) and (``timer``) its medians."""
    sc = pr.Case.of(shape, R, S, T).scenario(device)
    ops = sc.sink.operands()
    x, gammas = sc.x, sc.gammas
    p = tb.plan(ops, T, sc.batch, x.device)
    y = torch.randn(T, ops.n * 2 * ops.intermediate, dtype=x.dtype, device=x.device)
    sh = torch.randn(T, ops.buffers[0].shape[1] * ops.buffers[0].shape[2], dtype=x.dtype, device=x.device) * 0.5
    act = torch.empty(T, ops.n * ops.intermediate, dtype=x.dtype, device=x.device)
    swiglu = upstream_cls(sc.sink, sc.batch, min_slots=2).layer._swiglu if upstream_cls else None
    fns = contenders(ops, x, y, sh, gammas, p, act, swiglu)
    slots = p.slots.long()
    want = {True: reference(ops, y, sh, gammas, slots, p.scalings),
            False: reference(ops, y, sh, gammas, torch.full_like(slots, -1), p.scalings)}
    errs = {k: records.relative_error(fn().clone(), want[k.startswith("expand")], "fro") for k, fn in fns.items()}
    ok = {k: fn for k, fn in fns.items() if errs[k] < 1e-2}
    return {"shape": shape, "R": R, "S": S, "T": T, "rel_err": errs, "us": timer(ok, flushes, reps) if timer else {}}


def against(before: list[dict], after: list[dict], flush: str) -> list[str]:
    """A line per point of ``after`` that ``before`` (another tree's record, ``--against``) timed too: each contender's
    median over its own there, and over sglang's in ``after``."""
    old = {(r["shape"], r["R"], r["S"], r["T"]): r["us"] for r in before}
    lines = []
    for r in after:
        was = old.get((r["shape"], r["R"], r["S"], r["T"]))
        if was is None:
            continue
        now = {k.split("@")[0]: v for k, v in r["us"].items() if k.endswith("@" + flush)}
        sw = now.get("swiglu", float("nan"))
        both = [(k, was[f"{k}@{flush}"], v) for k, v in now.items() if k != "swiglu" and f"{k}@{flush}" in was]
        if both:
            lines.append(f"{r['shape']:<11} R{r['R']} S{r['S']} T{r['T']:<4} {flush:<5} " + "  ".join(
                f"{k} {u:7.1f} -> {v:7.1f} ({v / u:.3f}x, {v / sw:.2f}x sglang's)" for k, u, v in both))
    return lines


def main() -> int:
    ap = h200_pdl.run_arguments(__doc__, pr.SIDE_SHAPES)
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--against", default="", help="another tree's record of this script: each contender over its own "
                    "there, printed at the end")
    ap.add_argument("--tiles", default="", help="more of expand's tiles, NAME:BM,BF,WARPS,STAGES;... (beside TILES)")
    ap.add_argument("--ranks", default=",".join(map(str, RANKS)))
    args = ap.parse_args()
    for item in filter(None, args.tiles.split(";")):
        name, spec = item.split(":")
        TILES[name] = tuple(int(v) for v in spec.split(","))
    from inkling_lab.upstream_wheel import UpstreamSink

    t0 = time.time()
    rec = h200_pdl.record_head(h200_pdl.run_environment(), args.wheel, tiles=TILES, points=[])
    flushes = h200_pdl.both_flushes()
    for shape in args.shapes.split(","):
        for R in (int(r) for r in args.ranks.split(",")):
            for S in SLOTS:
                for T in (int(t) for t in args.tokens.split(",")):
                    row = point(shape, R, S, T, flushes, args.reps, timer=h200_pdl.timed_medians,
                                upstream_cls=UpstreamSink)
                    rec["points"].append(row)
                    us = {k.split("@")[0]: v for k, v in row["us"].items() if k.endswith("@read")}
                    sw = us.get("swiglu", float("nan"))
                    print(f"{shape:<11} R{R} S{S} T{T:<4} read swiglu {sw:7.1f}  " + "  ".join(
                        f"{k} {v:7.1f} ({v / sw:.2f}x)" for k, v in us.items() if k != "swiglu")
                        + f"  worst err {max(row['rel_err'].values()):.1e}", flush=True)
                    records.write_json(args.out, rec)
    if args.against:
        before = json.loads(Path(args.against).read_text())["points"]
        for fl in flushes:
            print("\n".join(against(before, rec["points"], fl)), flush=True)
    return h200_pdl.finish_record(rec, args.out, t0)


if __name__ == "__main__":
    sys.exit(main())
