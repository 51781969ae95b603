"""transformers' Inkling and the kit's sink: one set of weights, two layouts (docs/reference.md#the-base-module).

transformers (>= 5.24, ``transformers.models.inkling``) holds the shared sink as
``InklingSharedExperts`` with three 3D parameters: ``gate_proj [n, F, H]``,
``up_proj [n, F, H]`` and ``down_proj [n, H, F]``. The kit's ``SharedSink`` holds
``w13 [n, 2F, H]`` (gate and up rows interleaved, sglang's default, or contiguous
``[gate ‖ up]``) and ``w2 [n, H, F]`` (= ``down_proj``). The two compute the same
function; they round differently (transformers rounds the expert sum through float32
even for float64 weights), so in float64 they agree to about 1e-7.

``sink_from_transformers`` builds a ``SharedSink`` (or ``SharedSinkLoRA``) from a module
or its three tensors, with the module's activation (``config.hidden_act``: transformers'
own tests use ``gelu``; sglang's sink computes SiLU only); ``sink_from_checkpoint`` reads
them from a safetensors checkpoint in either format (the published ``shared_w13_weight`` /
``shared_w2_weight`` or transformers' own names; a file, a folder, or a sharded folder
with its index), one tensor at a time, and says which it read;
``transformers_state`` and ``to_transformers`` go back. transformers itself is needed
only for ``to_transformers``.
"""
from __future__ import annotations

import copy
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
from safetensors import SafetensorError

from .adapters import HeaderError, as_path, check_regular, open_safetensors, read_regular
from .catalog import error, message
from .geometry import WORKING_DTYPES
from .lora import SharedSinkLoRA
from .sink import ACTIVATIONS, SharedSink, gate_up_rows

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
                           cls: type[SharedSink] = SharedSink, activation: str | None = None) -> SharedSink:
    """A kit sink with the weights of transformers' ``InklingSharedExperts``.

    ``source``: the module, or a mapping with its ``gate_proj [n, F, H]``, ``up_proj
    [n, F, H]`` and ``down_proj [n, H, F]``. ``interleaved``: the ``w13 [n, 2F, H]``
    layout (row ``2f`` gate feature ``f``, ``2f+1`` up; else ``[gate ‖ up]``). ``dtype``:
    default the source's. ``cls``: ``SharedSink`` or ``SharedSinkLoRA``. ``activation``:
    default the module's own ``act_fn`` (``activation_of``), ``silu`` for a mapping.
    Values are copied exactly (a cast only when ``dtype`` differs).
    """
    if not isinstance(source, (Mapping, torch.nn.Module)):
        raise TypeError(f"sink_from_transformers: source must be transformers' InklingSharedExperts or a mapping of "
                        f"its {', '.join(PARAMETERS)}, got {type(source).__name__}")
    state = source if isinstance(source, Mapping) else {p: getattr(source, p) for p in PARAMETERS}
    if activation is None:
        activation = "silu" if isinstance(source, Mapping) else activation_of(source)
    return _build(state, type(source).__name__, interleaved, dtype, cls, activation)


def activation_of(module: Any) -> str:
    """The ``ACT2FN`` name (one of ``ACTIVATIONS``) of an ``InklingSharedExperts``' ``act_fn``.

    The module keeps the function, not ``config.hidden_act``, so it is told by what it
    computes: the kit's activation that agrees with it on a probe grid (names of one
    function, ``gelu_new`` and ``gelu_pytorch_tanh``, are interchangeable). ``ISL-K154`` when
    none does: the kit never stands in SiLU for it."""
    act_fn = getattr(module, "act_fn", None)
    if act_fn is None:
        return "silu"
    probe = torch.linspace(-6, 6, 241, dtype=torch.float64)
    with torch.no_grad():
        want = act_fn(probe)
    for name, fn in ACTIVATIONS.items():
        if torch.allclose(fn(probe), want, rtol=1e-9, atol=1e-12):
            return name
    raise error("ISL-K154", name=type(act_fn).__name__, known=", ".join(ACTIVATIONS))


