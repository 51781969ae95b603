"""Record how much memory and time `inkling-lab export` takes for a full-size Inkling adapter (issue 23).

A measurement, not a test. The generator of benchmarks/convert_memory.py writes, in a
temporary folder never committed, a PEFT adapter of the kit's ``inkling`` preset
(``geometry.PRESETS``: n 2, H 6144, F 3072, r 64) over 66 layers, with the attention
factors (q, k, v, o) beside the shared-sink ones, bfloat16, given rsLoRA so that the
export has a scaling to fold; then the real command (`python -m inkling_lab.cli export`,
its proof included: every module read back through the kit's model of sglang's path and
compared with PEFT's delta, computed by PEFT's own layers on probe inputs) runs in a
child process, and its peak resident memory (``VmHWM``) and wall time are recorded, next
to the sizes that explain them. A second, smaller run (``--slope-layers``) gives the
peak's slope per layer: flat when the export streams module by module.

    python scripts/data/record_export_memory.py            # writes data/benchmarks/export_memory.json
    python scripts/data/record_export_memory.py --layers 8 # smaller, where memory, disk or time is short
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from convert_memory import F, H, HEAD_DIM, HEADS, KV_HEADS, N, R, make_adapter, run_child  # noqa: E402

from inkling_lab.records import environment, write_json  # noqa: E402


def measure(tmp: Path, layers: int, dtype: torch.dtype) -> dict[str, int | float]:
    """One export of a generated adapter of ``layers`` layers: sizes, peak RSS, wall time."""
    folder = tmp / f"adapter_{layers}"
    sizes = make_adapter(folder, layers, dtype)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "use_rslora": True}))
    out = tmp / f"for_sglang_{layers}"
    wall, peak = run_child(["inkling_lab.cli", "export", str(folder), "-n", str(N), "-o", str(out), "-q", "--json"])
    written = (out / "adapter_model.safetensors").stat().st_size
    shutil.rmtree(folder)
    shutil.rmtree(out)
    return {"layers": layers, "adapter_file_bytes": sizes["file_bytes"],
            "shared_sink_factor_bytes": sizes["sink_factor_bytes"], "export_file_bytes": written,
            "peak_rss_bytes": peak, "wall_s": round(wall, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=66)
    parser.add_argument("--slope-layers", type=int, default=4, help="the smaller run the slope is taken against")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--out", type=Path, default=ROOT / "data" / "benchmarks" / "export_memory.json")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory(prefix="inkling-export-bench-") as tmp:
        _, floor = run_child(["-c", "import inkling_lab.cli, inkling_lab.export, peft, transformers"])
        small = measure(Path(tmp), args.slope_layers, dtype)
        full = measure(Path(tmp), args.layers, dtype)
    itemsize = dtype.itemsize
    one_module = (2 * R * H + 2 * N * F * R + R * N * F + H * R) * itemsize  # gate A, up A, gate B, up B, down A, down B
    attention = sum((R * i + o * R) * itemsize for o, i in ((HEADS * HEAD_DIM, H), (KV_HEADS * HEAD_DIM, H),
                                                            (KV_HEADS * HEAD_DIM, H), (H, HEADS * HEAD_DIM)))
    slope = (full["peak_rss_bytes"] - small["peak_rss_bytes"]) / (full["layers"] - small["layers"])
    command = (f"python scripts/data/record_export_memory.py --layers {args.layers} --slope-layers "
               f"{args.slope_layers} --dtype {args.dtype}")
    from importlib.metadata import version

    record = {
        "environment": {**environment(command), **{name: version(name) for name in ("peft", "transformers",
                                                                                     "safetensors")},
                        "memory_total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")},
        "measured_command": f"inkling-lab export ADAPTER -n {N} -o OUT -q --json",
        "what": "peak RSS and wall time of `inkling-lab export` (plan, write, then the proof against PEFT's own "
                "layers on probe inputs) on a generated rsLoRA adapter of the kit's inkling preset with attention "
                "factors, at two sizes",
        "geometry": {"preset": "inkling", "n": N, "hidden": H, "intermediate": F, "rank": R, "layers": args.layers,
                     "dtype": args.dtype, "use_rslora": True,
                     "attention": {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM}},
        "scaled_down": args.layers != 66,
        "bytes": {"one_module_export": one_module, "one_layer_attention_factors": attention},
        "floor_rss_bytes": floor,
        "runs": [small, full],
        "peak_rss_bytes": full["peak_rss_bytes"],
        "peak_above_floor_bytes": full["peak_rss_bytes"] - floor,
        "peak_above_floor_over_one_module": round((full["peak_rss_bytes"] - floor) / one_module, 3),
        "peak_above_floor_over_file": round((full["peak_rss_bytes"] - floor) / full["adapter_file_bytes"], 4),
        "peak_slope_bytes_per_layer": round(slope),
        "wall_s": full["wall_s"],
        "cpu_count": os.cpu_count(),
        "load_average_1min": round(os.getloadavg()[0], 2),  # wall times are noisy on a shared machine
        "reading": "the input is read one shared-sink module at a time (plan, write, proof), the output written "
                   "module by module and the proof compares each module on probe inputs (no dense [n*2F, H] "
                   "delta): the peak above the floor is about one module's factors as read, folded in float64, "
                   "read back and loaded by PEFT, plus the allocator's slack; its slope per layer is the "
                   "difference of the two runs' peaks over their difference in layers",
    }
    write_json(args.out, record)
    mib = lambda b: f"{b / 2 ** 20:,.0f} MiB"  # noqa: E731
    print(f"{full['layers']} layers: adapter {mib(full['adapter_file_bytes'])}, export "
          f"{mib(full['export_file_bytes'])}: peak RSS {mib(full['peak_rss_bytes'])} "
          f"({mib(full['peak_rss_bytes'] - floor)} above the {mib(floor)} floor), {full['wall_s']} s; "
          f"{small['layers']} layers: peak {mib(small['peak_rss_bytes'])}; slope {slope / 2 ** 20:.2f} MiB/layer "
          f"-> {args.out}")


if __name__ == "__main__":
    main()
