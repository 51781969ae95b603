"""vLLM 0.33's punica kernels (``inkling_lab/upstream_vllm.py``) in the side by side: every
point of the side-by-side grid, each contender checked against the float64 reference
(``forward.reference``; sglang's base against the reference without LoRA), then CUDA graphs
of the kit, sglang 0.5.23's paths (from its wheel) and ``vllm_punica`` replayed in turns
(``time_interleaved``, read flush), medians. The vLLM files travel extracted and
RECORD-checked (``upstream_vllm.extract`` on a machine with the wheel), not the wheel.

    INKLING_LAB_COMMIT=<commit> PYTHONPATH=. python3 scripts/gpu/h200_vllm.py --wheel SGLANG_WHEEL \\
        --vllm-files DIR --out $OUT/h200_side_by_side_vllm.json
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from inkling_lab import profile as pr, records, upstream_vllm
from inkling_lab.forward.reference import reference_forward


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheel", required=True)
    ap.add_argument("--vllm-files", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--tokens", default=",".join(str(t) for t in pr.SIDE_TOKENS))
    args = ap.parse_args()
    from inkling_lab.upstream_wheel import unpack

    t0 = time.time()
    env = records.environment("python3 " + " ".join(sys.argv))
    ceilings = pr.measure_ceilings()
    rec = {"environment": env, "ceilings": ceilings, "modes": ["read"], "reps": args.reps,
           "upstream": unpack(args.wheel, Path.home() / ".cache" / "inkling_lab" / "sglang-0.5.23"),
           "vllm": upstream_vllm.load(args.vllm_files), "points": []}
    flush = pr.L2Flush("cuda")
    cases = pr.side_by_side_cases(tokens=[int(t) for t in args.tokens.split(",")])
    base = None
    for i, c in enumerate(cases):
        if base is not None and i and cases[i - 1].shape != c.shape:
            base = None  # a new shape draws its own base weights
        sc = c.scenario("cuda", sink=base)
        sink, x, gammas, batch = sc.sink, sc.x, sc.gammas, sc.batch
        base = sink
        fns = pr.side_by_side_variants(sink, x, gammas, batch, c.geometry.slots)
        vllm = upstream_vllm.VllmSink(sink, batch)
        fns["vllm_punica"] = lambda: vllm.forward(x, gammas)
        ops = sink.operands()
        ref, ref_base = reference_forward(ops, x, gammas, batch), reference_forward(ops, x, gammas, None)
        errors, failures, graphs = {}, {}, {}
        for k, fn in fns.items():
            try:
                fn()
                out = fn()
                torch.cuda.synchronize()
                errors[k] = records.relative_error(out, ref_base if k == "sglang_base" else ref, "fro")
                if errors[k] < 1e-2:
                    graphs[k] = pr.capture(fn)
            except Exception as exc:  # recorded, and the run goes on
                errors[k], failures[k] = float("nan"), f"{type(exc).__name__}: {exc}"[:500]
        times = {k: pr.stats(v) for k, v in pr.time_interleaved(graphs, flush, args.reps).items()}
        del graphs
        roof = pr.roofline(c, **ceilings)
        rec["points"].append({"case": c.record(), "roofline_us": roof.us, "bound": roof.bound, "bytes": roof.bytes,
                              "flops": roof.flops, "rel_err": errors, "failures": failures, "times": {"read": times}})
        med = {k: v["median_us"] for k, v in times.items()}
        print(f"[{i + 1}/{len(cases)}] {c.shape} R{c.geometry.max_rank} S{c.geometry.slots} T{c.T} "
              + " ".join(f"{k} {v:.1f}" for k, v in med.items()) + (f" FAILED {failures}" if failures else ""),
              flush=True)
        if i % 12 == 11:
            records.write_json(args.out, rec)
    rec["seconds"] = round(time.time() - t0, 1)
    records.write_json(args.out, rec)
    pts = rec["points"]
    beats = sum(1 for p in pts if "vllm_punica" in p["times"]["read"] and "kit_triton" in p["times"]["read"]
                and p["times"]["read"]["kit_triton"]["median_us"] < p["times"]["read"]["vllm_punica"]["median_us"])
    print(f"kit faster than vllm_punica at {beats}/{len(pts)} points; vllm correct at "
          f"{sum(1 for p in pts if p['rel_err'].get('vllm_punica', 1) < 1e-2)}; {rec['seconds']} s")
    ratios = [p["times"]["read"]["kit_triton"]["median_us"] / p["times"]["read"]["vllm_punica"]["median_us"]
              for p in pts if "vllm_punica" in p["times"]["read"] and "kit_triton" in p["times"]["read"]]
    if ratios:
        print(f"kit / vllm_punica: median {statistics.median(ratios):.2f}, worst {max(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