def _build(state: Mapping[str, torch.Tensor], where: str, interleaved: bool, dtype: torch.dtype | None,
           cls: type[SharedSink], activation: str = "silu") -> SharedSink:
    n, H, F = _dims(state, where)
    gate, up, down = (state[p].detach() for p in PARAMETERS)
    dtypes = {p: state[p].dtype for p in PARAMETERS}
    odd = {p: d for p, d in dtypes.items() if d not in WORKING_DTYPES}
    if odd or (dtype is None and len(set(dtypes.values())) > 1):
        # an int32 gate would have made an int32 sink, an fp16 gate rounded float32 up and down silently
        raise TypeError(message("ISL-K422", where=where, dtypes=", ".join(
            f"{p} {str(d).removeprefix('torch.')}" for p, d in dtypes.items())))
    cast = dtype is not None and dtype != gate.dtype
    dtype = dtype or gate.dtype
    for p, t in zip(PARAMETERS, (gate, up, down)):  # as read, then as cast: an overflow is no silent Inf
        for made, how in ((t, "as read"), *(((t.to(dtype), f"after the cast to {dtype}"),) if cast else ())):
            if made.is_floating_point() and made.numel() and not bool(torch.isfinite(made).all()):
                raise ValueError(message("ISL-K423", where=where, param=p, count=int((~torch.isfinite(made)).sum()),
                                         total=made.numel(), dtype=str(made.dtype).removeprefix("torch."), how=how))
    sink = cls(n, H, F, interleaved=interleaved, dtype=dtype, device=gate.device, activation=activation)
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
    if not isinstance(sink, SharedSink):
        raise TypeError(f"to_transformers: sink must be a SharedSink (or SharedSinkLoRA), got {type(sink).__name__}")
    from transformers import InklingTextConfig
    from transformers.models.inkling.modeling_inkling import InklingSharedExperts

    n, H, F = sink.n_shared_experts, sink.hidden_size, sink.intermediate_size
    config = config or InklingTextConfig(hidden_size=H, moe_intermediate_size=F, n_shared_experts=n,
                                         hidden_act=sink.activation)
    if (config.n_shared_experts, config.hidden_size, config.moe_intermediate_size) != (n, H, F):
        raise ValueError(f"config has n_shared_experts={config.n_shared_experts}, hidden_size={config.hidden_size}, "
                         f"moe_intermediate_size={config.moe_intermediate_size}; the sink has n={n}, H={H}, F={F}")
    module = InklingSharedExperts(config).to(device=sink.device, dtype=sink.dtype)
    with torch.no_grad():
        for name, t in transformers_state(sink).items():
            getattr(module, name).copy_(t)
    return module


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook``: a key given twice is refused (``ISL-K421``),
    never the last one kept silently."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(message("ISL-K421", file=INDEX_FILE, key=key, first=out[key], second=value))
        out[key] = value
    return out


def _shard(folder: Path, name: Any) -> Path:
    """The shard an index entry names: a relative path inside the checkpoint folder
    (``ISL-K420`` for an absolute one, one that climbs out with ``..``, or no string). The
    name is checked, not where a symlink leads: a hub cache links its shards to blobs."""
    text = name if isinstance(name, str) else None
    if (text is None or not text or os.path.isabs(text) or "\x00" in text
            or ".." in Path(text).parts):
        raise ValueError(message("ISL-K420", file=INDEX_FILE, shard=repr(name)))
    return folder / text


