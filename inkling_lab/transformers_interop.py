"""transformers' Inkling and the kit's sink: one set of weights, two layouts (docs/reference.md#the-base-module).

transformers (>= 5.24, ``transformers.models.inkling``) holds the shared sink as
``InklingSharedExperts`` with three 3D parameters: ``gate_proj [n, F, H]``,
``up_proj [n, F, H]`` and ``down_proj [n, H, F]``. The kit's ``SharedSink`` holds
``w13 [n, 2F, H]`` (gate and up rows interleaved, sglang's default, or contiguous
``[gate ‖ up]``) and ``w2 [n, H, F]`` (= ``down_proj``). The two compute the same
function; they round differently (transformers rounds the expert sum through float32
even for float64 weights), so in float64 they agree to about 1e-7.

``sink_from_transformers`` builds a ``SharedSink`` (or ``SharedSinkLoRA``) from a module
or its three tensors; ``sink_from_checkpoint`` reads them from a safetensors checkpoint
(a file, a folder, or a sharded folder with its index), one tensor at a time;
``transformers_state`` and ``to_transformers`` go back. transformers itself is needed
only for ``to_transformers``.
"""
from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
from safetensors import SafetensorError

from .adapters import open_safetensors
from .lora import SharedSinkLoRA
from .sink import SharedSink, gate_up_rows

PARAMETERS = ("gate_proj", "up_proj", "down_proj")
"""``InklingSharedExperts``' parameters, in its registration order."""
INDEX_FILE = "model.safetensors.index.json"


def _dims(state: Mapping[str, torch.Tensor], where: str) -> tuple[int, int, int]:
    missing = [p for p in PARAMETERS if p not in state]
    if missing:
        raise KeyError(f"{where}: no {', '.join(missing)}: InklingSharedExperts has gate_proj [n, F, H], "
                       "up_proj [n, F, H] and down_proj [n, H, F]")
    gate, up, down = (state[p] for p in PARAMETERS)
    if gate.dim() != 3 or up.shape != gate.shape or down.dim() != 3 \
            or tuple(down.shape) != (gate.shape[0], gate.shape[2], gate.shape[1]):
        raise ValueError(f"{where}: gate_proj {list(gate.shape)}, up_proj {list(up.shape)}, down_proj "
                         f"{list(down.shape)}; InklingSharedExperts has gate_proj [n, F, H], up_proj [n, F, H] "
                         "and down_proj [n, H, F]")
    n, F, H = (int(d) for d in gate.shape)
    return n, H, F


def sink_from_transformers(source: Any, *, interleaved: bool = True, dtype: torch.dtype | None = None,
                           cls: type[SharedSink] = SharedSink) -> SharedSink:
    """A kit sink with the weights of transformers' ``InklingSharedExperts``.

    ``source``: the module, or a mapping with its ``gate_proj [n, F, H]``, ``up_proj
    [n, F, H]`` and ``down_proj [n, H, F]``. ``interleaved``: the ``w13 [n, 2F, H]``
    layout (row ``2f`` gate feature ``f``, ``2f+1`` up; else ``[gate ‖ up]``). ``dtype``:
    default the source's. ``cls``: ``SharedSink`` or ``SharedSinkLoRA``. Values are
    copied exactly (a cast only when ``dtype`` differs).
    """
    state = source if isinstance(source, Mapping) else {p: getattr(source, p) for p in PARAMETERS}
    return _build(state, type(source).__name__, interleaved, dtype, cls)


def _build(state: Mapping[str, torch.Tensor], where: str, interleaved: bool, dtype: torch.dtype | None,
           cls: type[SharedSink]) -> SharedSink:
    n, H, F = _dims(state, where)
    gate, up, down = (state[p].detach() for p in PARAMETERS)
    dtype = dtype or gate.dtype
    sink = cls(n, H, F, interleaved=interleaved, dtype=dtype, device=gate.device)
    gate_rows, up_rows = gate_up_rows(F, interleaved, gate.device)
    with torch.no_grad():
        sink.w13[:, gate_rows] = gate.to(dtype)
        sink.w13[:, up_rows] = up.to(dtype)
        sink.w2.copy_(down.to(dtype))
    return sink


def transformers_state(sink: SharedSink) -> dict[str, torch.Tensor]:
    """The sink's weights as ``InklingSharedExperts`` holds them: ``gate_proj [n, F, H]``,
    ``up_proj [n, F, H]``, ``down_proj [n, H, F]`` (copies, the sink's dtype)."""
    gate_rows, up_rows = gate_up_rows(sink.intermediate_size, sink.interleaved, sink.device)
    w13 = sink.w13.detach()
    return {"gate_proj": w13[:, gate_rows].contiguous(), "up_proj": w13[:, up_rows].contiguous(),
            "down_proj": sink.w2.detach().clone()}


