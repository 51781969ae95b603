"""vLLM 0.33's punica LoRA kernels driving the shared sink's forward, from files taken out of
its wheel (issue 26 item 5).

Nothing of vLLM lives in this repository. ``extract(wheel, dest)`` opens the wheel
(``pip download --no-deps vllm==0.33.0``, 336 MB), checks each of ``FILES`` against the
wheel's ``RECORD`` (sha256), writes them to ``dest`` with ``PROVENANCE.json`` (the wheel's
name and sha256, each file's RECORD hash) and, beside them, the few modules of our own that
stand in for the imports those files make outside the kernels (``STUBS``: the four env
flags at vLLM's defaults, a CUDA platform reading the device's capability, ``init_logger``
with ``warning_once``/``info_once``, ``next_power_of_2``,
``async_tensor_h2d``; ``direct_register_custom_op`` raises ``AttributeError``, so the files
take their own fallback, ``lora_shrink = _lora_shrink``). Only ``dest`` travels to the GPU
machine; ``load(dest)`` checks every file against ``PROVENANCE.json`` again and imports them.

vLLM has no shared-sink layer, so ``VllmSink`` is the kit's mapping of the forward (docs/reference.md#the-forward)
onto what vLLM's LoRA layers run, its punica ops called as vLLM's ``PunicaWrapperGPU`` calls
them (``lora_shrink`` into a float32 buffer, ``lora_expand`` with ``add_inputs=True``):

* ``y = x @ w13.T`` (cuBLAS, ``w13`` rows in vLLM's merged-column order: per expert its gate
  rows, then its up rows), the gate/up LoRA as ``2n`` output slices (expert ``e``'s gate and
  up, A = that half of ``gate_up_A``, B = that half of expert ``e``'s ``gate_up_B``), like
  ``MergedColumnParallelLinearWithLoRA``;
* ``act = silu(gate) * up * gamma`` in torch;
* ``out = act @ w2_lin`` (cuBLAS) plus one slice with A = ``a_cat`` and B = ``down_B``, like
  ``RowParallelLinearWithLoRA``.

Shared outer layout only (the side-by-side grid's); each slot's scaling 1 (the pool folds it).
The token metadata (``LoRAKernelMeta.prepare_tensors``) is made once per batch, outside the
timed forward, as vLLM does per step.
"""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as tnf

from .upstream_wheel import file_sha256, read_checked, record_digest, record_of

FILES = (
    "vllm/lora/ops/triton_ops/lora_shrink_op.py",
    "vllm/lora/ops/triton_ops/lora_expand_op.py",
    "vllm/lora/ops/triton_ops/kernel_utils.py",
    "vllm/lora/ops/triton_ops/utils.py",
    "vllm/lora/ops/triton_ops/lora_kernel_metadata.py",
)
"""The vLLM files taken from the wheel, each checked against its RECORD."""

STUBS = {
    "vllm/__init__.py": "",
    "vllm/envs.py": "VLLM_BATCH_INVARIANT = False\nVLLM_TUNED_CONFIG_FOLDER = None\n"
                    "VLLM_LORA_DISABLE_PDL = False\nVLLM_LORA_ENABLE_DUAL_STREAM = False\n",
    "vllm/logger.py": ("import functools\nimport logging\n\n\ndef init_logger(name):\n"
                       "    log = logging.getLogger(name)\n"
                       "    log.warning_once = functools.cache(log.warning)\n"
                       "    log.info_once = functools.cache(log.info)\n"
                       "    return log\n"),
    "vllm/platforms/__init__.py": (
        "import torch\n\n\nclass _Cuda:\n    dispatch_key = 'CUDA'\n\n    def is_cuda(self):\n        return True\n\n"
        "    def has_device_capability(self, c):\n        return torch.cuda.get_device_capability() >= divmod(c, 10)\n\n"
        "    def is_device_capability(self, c):\n        return torch.cuda.get_device_capability() == divmod(c, 10)\n\n\n"
        "current_platform = _Cuda()\n"),
    "vllm/triton_utils/__init__.py": "import triton\nimport triton.language as tl\n",
    "vllm/utils/__init__.py": "",
    "vllm/utils/math_utils.py": "def next_power_of_2(n):\n    return 1 if n < 1 else 1 << (n - 1).bit_length()\n",
    "vllm/utils/torch_utils.py": (
        "import torch\n\n\ndef async_tensor_h2d(data, dtype=None, device=None, out=None):\n"
        "    return torch.tensor(data, dtype=dtype, device='cpu').to(device=device, non_blocking=True)\n\n\n"
        "def direct_register_custom_op(**kw):\n"
        "    raise AttributeError('no custom-op registry in this harness')  # the files fall back to the function\n"),
    "vllm/lora/__init__.py": "",
    "vllm/lora/ops/__init__.py": "",
    "vllm/lora/ops/triton_ops/__init__.py": "",  # the wheel's own imports every op, fp8 and MoE ones too
}
"""Our stand-ins for what ``FILES`` import from the rest of vLLM (defaults from its ``envs.py``)."""

