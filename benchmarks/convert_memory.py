"""How much memory and time `inkling-lab convert` takes for a real-size adapter (issue 13).

A benchmark, not a test. Generates, in a temporary folder (never committed), a PEFT
adapter of Inkling's geometry (n 2, H 6144, F 3072), r 64, over 66 layers, with the
attention factors (q, k, v, o: 64 heads of 128, 8 key/value heads) next to the
shared-sink ones, as a trainer of "all modules" writes it; then runs the real command
(`python -m inkling_lab.cli convert`) in a child process and records its peak resident
memory (the kernel's ``ru_maxrss`` of the child) and wall time, next to the sizes that
explain them: the file, its shared-sink factors, the pool written, and the memory of a
child that only imports the kit (the floor).

    python benchmarks/convert_memory.py            # writes data/benchmarks/convert_memory.json
    python benchmarks/convert_memory.py --layers 8 # smaller, where memory, disk or time is short
    python benchmarks/convert_memory.py --baseline ../old-checkout  # and the same with another version
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from inkling_lab.geometry import PRESETS  # noqa: E402
from inkling_lab.records import environment, write_json  # noqa: E402

_G = PRESETS["inkling"]  # the real config's shared sink: n 2, H 6144, F 3072, pool rank 64
N, H, F, R = _G.n, _G.hidden, _G.intermediate, _G.max_rank
HEADS, KV_HEADS, HEAD_DIM = 64, 8, 128


def make_adapter(folder: Path, layers: int, dtype: torch.dtype) -> dict[str, int]:
    """Write the adapter; returns its byte counts (whole file, shared-sink factors)."""
    gen = torch.Generator().manual_seed(0)
    tensors: dict[str, torch.Tensor] = {}
    sink = 0

    def put(key: str, *shape: int) -> int:
        tensors[key] = (torch.randn(shape, generator=gen) * 0.02).to(dtype)
        return tensors[key].numel() * tensors[key].element_size()

    for i in range(layers):
        p = f"base_model.model.model.layers.{i}"
        for proj, out_dim, in_dim in (("q_proj", HEADS * HEAD_DIM, H), ("k_proj", KV_HEADS * HEAD_DIM, H),
                                      ("v_proj", KV_HEADS * HEAD_DIM, H), ("o_proj", H, HEADS * HEAD_DIM)):
            put(f"{p}.self_attn.{proj}.lora_A.weight", R, in_dim)
            put(f"{p}.self_attn.{proj}.lora_B.weight", out_dim, R)
        s = f"{p}.mlp.shared_experts"
        for proj in ("gate_proj", "up_proj"):
            sink += put(f"{s}.{proj}.lora_A.weight", R, H) + put(f"{s}.{proj}.lora_B.weight", N * F, R)
        sink += put(f"{s}.down_proj.lora_A.weight", R, N * F) + put(f"{s}.down_proj.lora_B.weight", H, R)
    folder.mkdir(parents=True)
    save_file(tensors, folder / "adapter_model.safetensors")
    (folder / "adapter_config.json").write_text(
        '{"peft_type": "LORA", "r": 64, "lora_alpha": 128, "target_modules": '
        '["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}\n')
    return {"file_bytes": (folder / "adapter_model.safetensors").stat().st_size, "sink_factor_bytes": sink}


_MEASURE = """
import runpy, sys
sys.argv = sys.argv[1:]
try:
    if sys.argv[0] == "-c":
        exec(sys.argv[1])
    else:
        runpy.run_module(sys.argv[0], run_name="__main__")
except SystemExit as exit_:
    if exit_.code:
        raise
finally:
    peak = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
    print(int(peak.split()[1]) * 1024, file=sys.stderr)
"""


def run_child(args: list[str], kit: Path = ROOT) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one child process: its own ``VmHWM``, the
    high-water mark of the memory it mapped after ``exec`` (``ru_maxrss`` would count
    the parent's pages at ``fork`` too)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _MEASURE, *args], cwd=kit, check=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(kit), "PYTHONDONTWRITEBYTECODE": "1"}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    wall = time.perf_counter() - start
    return wall, int(done.stderr.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=66)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--out", type=Path, default=ROOT / "data" / "benchmarks" / "convert_memory.json")
    parser.add_argument("--baseline", type=Path, metavar="CHECKOUT",
                        help="also measure the same command with another checkout's inkling_lab (e.g. an older one)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory(prefix="inkling-convert-bench-") as tmp:
        folder = Path(tmp) / "adapter"
        sizes = make_adapter(folder, args.layers, dtype)
        out = Path(tmp) / "pool.safetensors"
        _, floor = run_child(["-c", "import inkling_lab.cli, inkling_lab.convert, inkling_lab.adapters"])
        command = ["inkling_lab.cli", "convert", str(folder), "-n", str(N), "-o", str(out), "-q"]
        wall, peak = run_child(command)
        pool_bytes = out.stat().st_size
        baseline = None
        if args.baseline:
            out.unlink()
            b_wall, b_peak = run_child(command + ["--dtype", args.dtype], kit=args.baseline.resolve())
            _, b_floor = run_child(["-c", "import inkling_lab.cli, inkling_lab.convert, inkling_lab.adapters"],
                                   kit=args.baseline.resolve())
            commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=args.baseline, capture_output=True,
                                    text=True).stdout.strip()
            baseline = {"checkout_commit": commit, "peak_rss_bytes": b_peak, "floor_rss_bytes": b_floor,
                        "peak_above_floor_bytes": b_peak - b_floor, "wall_s": round(b_wall, 2)}
    itemsize = dtype.itemsize
    layer_pool = (2 * R * H + N * 2 * F * R + N * R * F + H * R) * itemsize  # one module's four buffers
    record = {
        "environment": environment(f"python benchmarks/convert_memory.py --layers {args.layers} --dtype {args.dtype}"),
        "measured_command": f"inkling-lab convert ADAPTER -n {N} -o POOL -q",
        "what": "peak RSS and wall time of `inkling-lab convert` (one adapter, one slot) on a generated adapter "
                "of Inkling's geometry with attention factors",
        "geometry": {"n": N, "hidden": H, "intermediate": F, "rank": R, "layers": args.layers, "slots": 1,
                     "dtype": args.dtype, "attention": {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM}},
        "scaled_down": args.layers != 66,
        "bytes": {"adapter_file": sizes["file_bytes"], "shared_sink_factors": sizes["sink_factor_bytes"],
                  "pool_file": pool_bytes, "one_module_buffers": layer_pool},
        "peak_rss_bytes": peak,
        "floor_rss_bytes": floor,
        "peak_above_floor_bytes": peak - floor,
        "peak_above_floor_over_pool": round((peak - floor) / pool_bytes, 3),
        "peak_above_floor_over_file": round((peak - floor) / sizes["file_bytes"], 3),
        "wall_s": round(wall, 2),
        "baseline": baseline,  # the same command with --baseline CHECKOUT's inkling_lab
        "cpu_count": os.cpu_count(),
        "load_average_1min": round(os.getloadavg()[0], 2),  # wall times are noisy on a shared machine
        "reading": "peak above the floor is the shared-sink factors (read one tensor at a time, the other "
                   "modules never) plus one module's buffers being written; the pool is never held whole",
    }
    write_json(args.out, record)
    mib = lambda b: f"{b / 2 ** 20:,.0f} MiB"  # noqa: E731
    print(f"adapter {mib(sizes['file_bytes'])} (sink {mib(sizes['sink_factor_bytes'])}), pool {mib(pool_bytes)}: "
          f"peak RSS {mib(peak)} ({mib(peak - floor)} above the {mib(floor)} floor), {wall:.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