def to_transformers(sink: SharedSink, config: Any = None) -> torch.nn.Module:
    """transformers' ``InklingSharedExperts`` with the sink's weights. ``config``: an
    ``InklingTextConfig`` (default: the real config's, with the sink's ``n``, ``H``, ``F``)."""
    from transformers import InklingTextConfig
    from transformers.models.inkling.modeling_inkling import InklingSharedExperts

    n, H, F = sink.n_shared_experts, sink.hidden_size, sink.intermediate_size
    config = config or InklingTextConfig(hidden_size=H, moe_intermediate_size=F, n_shared_experts=n)
    if (config.n_shared_experts, config.hidden_size, config.moe_intermediate_size) != (n, H, F):
        raise ValueError(f"config has n_shared_experts={config.n_shared_experts}, hidden_size={config.hidden_size}, "
                         f"moe_intermediate_size={config.moe_intermediate_size}; the sink has n={n}, H={H}, F={F}")
    module = InklingSharedExperts(config).to(device=sink.device, dtype=sink.dtype)
    with torch.no_grad():
        for name, t in transformers_state(sink).items():
            getattr(module, name).copy_(t)
    return module


def _key_files(path: Path) -> dict[str, Path]:
    """Every tensor name of a checkpoint and the file that holds it: one safetensors
    file, a folder with ``model.safetensors``, or a sharded folder through its
    ``model.safetensors.index.json``. Reads headers only."""
    index = path / INDEX_FILE
    if path.is_dir() and index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            return {str(k): path / str(v) for k, v in weight_map.items()}
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise ValueError(f"{index.name}: not a safetensors index (no weight_map: {exc!r})") from None
    file = path / "model.safetensors" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{path.name}: neither a safetensors file nor a folder with model.safetensors or "
                                f"{INDEX_FILE}")
    try:
        with open_safetensors(file) as f:
            return {k: file for k in f.keys()}
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"{file.name}: not a readable safetensors file ({exc})") from None


def _find_prefix(keys: Iterable[str], layer: int, where: str) -> str:
    """The one ``...layers.<layer>.mlp.shared_experts`` holding a ``gate_proj``
    (``model.`` for ``InklingForCausalLM``, ``model.language_model.`` for the multimodal model)."""
    tail = f"layers.{layer}.mlp.shared_experts"
    found = sorted({k[:-len(".gate_proj")] for k in keys
                    if k.endswith(f"{tail}.gate_proj") and (k == f"{tail}.gate_proj" or k.endswith(f".{tail}.gate_proj"))})
    if len(found) != 1:
        which = f"{len(found)} ({', '.join(found)})" if found else "none"
        raise KeyError(f"{where}: looking for layer {layer}'s '...{tail}.gate_proj' found {which}: pass prefix=")
    return found[0]


def sink_from_checkpoint(path: str | os.PathLike[str], layer: int = 0, *, prefix: str | None = None,
                         interleaved: bool = True, dtype: torch.dtype | None = None,
                         cls: type[SharedSink] = SharedSink) -> SharedSink:
    """The sink of one layer of a transformers Inkling checkpoint (safetensors).

    Reads the headers, then only ``<prefix>.gate_proj``, ``up_proj`` and ``down_proj``,
    one tensor at a time, never the rest of the checkpoint. ``prefix``: default the one
    ``...layers.<layer>.mlp.shared_experts`` of the checkpoint (``model.layers.0...``
    or ``model.language_model.layers.0...``); the other arguments as for
    ``sink_from_transformers``.
    """
    path = Path(path)
    files = _key_files(path)
    prefix = prefix or _find_prefix(files, layer, path.name)
    state: dict[str, torch.Tensor] = {}
    for param in PARAMETERS:
        key = f"{prefix}.{param}"
        if key not in files:
            continue
        try:
            with open_safetensors(files[key]) as f:
                state[param] = f.get_tensor(key)
        except (SafetensorError, OSError) as exc:
            raise ValueError(f"{files[key].name}: not a readable safetensors file ({exc})") from None
    return _build(state, f"{path.name}: {prefix}", interleaved, dtype, cls)


