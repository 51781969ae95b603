"""How much memory and time `inkling-lab export` takes for a real-size adapter (issue 23).

A benchmark, not a test. The same generated adapter as benchmarks/convert_memory.py
(Inkling's geometry, n 2, H 6144, F 3072, r 64, 66 layers, attention factors beside the
shared-sink ones, bfloat16, in a temporary folder never committed), given rsLoRA so that
the export has a scaling to fold; then the real command (`python -m inkling_lab.cli
export`) in a child process, its peak resident memory (``VmHWM``) and wall time, next to
the sizes that explain them. The export includes its proof (every module read back
through the kit's model of sglang's path and compared with PEFT's delta, computed by
PEFT itself, one module at a time).

    python benchmarks/export_memory.py            # writes data/benchmarks/export_memory.json
    python benchmarks/export_memory.py --layers 8 # smaller, where memory, disk or time is short
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from convert_memory import F, H, N, R, make_adapter, run_child  # noqa: E402

from inkling_lab.records import environment, write_json  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=66)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--out", type=Path, default=ROOT / "data" / "benchmarks" / "export_memory.json")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory(prefix="inkling-export-bench-") as tmp:
        folder = Path(tmp) / "adapter"
        sizes = make_adapter(folder, args.layers, dtype)
        config = json.loads((folder / "adapter_config.json").read_text())
        (folder / "adapter_config.json").write_text(json.dumps({**config, "use_rslora": True}))
        out = Path(tmp) / "for_sglang"
        _, floor = run_child(["-c", "import inkling_lab.cli, inkling_lab.export, peft"])
        command = ["inkling_lab.cli", "export", str(folder), "-n", str(N), "-o", str(out), "-q", "--json"]
        wall, peak = run_child(command)
        written = (out / "adapter_model.safetensors").stat().st_size
    itemsize = dtype.itemsize
    one_module = (2 * R * H + 2 * N * F * R + R * N * F + H * R) * itemsize  # gate A, up A, gate B, up B, down A, down B
    dense_deltas = 3 * N * F * H * 8  # one module's gate, up, down deltas [n, F, H] in float64
    record = {
        "environment": environment(f"python benchmarks/export_memory.py --layers {args.layers} --dtype {args.dtype}"),
        "measured_command": f"inkling-lab export ADAPTER -n {N} -o OUT -q --json",
        "what": "peak RSS and wall time of `inkling-lab export` (write, then the proof against PEFT itself) on a "
                "generated rsLoRA adapter of Inkling's geometry with attention factors",
        "geometry": {"n": N, "hidden": H, "intermediate": F, "rank": R, "layers": args.layers, "dtype": args.dtype,
                     "use_rslora": True},
        "scaled_down": args.layers != 66,
        "bytes": {"adapter_file": sizes["file_bytes"], "shared_sink_factors": sizes["sink_factor_bytes"],
                  "export_file": written, "one_module_export": one_module,
                  "one_module_dense_deltas_float64": dense_deltas},
        "peak_rss_bytes": peak,
        "floor_rss_bytes": floor,
        "peak_above_floor_bytes": peak - floor,
        "peak_above_floor_over_sink_factors": round((peak - floor) / sizes["sink_factor_bytes"], 3),
        "peak_above_floor_over_file": round((peak - floor) / sizes["file_bytes"], 3),
        "wall_s": round(wall, 2),
        "cpu_count": os.cpu_count(),
        "load_average_1min": round(os.getloadavg()[0], 2),  # wall times are noisy on a shared machine
        "reading": "the file is written module by module (one module's export at a time); peak above the floor is "
                   "the shared-sink factors load_adapter holds, plus the proof's one module at a time: PEFT's "
                   "stand-in and merged weights and the dense float64 deltas it compares (served, PEFT's, and for "
                   "16-bit dtypes the rounding bound)",
    }
    write_json(args.out, record)
    mib = lambda b: f"{b / 2 ** 20:,.0f} MiB"  # noqa: E731
    print(f"adapter {mib(sizes['file_bytes'])} (sink {mib(sizes['sink_factor_bytes'])}), export {mib(written)}: "
          f"peak RSS {mib(peak)} ({mib(peak - floor)} above the {mib(floor)} floor), {wall:.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
