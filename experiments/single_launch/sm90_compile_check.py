"""Compile the one-launch kernel for sm_90 on a machine without a GPU and report what
ptxas made of it: registers, spills, shared memory, programs per multiprocessor, and
whether each K loop streams through shared memory (software-pipelined, 16-byte copies).

The launch arguments are the ones ``launch_single`` passes for a real case (shape A's
or TP8's divisibility: the values matter only through ``% 16`` and ``== 1``), planned
for the H200's 132 multiprocessors, captured instead of launched, and specialized by
Triton's own binder for a CUDA sm_90 target, so the alignment facts the compiler sees
are those of a launch on the H200. (v10 lost
its up-loop pipelining to a slice start the compiler could not prove aligned; this is
how that was found.) Triton here is the local one (3.9 at the time of v11); the H200
runs its own (3.6): counts can differ a little.

    PYTHONPATH=. python experiments/single_launch/sm90_compile_check.py [--shape A] [--tokens 1,32] [--configs default,kc512]
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import single_launch as sl  # noqa: E402  this folder (the script's own, first on sys.path)
from sm90 import compile_for_sm90  # noqa: E402  tests/sm90.py (act_down's report imports it from here)
from inkling_lab.geometry import Geometry
from inkling_lab.scenario import Scenario

SHAPES = {"A": (2, 1536, 768), "tp8": (2, 6144, 384), "small": (2, 256, 128)}
CONFIGS = {
    "default": sl.SingleConfig(),
    "big": sl.SingleConfig(kc=512),
    "big64": sl.SingleConfig(kc=512, bn=64),
    "w8": sl.SingleConfig(warps=8),
    "bf32": sl.SingleConfig(bf=32),
    "sleep": sl.SingleConfig(sleep_ns=200),
    "per_task": sl.SingleConfig(persistent=False),
    "r128": sl.SingleConfig(maxnreg=128),
    "big_r168": sl.SingleConfig(kc=512, bn=64, maxnreg=168),
}


def capture(ops, x, gammas, slots, scalings, ws):
    """The ``(grid, args, kwargs)`` ``launch_single`` would launch with."""
    seen = {}

    class Stub:
        def __getitem__(self, grid):
            def run(*args, **kwargs):
                seen.update(grid=grid, args=args, kwargs=kwargs)
            return run

    real = sl.single_launch_kernel
    sl.single_launch_kernel = Stub()
    try:
        sl.launch_single(ops, x, gammas, slots, scalings, torch.empty_like(x), ws)
    finally:
        sl.single_launch_kernel = real
    return seen


def cuobjdump() -> str:
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


def resources(cubin: bytes, ptx: str, maxnreg: int, tmp: Path) -> dict:
    """Registers and stack from the cubin; spill bytes from ptxas's own report on the PTX
    (the ptxas beside Triton that reads its PTX version)."""
    path = tmp / "k.cubin"
    path.write_bytes(cubin)
    out = subprocess.run([cuobjdump(), "--dump-resource-usage", str(path)], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out)
    row = dict(n_regs=int(m[1]), stack=int(m[2])) if m else {}
    (tmp / "k.ptx").write_text(ptx)
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    for ptxas in ("ptxas-blackwell", "ptxas"):
        cmd = [str(bin_dir / ptxas), "-v", "--gpu-name=sm_90a", str(tmp / "k.ptx"), "-o", str(tmp / "k2.cubin")]
        log = subprocess.run(cmd + ([f"--maxrregcount={maxnreg}"] if maxnreg else []), capture_output=True,
                             text=True).stderr
        spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
        if spills:
            row.update(spill_stores=max(int(a) for a, _ in spills), spill_loads=max(int(b) for _, b in spills))
            break
    return row


def loops(ttgir: str) -> list[dict]:
    """Each ``scf.for`` of the kernel with the source line it comes from and how many async
    copies (shared-memory pipelining) it issues, plus their widest contiguity."""
    lines = ttgir.splitlines()
    locs = {"#" + k: v for k, v in re.findall(r"^#(loc\d+) = loc\(\"[^\"]*single_launch.py\":(\d+):", ttgir, re.M)}
    for k, v in re.findall(r"^(#loc\d+) = loc\((?:callsite\(|\"[^\"]*\"\()(#loc\d+)", ttgir, re.M):
        locs.setdefault(k, v)   # an inlined call (the callee's own line) or a named value
    rows = []
    for i, line in enumerate(lines):
        if "scf.for" not in line:
            continue
        depth, body = 0, []
        for line2 in lines[i:]:
            depth += line2.count("{") - line2.count("}")
            body.append(line2)
            if depth <= 0 and len(body) > 1:
                break
        text = "\n".join(body)
        loc = re.search(r"loc\((#loc\d+)\)\s*$", body[-1])
        contig = [int(c) for c in re.findall(r"async_copy_global_to_local[^\n]*contiguity = (\d+)", text)]
        line = loc[1] if loc else ""
        for _ in range(50):
            if not line.startswith("#"):
                break
            line = locs.get(line, "0")
        rows.append(dict(line=int(line or 0), async_copies=text.count("async_copy_global_to_local"),
                         contiguity=max(contig) if contig else 0))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="A", choices=sorted(SHAPES))
    ap.add_argument("--tokens", default="1,32")
    ap.add_argument("--rank", type=int, default=64)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--json", help="write the rows here too")
    ap.add_argument("--sms", type=int, default=132, help="multiprocessors the host side plans for (the H200's)")
    args = ap.parse_args()
    sl._num_sms = lambda device: args.sms   # plan the split and the grid as on the GPU
    n, H, F = SHAPES[args.shape]
    tmp = Path("/tmp/sm90_compile_check")
    tmp.mkdir(exist_ok=True)
    rows = []
    for T in (int(t) for t in args.tokens.split(",")):
        g = Geometry(n=n, hidden=H, intermediate=F, max_rank=args.rank, slots=4, outer=1)
        sc = Scenario.random(g, tokens=T, seed=0, dtype=getattr(torch, args.dtype))
        ops = sc.operands()
        slots, scalings = sl.device_slots(sc.batch, T, "cpu")
        for name in args.configs.split(","):
            config = CONFIGS[name]
            ws = sl.make_workspace(ops, T, config)
            seen = capture(ops, sc.x, sc.gammas, slots, scalings, ws)
            k = compile_for_sm90(seen["args"], seen["kwargs"], sl.single_launch_kernel)
            ptx = k.asm["ptx"]
            res = resources(k.asm["cubin"], ptx, config.maxnreg, tmp)
            per_sm = sl._resident(type("K", (), dict(n_regs=res.get("n_regs", 0), n_spills=0,
                                                       metadata=k.metadata))(), config.warps)["per_sm"]
            row = dict(shape=args.shape, T=T, R=args.rank, config=name, **res, shared=k.metadata.shared,
                       per_sm=per_sm, loads_b16=len(re.findall(r"ld\.global(\.[a-z]+)*\.b16", ptx)),
                       cp_async_16=len(re.findall(r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], 0x10", ptx)),
                       nanosleep=ptx.count("nanosleep"), loops=loops(k.asm["ttgir"]), config_fields=asdict(config))
            rows.append(row)
            print(json.dumps({k2: v for k2, v in row.items() if k2 not in ("config_fields",)}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