@dataclass
class PeftSinkAdapter:
    """A PEFT ``target_parameters`` adapter on transformers' ``InklingSharedExperts``.

    ``folder``: where PEFT saved it; ``base``: a kit ``SharedSinkLoRA`` with the base
    weights (the sink before LoRA, ``interleaved`` as asked); ``peft_sink``: PEFT's
    wrapped module (``peft_sink(x [T, H], gammas [T, n])`` is PEFT's forward);
    ``merged``: PEFT's own merged weights (``gate_proj``, ``up_proj``, ``down_proj``).
    """

    folder: Path
    base: SharedSink
    peft_sink: torch.nn.Module
    merged: dict[str, torch.Tensor]
    config: Any


def make_peft_sink_adapter(folder: str | os.PathLike[str], n: int = 2, hidden: int = 8, intermediate: int = 4,
                           rank: int = 2, *, lora_alpha: float = 4.0,
                           targets: tuple[str, ...] = PARAMETERS, interleaved: bool = True,
                           dtype: torch.dtype = torch.float64, seed: int = 0) -> PeftSinkAdapter:
    """Train-free PEFT ``target_parameters`` export of transformers' own Inkling sink.

    Builds a one-layer model tree (``model.layers.0.mlp.shared_experts``, an
    ``InklingSharedExperts`` of ``n``, ``H=hidden``, ``F=intermediate``), wraps the
    ``targets`` parameters with PEFT LoRA of rank ``rank`` (random A and B, not PEFT's
    zero B, so that the delta shows) and saves it to ``folder`` as PEFT does. Needs
    transformers >= 5.24 and peft >= 0.18. Seeded; runs on a CPU in well under a second.
    """
    from peft import LoraConfig, get_peft_model
    from transformers import InklingTextConfig
    from transformers.models.inkling.modeling_inkling import InklingSharedExperts

    config = InklingTextConfig(hidden_size=hidden, moe_intermediate_size=intermediate, n_shared_experts=n)
    gen = torch.Generator().manual_seed(seed)
    shared = InklingSharedExperts(config).to(dtype)
    with torch.no_grad():
        for p in PARAMETERS:
            w = getattr(shared, p)
            w.copy_(torch.randn(w.shape, generator=gen, dtype=dtype) / w.shape[-1] ** 0.5)
    base = sink_from_transformers(shared, interleaved=interleaved, cls=SharedSinkLoRA)
    mlp = torch.nn.Module()
    mlp.shared_experts = shared
    layer = torch.nn.Module()
    layer.mlp = mlp
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList([layer])
    lora = LoraConfig(r=rank, lora_alpha=lora_alpha, target_modules=[], init_lora_weights=False,
                      target_parameters=[f"mlp.shared_experts.{p}" for p in targets])
    peft_model = get_peft_model(model, lora)
    with torch.no_grad():  # PEFT's own init is seeded by the global generator: reseed from ours
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=dtype) / p.shape[-1] ** 0.5)
    folder = Path(folder)
    peft_model.save_pretrained(str(folder))
    peft_sink = peft_model.base_model.model.model.layers[0].mlp.shared_experts
    merged_model = copy.deepcopy(peft_model).merge_and_unload()
    merged = {p: getattr(merged_model.model.layers[0].mlp.shared_experts, p).detach().clone() for p in PARAMETERS}
    return PeftSinkAdapter(folder, base, peft_sink, merged, config)



def peft_agreement(made: PeftSinkAdapter, pool: Any, tokens: int = 8, seed: int = 0) -> dict[str, float]:
    """How closely the kit, serving ``pool`` (a ``ConvertedPool`` of ``made``'s adapter in
    slot 0), computes what PEFT computes, on seeded random ``x [T, H]`` and gammas.

    ``"vs_peft_merged"``: against the sink with PEFT's own merged weights (``W + s*B@A``),
    all in the pool's dtype (float64: about 1e-15); ``"vs_peft_forward"``: against
    PEFT's forward of transformers' module, which rounds its expert sum through float32
    (about 1e-8). Relative errors (largest difference over the largest value).
    """
    from .batch import SlotBatch
    from .records import relative_error

    sink = made.base
    n, H = sink.n_shared_experts, sink.hidden_size
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, H, generator=gen, dtype=sink.dtype)
    gammas = torch.rand(tokens, n, generator=gen, dtype=sink.dtype)
    sink.set_lora_info(*pool.buffers())
    batch = SlotBatch.from_token_slots([0] * tokens, num_slots=pool.geometry.slots, lora_ranks=pool.lora_ranks)
    kit = sink(x, gammas, batch=batch, backend="reference")
    merged = sink_from_transformers(made.merged, interleaved=sink.interleaved)
    with torch.no_grad():
        peft_out = made.peft_sink(x, gammas)
    return {"vs_peft_merged": relative_error(kit, merged(x, gammas)), "vs_peft_forward": relative_error(kit, peft_out)}