def _key_files(path: Path) -> dict[str, Path]:
    """Every tensor name of a checkpoint and the file that holds it: one safetensors
    file, a folder with ``model.safetensors``, or a sharded folder through its
    ``model.safetensors.index.json`` (each shard inside the folder, ``ISL-K420``; a key in
    the index twice, or in two shards, ``ISL-K421``). Reads headers only; every file it
    opens is a regular one (``ISL-K232``: a FIFO would block)."""
    index = path / INDEX_FILE
    if path.is_dir() and os.path.lexists(index):
        raw = read_regular(index)  # ISL-K232 for a FIFO or a device under the index's name
        try:  # a key given twice in the JSON is ISL-K421 (raised by the hook, passed through)
            weight_map = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)["weight_map"]
            entries = list(weight_map.items())
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError,
                RecursionError) as exc:
            raise ValueError(f"{index.name}: not a safetensors index (no weight_map: {exc!r})") from None
        files = {str(k): _shard(path, v) for k, v in entries}
        seen: dict[str, Path] = {}
        for shard in dict.fromkeys(files.values()):  # every shard's header: a key in two of them is refused
            for key in _header_keys(shard):
                if key in seen and seen[key] != shard:
                    raise ValueError(message("ISL-K421", file=f"{seen[key].name} and {shard.name}", key=key,
                                             first=seen[key].name, second=shard.name))
                seen.setdefault(key, shard)
        return files
    file = path / "model.safetensors" if path.is_dir() else path
    check_regular(file)
    if not file.is_file():
        raise FileNotFoundError(f"{path.name}: neither a safetensors file nor a folder with model.safetensors or "
                                f"{INDEX_FILE}")
    return {k: file for k in _header_keys(file)}


def _header_keys(file: Path) -> list[str]:
    try:
        with open_safetensors(file) as f:
            return list(f.keys())
    except FileNotFoundError:
        raise FileNotFoundError(f"{file.name}: a shard the index names is missing") from None
    except (SafetensorError, OSError, HeaderError) as exc:
        raise ValueError(f"{file.name}: not a readable safetensors file ({exc})") from None


PUBLISHED = ("shared_w13_weight", "shared_w2_weight")
"""The published (original) checkpoint names of one layer's sink, under
``model.llm.layers.N.mlp.shared_experts``: ``shared_w13_weight [n, 2F, H]`` (gate and up
rows interleaved) and ``shared_w2_weight [n, H, F]``. ``save_pretrained()`` writes them by
default (``save_original_format=True``; transformers' ``conversion_mapping.py``: ``Interleave``
then ``Chunk`` into ``gate_proj``/``up_proj``), and sglang loads them."""
FORMATS = {
    "published": "the published format (save_pretrained's default, save_original_format=True, what sglang "
                 "loads): shared_w13_weight [n, 2F, H] gate/up interleaved and shared_w2_weight [n, H, F]",
    "transformers": "transformers' own format (save_original_format=False): gate_proj [n, F, H], up_proj "
                    "[n, F, H] and down_proj [n, H, F]",
}


@dataclass(frozen=True)
class CheckpointLayer:
    """Where one layer's sink came from: ``prefix`` (``...layers.N.mlp.shared_experts``),
    ``format`` (``"published"`` or ``"transformers"``, ``FORMATS`` says what each is), the
    files read (one, or the shards that hold it), and ``activation`` with where it was read."""

    prefix: str
    format: str
    files: tuple[str, ...]
    activation: str
    activation_from: str

    def __str__(self) -> str:
        return (f"{self.prefix}: {FORMATS[self.format]}; read from {', '.join(self.files)}; activation "
                f"{self.activation} ({self.activation_from})")


def _find_prefix(keys: Iterable[str], layer: int, where: str) -> tuple[str, str]:
    """The one ``...layers.<layer>.mlp.shared_experts`` of the checkpoint and its format:
    ``model.layers.`` (``InklingForCausalLM``), ``model.language_model.layers.`` (the
    multimodal model, transformers' format) or ``model.llm.layers.`` (the published format)."""
    tail = f"layers.{layer}.mlp.shared_experts"
    found: dict[str, str] = {}
    for k in keys:
        for name, fmt in (("gate_proj", "transformers"), (PUBLISHED[0], "published")):
            if k.endswith(f"{tail}.{name}") and (k == f"{tail}.{name}" or k.endswith(f".{tail}.{name}")):
                found[k[:-len(name) - 1]] = fmt
    if len(found) != 1:
        which = f"{len(found)} ({', '.join(sorted(found))})" if found else "none"
        layers = sorted({int(m[1]) for k in keys if (m := re.search(r"layers\.(\d+)\.mlp\.shared_experts\.", k))})
        raise KeyError(f"{where}: looking for layer {layer}'s '...{tail}.gate_proj' (or .{PUBLISHED[0]}) found "
                       f"{which}: pass prefix=" + (f"; the layers with shared experts are {layers}" if layers
                                                   and layer not in layers else ""))
    ((prefix, fmt),) = found.items()
    return prefix, fmt


