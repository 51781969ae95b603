"""sglang 0.5.23's shared-sink forward, run from its published wheel (issue 15 item 1).

Nothing of upstream lives in this repository. ``unpack(wheel, cache)`` opens the
wheel file (``pip download --no-deps sglang==0.5.23``), checks every file it
takes against the wheel's ``RECORD`` (sha256), writes those files to ``cache``
and, beside them, the few small modules of our own that stand in for the
imports those files make outside the kernels (``STUBS``: env flags at their
defaults, a batch-info dataclass with upstream's field names, a side stream).
``UpstreamSink`` then drives upstream's own ``forward_with_lora``
(``srt/lora/trtllm_lora_temp/inkling_dense.py``), the function
``InklingBatchDenseMLPWithLoRA._forward_bf16_linearized`` calls, with a
stand-in layer that carries the kit's pool and weights.

What that runs for the shared outer layout (interleaved bf16 weights, as the
first wrapper requires):

* base: ``torch.mm(x, w13_lin.T)``, the activation, ``torch.mm(act, w2_lin)``;
  the activation is ``InklingBatchDenseMLP._swiglu``, which for interleaved
  ``w13`` calls ``sglang.kernels.ops.moe.inkling_moe.silu_and_mul_triton``
  (a persistent Triton kernel in the sglang wheel itself, with PDL on sm_90;
  not ``sgl_kernel``'s compiled op);
* a pool of one slot (``_w1_delta.shape[0] == 1``): cuBLAS ``mm`` shrinks and
  ``addmm_`` expands (the one-slot path);
* more slots: the Triton kernels ``shared_sink_sgemm_lora_a_fwd`` /
  ``shared_sink_sgemm_lora_b_fwd`` (``kernels/ops/lora/dense/trtllm_lora_temp``);
* up to 32 tokens on sm_90 (``SGLANG_OPT_USE_INKLING_MULTI_STREAM_OVERLAP``,
  on by default) the gate/up shrink runs on a side stream beside the base GEMM.

The no-LoRA base is the same function with no active adapter.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib
import os
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator, Sequence

import torch

WHEEL_NAME = "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"
RECORD_PATH = "sglang-0.5.23.dist-info/RECORD"

FILES = (
    "sglang/kernels/ops/moe/inkling_moe.py",
    "sglang/kernels/ops/lora/dense/kernel_utils.py",
    "sglang/kernels/ops/lora/dense/trtllm_lora_temp/__init__.py",
    "sglang/kernels/ops/lora/dense/trtllm_lora_temp/kernel_utils.py",
    "sglang/kernels/ops/lora/dense/trtllm_lora_temp/gate_up_lora_b.py",
    "sglang/kernels/ops/lora/dense/trtllm_lora_temp/sgemm_lora_a.py",
    "sglang/kernels/ops/lora/dense/trtllm_lora_temp/sgemm_lora_b.py",
    "sglang/srt/lora/trtllm_lora_temp/inkling_dense.py",
)
"""The upstream files taken from the wheel, each checked against its RECORD."""

_FLAG = '''
import os


class _Flag:
    def __init__(self, name, default):
        self.name, self.default = name, default

    def get(self):
        raw = os.environ.get(self.name)
        return self.default if raw is None else raw.strip().lower() in ("1", "true", "yes", "on")
'''

STUBS = {
    # Empty packages on the way to the real files.
    **{f"{p}/__init__.py": "" for p in (
        "sglang", "sglang/kernels", "sglang/kernels/ops", "sglang/kernels/ops/moe", "sglang/kernels/ops/lora",
        "sglang/kernels/ops/lora/dense", "sglang/kernels/jit", "sglang/srt", "sglang/srt/utils",
        "sglang/srt/lora", "sglang/srt/models", "sglang/srt/models/inkling_common",
        "sglang/srt/models/inkling_common/kernels", "sglang/srt/model_executor",
        "sglang/srt/model_executor/runner_utils")},
    # kernels/jit/utils/arch.py: PDL from sm_90 on (CUDA only here).
    "sglang/kernels/jit/utils/__init__.py":
        "import torch\n\n\ndef is_arch_support_pdl():\n"
        "    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9\n",
    "sglang/srt/utils/common.py":
        "import torch\n\n\ndef is_sm121():\n"
        "    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (12, 1)\n",
    # srt/environ.py: the two flags these files read, at upstream's defaults.
    "sglang/srt/environ.py": _FLAG + '''

class _Envs:
    SGLANG_OPT_USE_INKLING_MULTI_STREAM_OVERLAP = _Flag("SGLANG_OPT_USE_INKLING_MULTI_STREAM_OVERLAP", True)
    SGLANG_EXPERIMENTAL_LORA_OPTI = _Flag("SGLANG_EXPERIMENTAL_LORA_OPTI", False)


envs = _Envs()
''',
    # srt/lora/trtllm_lora_temp/environ.py: every flag reads False unless the
    # experimental master switch is on (it is off by default).
    "sglang/srt/lora/trtllm_lora_temp/environ.py": '''
import os

from sglang.srt.environ import envs


class _Gated:
    def __init__(self, name):
        self.name = name

    def get(self):
        return envs.SGLANG_EXPERIMENTAL_LORA_OPTI.get() and os.environ.get(self.name, "1") in ("1", "true")


class _LoraEnvs:
    def __getattr__(self, name):
        return _Gated(name)


lora_envs = _LoraEnvs()
''',
    # srt/lora/utils.py: LoRABatchInfo's fields (a plain dataclass upstream too).
    "sglang/srt/lora/utils.py": '''
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class LoRABatchInfo:
    use_cuda_graph: bool
    bs: int
    num_segments: int
    seg_indptr: torch.Tensor
    weight_indices: torch.Tensor
    lora_ranks: torch.Tensor
    scalings: torch.Tensor
    max_len: Optional[int]
    seg_lens: Optional[torch.Tensor]
    permutation: Optional[torch.Tensor] = None
    expected_tokens: Optional[int] = None
    has_active_lora: bool = False
    is_prefill: bool = False
''',
    # srt/lora/trtllm_lora_temp/__init__.py: only the side stream is used. One
    # stream made before capture (upstream makes one per consumer stream, lazily).
    "sglang/srt/lora/trtllm_lora_temp/__init__.py": '''
import torch

_SIDE = []


def get_lora_side_stream():
    if not _SIDE:
        _SIDE.append(torch.cuda.Stream())
    return _SIDE[0]
''',
    "sglang/srt/model_executor/runner_utils/capture_mode.py": "def get_is_capture_mode():\n    return False\n",
    "sglang/srt/models/inkling_common/kernels/comm.py":
        "def symm_mem_all_reduce(x, group):\n    raise RuntimeError('no tensor parallelism in this harness')\n",
}


MEMBER_LIMIT = 64 * 2 ** 20
"""The most bytes one file of a wheel may unpack to (sglang's largest source file is under 1 MiB):
a larger one is no sglang wheel's, and reading it would take the memory a zip bomb asks for."""


@contextlib.contextmanager
def opened_wheel(wheel_path: str | Path) -> Iterator[zipfile.ZipFile]:
    """The wheel as a zip, opened only if it is a regular file (``ISL-K232``: a FIFO would
    block the read forever, a device never end)."""
    from .adapters import open_regular

    with os.fdopen(open_regular(wheel_path), "rb") as f:
        try:
            wheel = zipfile.ZipFile(f)
        except zipfile.BadZipFile as exc:
            raise ValueError(f"{wheel_path}: not a wheel ({exc}): give an sglang .whl "
                             "(pip download --no-deps sglang==0.5.23)") from None
        with wheel:
            yield wheel


def _read(wheel: zipfile.ZipFile, name: str, wheel_path: str | Path) -> bytes:
    size = wheel.getinfo(name).file_size
    if size > MEMBER_LIMIT:
        raise RuntimeError(f"{wheel_path}: {name} unpacks to {size} bytes, past the {MEMBER_LIMIT >> 20} MiB any "
                           "file of an sglang wheel holds: not an sglang wheel")
    return wheel.read(name)


def _record_hashes(wheel: zipfile.ZipFile, wheel_path: str | Path) -> dict[str, str]:
    """The wheel's RECORD: path -> sha256 (urlsafe base64, as RECORD writes it). The
    RECORD is the one ``*.dist-info/RECORD`` of the archive (any version)."""
    records = [n for n in wheel.namelist() if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
    if len(records) != 1:
        raise RuntimeError(f"{wheel_path}: expected one *.dist-info/RECORD, found {records or 'none'}")
    out = {}
    for line in _read(wheel, records[0], wheel_path).decode("utf-8", "replace").splitlines():
        parts = line.rsplit(",", 2)
        if len(parts) == 3 and parts[1].startswith("sha256="):
            out[parts[0]] = parts[1].removeprefix("sha256=")
    return out


def record_digest(data: bytes) -> str:
    """A file's sha256 as RECORD writes it (urlsafe base64, no padding)."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def read_checked(wheel_path: str | Path, names: Sequence[str], missing_ok: bool = False) -> dict[str, bytes]:
    """The files ``names`` of the wheel, each checked against its RECORD (sha256); raises
    ``RuntimeError`` naming the file when one does not match or RECORD lacks it. With
    ``missing_ok``, a file the wheel does not hold is left out instead of an error."""
    out = {}
    with opened_wheel(wheel_path) as wheel:
        hashes = _record_hashes(wheel, wheel_path)
        held = set(wheel.namelist())
        for name in names:
            if name not in held and missing_ok:
                continue
            data = _read(wheel, name, wheel_path)
            digest = record_digest(data)
            if hashes.get(name) != digest:
                raise RuntimeError(f"{wheel_path}: {name} does not match the wheel's RECORD "
                                   f"(sha256 {digest}, RECORD {hashes.get(name)})")
            out[name] = data
    return out


def record_of(wheel_path: str | Path, names: Sequence[str]) -> dict[str, str]:
    """RECORD's sha256 of each of ``names`` the wheel holds (absent ones left out)."""
    with opened_wheel(wheel_path) as wheel:
        hashes = _record_hashes(wheel, wheel_path)
    return {n: hashes[n] for n in names if n in hashes}


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def unpack(wheel_path: str | Path, cache: str | Path) -> dict:
    """Take ``FILES`` out of the wheel into ``cache`` (each checked against RECORD),
    write ``STUBS`` beside them, put ``cache`` first on ``sys.path``. Returns the
    provenance for a record: the wheel's name and sha256 and each file's hash."""
    cache = Path(cache)
    checked = {}
    for name, data in read_checked(wheel_path, FILES).items():
        dst = cache / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(data)
        checked[name] = record_digest(data)
    for name, text in STUBS.items():
        dst = cache / name
        if name in checked:
            raise RuntimeError(f"stub {name} would replace a real upstream file")
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(text.lstrip("\n"))
    if str(cache) not in sys.path:
        sys.path.insert(0, str(cache))
    for mod in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[mod]
    return {"wheel": Path(wheel_path).name, "wheel_sha256": file_sha256(wheel_path),
            "files_sha256_record": checked, "stubs": sorted(STUBS)}


@dataclass
class UpstreamSink:
    """A stand-in ``InklingBatchDenseMLPWithLoRA`` for upstream's ``forward_with_lora``.

    ``sink``: a kit ``SharedSinkLoRA`` (interleaved, shared outer pool) whose weights,
    pool and derived operands (``w1_delta``, ``a_cat``, upstream's layout for the
    interleaved sink) are used as they are; ``batch``: a kit ``SlotBatch`` of
    contiguous segments, turned into upstream's ``LoRABatchInfo`` on the device.
    ``min_slots``: pad the pool with copies of slot 0 up to this many slots, so a
    one-slot batch can run the multi-slot kernels (``2``) instead of the cuBLAS path.
    """

    sink: object
    batch: object
    min_slots: int = 1

    def __post_init__(self) -> None:
        utils = importlib.import_module("sglang.srt.lora.utils")
        self._dense = importlib.import_module("sglang.srt.lora.trtllm_lora_temp.inkling_dense")
        moe = importlib.import_module("sglang.kernels.ops.moe.inkling_moe")
        sink, batch = self.sink, self.batch
        if not sink.interleaved or sink.a_cat is None:
            raise ValueError("upstream's first wrapper runs interleaved weights with a shared-outer pool")
        dev = sink.w13.device
        ga, gb, da, db = sink.lora_buffers

        def padded(t: torch.Tensor) -> torch.Tensor:
            extra = self.min_slots - t.shape[0]
            return t if extra <= 0 else torch.cat([t] + [t[:1]] * extra).contiguous()

        lens = torch.diff(batch.seg_indptr)
        info = utils.LoRABatchInfo(
            use_cuda_graph=True, bs=batch.num_segments, num_segments=batch.num_segments,
            seg_indptr=batch.seg_indptr.to(dev, torch.int32), weight_indices=batch.weight_indices.to(dev, torch.int32),
            lora_ranks=padded(batch.lora_ranks.to(dev, torch.int32)), scalings=padded(batch.scalings.to(dev)),
            max_len=int(lens.max()), seg_lens=lens.to(dev, torch.int32), permutation=None,
            expected_tokens=batch.num_tokens, has_active_lora=True)
        n = sink.n_shared_experts

        def swiglu(y: torch.Tensor, gammas: torch.Tensor) -> torch.Tensor:
            # InklingBatchDenseMLP._swiglu for interleaved w13: rows are (token, expert).
            flat = moe.silu_and_mul_triton(y.reshape(-1, y.shape[-1]), gammas.reshape(-1))
            return flat.view(*y.shape[:-1], y.shape[-1] // 2)

        self.layer = SimpleNamespace(
            n_shared_experts=n, experts_shared_outer_loras=True, tp_group=None, _lora_routing_cache={},
            gate_up_lora_a_weights=padded(ga), gate_up_lora_b_weights=padded(gb),
            down_lora_a_weights=padded(da), down_lora_b_weights=padded(db),
            _w1_delta=padded(sink.w1_delta), _a_cat=padded(sink.a_cat), _swiglu=swiglu,
            lora_backend=SimpleNamespace(name="triton", batch_info=info, _sgemm_info=lambda pruned=None: info))
        self.linearized = sink.linearized()

    def forward(self, x: torch.Tensor, gammas: torch.Tensor, lora: bool = True) -> torch.Tensor:
        """Upstream's forward with the LoRA (``lora=False``: the base sink, no adapter)."""
        self.layer.lora_backend.batch_info.has_active_lora = lora
        return self._dense.forward_with_lora(self.layer, x, gammas, self.linearized, True)