PROVENANCE = "PROVENANCE.json"


def extract(wheel_path: str | Path, dest: str | Path) -> dict:
    """Write ``FILES`` (RECORD-checked) and ``STUBS`` under ``dest``, and ``PROVENANCE.json``;
    returns the provenance."""
    dest = Path(dest)
    files = read_checked(wheel_path, FILES)
    for name, data in {**files, **{k: v.encode() for k, v in STUBS.items()}}.items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_bytes(data)
    prov = {"wheel": Path(wheel_path).name, "wheel_sha256": file_sha256(wheel_path),
            "files_sha256_record": record_of(wheel_path, FILES), "stubs": sorted(STUBS)}
    (dest / PROVENANCE).write_text(json.dumps(prov, indent=1))
    return prov


def load(dest: str | Path) -> dict:
    """Check each extracted file against ``PROVENANCE.json`` (RECORD's hashes), put ``dest``
    first on ``sys.path`` and import the two ops; returns the provenance."""
    dest = Path(dest)
    prov = json.loads((dest / PROVENANCE).read_text())
    for name in FILES:
        digest = record_digest((dest / name).read_bytes())
        if prov["files_sha256_record"].get(name) != digest:
            raise RuntimeError(f"{dest / name} is not the wheel's file (sha256 {digest}, RECORD "
                               f"{prov['files_sha256_record'].get(name)})")
    if str(dest) not in sys.path:
        sys.path.insert(0, str(dest))
    for name in FILES:
        importlib.import_module(name.removesuffix(".py").replace("/", "."))
    return prov


class VllmSink:
    """The shared sink's forward through vLLM's punica ops (see the module docstring) for
    ``sink`` (shared outer, its pool adopted) and ``batch``; ``forward(x, gammas)`` is
    capturable in a CUDA graph once called."""

    def __init__(self, sink, batch) -> None:
        ops_mod = sys.modules["vllm.lora.ops.triton_ops.lora_shrink_op"]
        self.shrink = ops_mod.lora_shrink
        self.expand = sys.modules["vllm.lora.ops.triton_ops.lora_expand_op"].lora_expand
        meta_cls = sys.modules["vllm.lora.ops.triton_ops.lora_kernel_metadata"].LoRAKernelMeta
        # vLLM caches each weight list's pointers and strides by address, for weights that never
        # change; here every point has new ones, and the allocator may hand out an old address.
        utils = sys.modules["vllm.lora.ops.triton_ops.utils"]
        utils._LORA_A_PTR_DICT.clear()
        utils._LORA_B_PTR_DICT.clear()
        ops = sink.operands()
        if not ops.shared_outer:
            raise ValueError("VllmSink maps the shared outer layout only")
        n, F, H = ops.n, ops.intermediate, ops.hidden
        ga, gb, _, db = ops.buffers
        S, R = ga.shape[0], ga.shape[2] // 2
        # vLLM's merged-column order: expert e's gate rows, then its up rows.
        w13 = ops.w13_lin.view(n, F, 2, H) if ops.interleaved else ops.w13_lin.view(n, 2, F, H).transpose(1, 2)
        self.w13 = w13.transpose(1, 2).reshape(n * 2 * F, H).contiguous()
        self.w2 = ops.w2_lin
        self.lora_a = [ga[:, 0, h * R:(h + 1) * R, :].contiguous() for _ in range(n) for h in (0, 1)]
        self.lora_b = [gb[:, e, h * F:(h + 1) * F, :].contiguous() for e in range(n) for h in (0, 1)]
        self.down_a, self.down_b = [ops.a_cat.contiguous()], [db[:, 0].contiguous()]
        slots = batch.token_slots().clone()
        lora = slots >= 0
        slots[lora] = torch.where(batch.lora_ranks[slots[lora]] == 0, -1, slots[lora])
        T = slots.numel()
        self.meta = meta_cls.make(S, T, ga.device)
        self.meta.prepare_tensors(slots.to(device=ga.device, dtype=torch.int32))
        self.args = self.meta.meta_args(T, True)
        self.n, self.F, self.R = n, F, R

    def forward(self, x: torch.Tensor, gammas: torch.Tensor) -> torch.Tensor:
        T, n, F = x.shape[0], self.n, self.F
        y = torch.mm(x, self.w13.T)
        buf = torch.empty(2 * n, T, self.R, dtype=torch.float32, device=x.device)
        self.shrink(x, self.lora_a, buf, *self.args, 1.0)
        self.expand(buf, self.lora_b, y, *self.args, offset_start=0, add_inputs=True)
        gate, up = y.view(T, n, 2, F).unbind(2)
        act = (tnf.silu(gate.float()) * up.float() * gammas.float()[:, :, None]).to(x.dtype).reshape(T, n * F)
        out = torch.mm(act, self.w2)
        mid = torch.empty(1, T, self.R, dtype=torch.float32, device=x.device)
        self.shrink(act, self.down_a, mid, *self.args, 1.0)
        self.expand(mid, self.down_b, out, *self.args, offset_start=0, add_inputs=True)
        return out