def _config_activation(path: Path) -> tuple[str, str]:
    """``config.hidden_act`` of the checkpoint's ``config.json`` (the text config's for the
    multimodal model), and where it was read."""
    config = (path if path.is_dir() else path.parent) / "config.json"
    check_regular(config)
    if not config.is_file():
        return "silu", "no config.json beside it: InklingTextConfig's default"
    try:
        data = json.loads(read_regular(config).decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"{config.name}: not a readable model config ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{config}: not a model config (a JSON object), but {type(data).__name__}")
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else data
    if "hidden_act" in text:
        return text["hidden_act"], f"{config.name}: " + ("text_config." if text is not data else "") + "hidden_act"
    return "silu", f"{config.name} names no hidden_act: InklingTextConfig's default"


def model_activation(adapter: str | os.PathLike[str] | None = None, config: str | os.PathLike[str] | None = None,
                     hidden_act: str | None = None) -> tuple[str, str]:
    """The model's ``config.hidden_act`` (what transformers' ``InklingSharedExperts``
    computes, ``act_fn(gate) * up``) and where it was learnt, from the first of:
    ``hidden_act`` given (``--hidden-act``); ``config``, the base model's ``config.json``
    (or the folder holding it); a ``config.json`` in the ``adapter`` folder; the
    ``config.json`` of the folder its ``adapter_config.json`` names as
    ``base_model_name_or_path``, when that is a local folder. Else ``silu``,
    InklingTextConfig's default, saying that no config was found. An activation the kit
    does not know is ``ISL-K154``; a ``config`` without a ``config.json`` is refused."""
    from .sink import activation_fn

    if hidden_act is not None:
        activation_fn(hidden_act)
        return hidden_act, "--hidden-act"
    candidates: list[Path] = []
    if config is not None:
        given = as_path("the model's config (--config)", config)
        if not given.is_dir():
            check_regular(given)  # a FIFO named here would block the read (ISL-K232)
        candidates.append(given if given.name == "config.json" else given / "config.json")
        if not candidates[0].is_file():
            raise FileNotFoundError(f"{given}: no config.json (give the base model's config.json, or its folder)")
    elif adapter is not None:
        folder = Path(adapter) if Path(adapter).is_dir() else Path(adapter).parent
        candidates.append(folder / "config.json")
        base = _base_model_path(folder)
        if base is not None:
            candidates.append(base / "config.json")
    for path in candidates:
        if path.is_file():
            act, where = _config_activation(path)
            activation_fn(act)
            return act, f"{path}" + where.removeprefix(path.name)
    return "silu", "no config.json given or found: InklingTextConfig's default"


def _base_model_path(adapter_folder: Path) -> Path | None:
    """The local folder an adapter's ``adapter_config.json`` names as its base model, if any."""
    try:
        data = json.loads(read_regular(adapter_folder / "adapter_config.json").decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None  # no readable adapter config (absent, not JSON, nested past any config): its readers say why
    base = data.get("base_model_name_or_path") if isinstance(data, dict) else None
    if not isinstance(base, str) or not base:
        return None
    path = Path(base) if Path(base).is_absolute() else adapter_folder / base
    return path if path.is_dir() else (Path(base) if Path(base).is_dir() else None)


def sink_from_checkpoint(path: str | os.PathLike[str], layer: int = 0, *, prefix: str | None = None,
                         interleaved: bool = True, dtype: torch.dtype | None = None,
                         cls: type[SharedSink] = SharedSink, activation: str | None = None) -> SharedSink:
    """The sink of one layer of a transformers Inkling checkpoint (safetensors).

    Both formats (``FORMATS``), detected by name: the published one
    (``model.llm.layers.N.mlp.shared_experts.shared_w13_weight`` / ``shared_w2_weight``)
    and transformers' own (``...shared_experts.gate_proj`` / ``up_proj`` / ``down_proj``),
    one file or sharded through ``model.safetensors.index.json``. Reads the headers, then
    only the layer's sink tensors, one at a time. ``prefix``: default the one
    ``...layers.<layer>.mlp.shared_experts`` of the checkpoint. ``activation``: default the
    ``hidden_act`` of the ``config.json`` beside it. The sink's ``checkpoint`` attribute (a
    ``CheckpointLayer``) says which format, files and activation were read. The other
    arguments as for ``sink_from_transformers``.
    """
    path = as_path("sink_from_checkpoint: path", path)
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise TypeError(f"sink_from_checkpoint: layer must be a layer number (0, 1, ...), got {layer!r}")
    files = _key_files(path)
    found = _find_prefix(files, layer, path.name) if prefix is None else None
    prefix = found[0] if found else prefix
    fmt = found[1] if found else ("published" if f"{prefix}.{PUBLISHED[0]}" in files else "transformers")
    names = PUBLISHED if fmt == "published" else PARAMETERS
    raw: dict[str, torch.Tensor] = {}
    for name in names:
        key = f"{prefix}.{name}"
        if key not in files:
            continue
        try:
            with open_safetensors(files[key]) as f:
                raw[name] = f.get_tensor(key)
        except (SafetensorError, OSError, HeaderError) as exc:
            raise ValueError(f"{files[key].name}: not a readable safetensors file ({exc})") from None
    where = f"{path.name}: {prefix} ({fmt} format)"
    state = _from_published(raw, where) if fmt == "published" else raw
    act, act_from = (activation, "given") if activation is not None else _config_activation(path)
    sink = _build(state, where, interleaved, dtype, cls, act)
    sink.checkpoint = CheckpointLayer(prefix, fmt, tuple(sorted({files[f"{prefix}.{n}"].name for n in raw})), act,
                                      act_from)
    return sink


def _from_published(raw: Mapping[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """``shared_w13_weight [n, 2F, H]`` (rows ``2f`` gate, ``2f+1`` up) and
    ``shared_w2_weight [n, H, F]`` as ``InklingSharedExperts``' three parameters."""
    missing = [p for p in PUBLISHED if p not in raw]
    if missing:
        raise KeyError(f"{where}: no {', '.join(missing)}: the published format has shared_w13_weight [n, 2F, H] "
                       "and shared_w2_weight [n, H, F]")
    w13, w2 = raw[PUBLISHED[0]], raw[PUBLISHED[1]]
    if w13.dim() != 3 or w13.shape[1] % 2:
        raise ValueError(f"{where}: shared_w13_weight is {list(w13.shape)}; the published format has "
                         "[n, 2F, H], gate and up rows interleaved")
    return {"gate_proj": w13[:, 0::2], "up_proj": w13[:, 1::2], "down_proj": w2}


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
                           dtype: torch.dtype = torch.float64, seed: int = 0,
                           lora_options: dict[str, Any] | None = None) -> PeftSinkAdapter:
    """Train-free PEFT ``target_parameters`` export of transformers' own Inkling sink.

    Builds a one-layer model tree (``model.layers.0.mlp.shared_experts``, an
    ``InklingSharedExperts`` of ``n``, ``H=hidden``, ``F=intermediate``), wraps the
    ``targets`` parameters with PEFT LoRA of rank ``rank`` (random A and B, not PEFT's
    zero B, so that the delta shows) and saves it to ``folder`` as PEFT does. Needs
    transformers >= 5.24 and peft >= 0.18. Seeded; runs on a CPU in well under a second.
    ``lora_options``: more ``LoraConfig`` fields (``use_rslora``, ``rank_pattern``,
    ``alpha_pattern`` keyed by parameter name, e.g. ``"mlp.shared_experts.down_proj"``).
    """
    folder = as_path("make_peft_sink_adapter: folder", folder)  # before PEFT builds anything
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
                      target_parameters=[f"mlp.shared_experts.{p}" for p in targets], **(lora_options or {}))
    peft_model = get_peft_model(model, lora)
    with torch.no_grad():  # PEFT's own init is seeded by the global generator: reseed from ours
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=dtype) / p.shape[-1] ** 0.5)
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
