"""PEFT's own delta of an adapter's shared sink, computed by PEFT itself (docs/reference.md#peft-features).

The kit's claims about an adapter ("the pool equals PEFT's math", "this export serves
what was trained") are only worth something when "PEFT's math" is not the kit's own
reading of the config: a reader that gets ``alpha_pattern`` wrong would then agree with
itself. ``peft_reference`` therefore loads the adapter folder **with PEFT** onto a
stand-in of the module it was trained on and takes PEFT's merged weights:

* a PEFT ``target_parameters`` export (``...shared_experts[.base_layer...].lora_A.weight``):
  transformers' own ``InklingSharedExperts`` (``n``, ``H``, ``F``) at the module's path;
* a classic ``target_modules`` folder: a stand-in of plain ``nn.Linear`` modules under
  the adapter's own names, sized for the sink: flat ``gate_proj``/``up_proj``/``w1``/``w3``
  ``H -> n*F`` (experts stacked), ``gate_up_proj`` ``H -> n*2F`` (per-expert blocks
  ``[gate_e ‖ up_e]``, as docs/reference.md#adapters-on-disk reads a fused B), ``down_proj``/``w2`` ``n*F -> H``
  (experts side by side); per-expert ``shared_experts.<e>.<proj>`` ``H -> F`` / ``F -> H``.

PEFT reads ``adapter_config.json`` and ``adapter_model.safetensors`` itself (``LoraConfig.
from_pretrained``, ``load_peft_weights``), builds its layers with its own ``rank_pattern``,
``alpha_pattern``, ``use_rslora`` and key matching, loads the factors (a factor of
another shape is PEFT's own size-mismatch error), and merges (``merge_and_unload``).
The delta is ``merged − base`` in float64, on a zero base (the merged weight is then
PEFT's delta itself, not rounded against a base), or for DoRA, whose merge depends on
the base, on a seeded random one.

Where PEFT (or, for a ``target_parameters`` export, transformers) is not installed, the
delta is the kit's own reading of the factors (``kit_reading``), and the result says so
(``computed_by == "kit"``, ``why``): a caller must print that, never pass it off as PEFT's.

For callers (``compare``, ``export``'s proof)::

    ref = peft_reference("data/adapters/alpha_pattern", n=2, hidden=8, intermediate=6)
    ref.computed_by          # "peft" (or "kit", with ref.why saying why)
    gate, up, down = ref.deltas["base_model.model.model.layers.0.mlp.shared_experts"]
    # gate, up: [n, F, H]; down: [n, H, F]; float64; zeros for a projection not trained

The keys of ``deltas`` are the modules as the kit names them (``FactorName.module``:
the factor key up to ``shared_experts``), the same as ``Adapter.modules``.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from .adapters import CONFIG_FILE, WEIGHTS_FILE, Adapter, FactorName, _NESTED_KEY, load_adapter

Deltas = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""Dense weight deltas per expert, float64: gate ``[n, F, H]``, up ``[n, F, H]``, down ``[n, H, F]``."""

PEFT_PREFIX = "base_model.model."
"""What ``PeftModel`` puts before the wrapped model's own module names in a saved adapter."""


@dataclass(frozen=True)
class ReferenceDeltas:
    """PEFT's per-module merged-weight deltas of one adapter's shared sink.

    ``deltas``: kit module name -> ``(gate [n, F, H], up [n, F, H], down [n, H, F])``,
    float64. ``computed_by``: ``"peft"`` (PEFT loaded and merged the adapter) or
    ``"kit"`` (the kit's own reading, because ``why``).
    """

    deltas: dict[str, Deltas]
    computed_by: str
    why: str = ""

    @property
    def by_peft(self) -> bool:
        return self.computed_by == "peft"

    @property
    def label(self) -> str:
        """How a report names this column: ``PEFT`` or the kit's reading and why."""
        return f"PEFT {_peft_version()} itself (merged weights)" if self.by_peft else f"the kit's reading of the config ({self.why})"


Probes = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""A module's LoRA deltas applied to probe inputs, float64: gate, up ``[n, F, k]`` (of
``x [H, k]``), down ``[n, H, k]`` (expert e's delta of ``u[e]``, ``u [n, F, k]``)."""


@dataclass(frozen=True)
class ReferenceProbes(ReferenceDeltas):
    """``peft_probes``' result: as ``ReferenceDeltas``, but ``deltas`` holds each module's
    ``Probes``, never a dense delta."""

    @property
    def label(self) -> str:
        return (f"PEFT {_peft_version()} itself (its LoRA layers)" if self.by_peft
                else f"the kit's reading of the config ({self.why})")


def _peft_version() -> str:
    from importlib.metadata import version

    return version("peft")


class PeftRefused(ValueError):
    """PEFT itself cannot load the adapter onto the sink of the given sizes (its own
    error is the message: a factor of another shape, a config it rejects, ...)."""


def peft_reference(source: str | os.PathLike[str] | Adapter, n: int, hidden: int, intermediate: int, *,
                   hidden_act: str = "silu", seed: int = 0) -> ReferenceDeltas:
    """PEFT's merged-weight delta of each shared-sink module of ``source``.

    ``source``: an adapter folder (PEFT reads it), or an ``Adapter`` (a folder it was
    read from is used when it still has its files; else PEFT gets the ``Adapter``'s
    config and factors). ``n``, ``hidden``, ``intermediate``: the sink (``n`` experts,
    ``H``, ``F``). ``hidden_act``: the activation of transformers' module for a
    ``target_parameters`` export (no effect on a weight delta; the module needs one).
    ``seed``: the random base of a DoRA adapter (other adapters merge onto zeros).

    Raises ``PeftRefused`` (PEFT's own error inside) when PEFT cannot load it on that
    sink, ``ValueError``/``OSError`` when the kit cannot read it and PEFT is absent.
    Never unpickles: a folder without ``adapter_model.safetensors`` is refused.
    """
    folder = _folder_of(source)
    missing = _missing_peers(folder, source)
    if missing:
        adapter = source if isinstance(source, Adapter) else load_adapter(folder)
        return ReferenceDeltas({m: kit_reading(adapter, m, n) for m in adapter.modules}, "kit", missing)
    config, state = _read_by_peft(folder, source)
    return _merged_deltas(config, state, n, hidden, intermediate, hidden_act, seed,
                          folder.name if folder is not None else source.name)


def peft_probes(source: str | os.PathLike[str] | Adapter, n: int, hidden: int, intermediate: int,
                x: torch.Tensor, u: torch.Tensor, *, hidden_act: str = "silu") -> "ReferenceProbes":
    """PEFT's LoRA delta of each shared-sink module of ``source`` applied to probe inputs,
    computed by PEFT's own layers, never formed as a dense ``[n*2F, H]`` matrix of a
    classic adapter: ``x [H, k]`` through each gate/up layer, ``u [n, F, k]`` (expert e's
    inputs ``u[e]``) through each down layer, float64.

    PEFT builds its ``lora.Linear`` layers on stand-ins of no storage (``_ZeroLinear``:
    the output is PEFT's forward minus a zero base, i.e. ``lora_B(lora_A(x)) * scaling``
    with PEFT's own scaling, patterns and key matching); a ``target_parameters`` export's
    3D parameters go through PEFT's ``ParamWrapper.get_delta_weight``, one parameter at a
    time (PEFT forms that delta itself). Where PEFT is absent, the kit's reading
    (``kit_reading``), applied to the same probes, and the result says so. Arguments and
    errors as for ``peft_reference``."""
    folder = _folder_of(source)
    missing = _missing_peers(folder, source)
    if missing:
        adapter = source if isinstance(source, Adapter) else load_adapter(folder)
        return ReferenceProbes({m: probe(kit_reading(adapter, m, n), x, u) for m in adapter.modules}, "kit", missing)
    config, state = _read_by_peft(folder, source)
    where = folder.name if folder is not None else source.name
    if getattr(config, "use_dora", False):  # DoRA's delta depends on the base weight, which the stand-ins lack
        raise PeftRefused(f"{where}: a DoRA adapter's delta depends on the base weight: peft_reference computes it")
    root, kinds = _build_standin(state, n, hidden, intermediate, hidden_act, None, probe=True)
    if not kinds:
        raise PeftRefused(f"{where}: no shared-sink factors for PEFT to load")
    model = _peft_model(config, root, state, n, hidden, intermediate, where)
    with torch.no_grad():
        return ReferenceProbes({m: _probe_module(model, m, kind, n, hidden, intermediate, x, u)
                                for m, kind in kinds.items()}, "peft")


def probe(deltas: Deltas, x: torch.Tensor, u: torch.Tensor) -> Probes:
    """Dense per-expert deltas applied to the probes: gate, up ``[n, F, H] @ x [H, k]``,
    down ``[n, H, F] @ u [n, F, k]``."""
    gate, up, down = deltas
    return gate @ x, up @ x, down @ u


def _probe_module(model: Any, module: str, kind: str, n: int, H: int, F: int, x: torch.Tensor,
                  u: torch.Tensor) -> Probes:
    """One sink module's PEFT layers on the probes (``peft_probes``), layer by layer."""
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import ParamWrapper

    k = x.shape[1]
    gate, up = torch.zeros(n, F, k, dtype=torch.float64), torch.zeros(n, F, k, dtype=torch.float64)
    down = torch.zeros(n, H, k, dtype=torch.float64)
    path = PEFT_PREFIX + module.removeprefix(PEFT_PREFIX)
    for name, layer in model.named_modules():
        if name != path and not name.startswith(path + "."):
            continue
        if kind == "params" and isinstance(layer, ParamWrapper):  # [n, F, H] or [n, H, F]: PEFT's own delta
            delta = layer.get_delta_weight(model.active_adapter).double()
            if layer.parameter_name == "down_proj":
                down += delta @ u
            else:
                (gate if layer.parameter_name == "gate_proj" else up).add_(delta @ x)
            del delta  # one parameter's delta at a time
        elif kind == "linear" and isinstance(layer, LoraLinear):
            *expert, proj = name[len(path) + 1:].split(".")
            downs = proj in ("down_proj", "w2")
            if expert:  # one expert's H -> F (2F fused) or F -> H
                e = int(expert[0])
                y = layer(u[e].T).T if downs else layer(x.T).T
                if downs:
                    down[e] += y
                elif proj == "gate_up_proj":
                    gate[e] += y[:F]
                    up[e] += y[F:]
                else:
                    (gate if proj in ("gate_proj", "w1") else up)[e] += y
            elif downs:  # n*F -> H, experts side by side: one expert's block of the input at a time
                for e in range(n):
                    inp = torch.zeros(k, n * F, dtype=torch.float64)
                    inp[:, e * F:(e + 1) * F] = u[e].T
                    down[e] += layer(inp).T
            elif proj == "gate_up_proj":  # H -> n*2F, per expert [gate_e ‖ up_e]
                y = layer(x.T).T.reshape(n, 2 * F, k)
                gate += y[:, :F]
                up += y[:, F:]
            else:  # H -> n*F, experts stacked
                (gate if proj in ("gate_proj", "w1") else up).add_(layer(x.T).T.reshape(n, F, k))
    return gate, up, down


def _read_by_peft(folder: Path | None, source: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """The config and tensors as PEFT reads them from ``folder`` (or an ``Adapter``'s own)."""
    from peft import LoraConfig

    if folder is None:
        return LoraConfig(**_known_fields(LoraConfig, source.config)), dict(source.weights)
    from peft.utils import load_peft_weights

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PEFT's notes on fields it ignores: its math is what counts
            return LoraConfig.from_pretrained(str(folder)), load_peft_weights(str(folder), device="cpu")
    except Exception as exc:  # noqa: BLE001 - PEFT's own refusal, whatever its type, is the answer
        raise PeftRefused(f"PEFT cannot read {folder.name}: {_said(exc)}") from exc


def _said(exc: BaseException) -> str:
    """PEFT's (or torch's) error in one line: a ``load_state_dict`` report by its first
    mismatch, without the ``default`` adapter name PEFT inserts."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if lines and lines[0].startswith("Error(s) in loading state_dict") and len(lines) > 1:
        lines = lines[1:]
    return f"{type(exc).__name__}: {(lines or [''])[0].replace('.default.', '.')}"


def _folder_of(source: Any) -> Path | None:
    """The folder PEFT should read: the one given, or the one an ``Adapter`` came from
    while its files are still there (a target_parameters export must be read from its file:
    the kit renames its factors)."""
    if not isinstance(source, Adapter):
        p = Path(source)
        p = p.parent if p.name in (CONFIG_FILE, WEIGHTS_FILE) else p
        if not (p / WEIGHTS_FILE).is_file():
            load_adapter(p)  # the kit's own error for this folder (no config, no safetensors, .bin only)
        return p
    p = Path(source.source) if source.source else None
    return p if p is not None and (p / CONFIG_FILE).is_file() and (p / WEIGHTS_FILE).is_file() else None


def _missing_peers(folder: Path | None, source: Any) -> str:
    """Why PEFT cannot compute it here (empty: it can)."""
    try:
        import peft  # noqa: F401
    except ImportError:
        return "PEFT is not installed"
    if folder is None and isinstance(source, Adapter) and source.target_parameter_keys:
        return "an in-memory target_parameters export: PEFT needs its folder"
    if folder is not None and _is_target_parameters(folder):
        try:
            from transformers.models.inkling.modeling_inkling import InklingSharedExperts  # noqa: F401
        except ImportError:
            return "transformers (>= 5.24, with Inkling) is not installed"
    return ""


def _is_target_parameters(folder: Path) -> bool:
    from safetensors import SafetensorError

    from .adapters import open_safetensors

    try:
        with open_safetensors(folder / WEIGHTS_FILE) as f:
            return any(_NESTED_KEY.match(k) for k in f.keys())
    except (SafetensorError, OSError):
        return False  # unreadable: PEFT's own reader says so next


def _known_fields(cls: Any, config: Mapping[str, Any]) -> dict[str, Any]:
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in config.items() if k in names and k != "task_type"}


def _sink_modules(state: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """Each shared-sink module of a saved adapter: kit module name -> ``"params"`` (a
    target_parameters export) or ``"linear"`` (classic factors)."""
    out: dict[str, str] = {}
    for key in state:
        m = _NESTED_KEY.match(key)
        if m is not None:
            out[m["module"]] = "params"
        elif (fn := FactorName.parse(key)) is not None:
            out.setdefault(fn.module, "linear")
    return out


def _place(root: torch.nn.Module, dotted: str, module: torch.nn.Module) -> None:
    """Put ``module`` at ``dotted`` under ``root``, making plain containers on the way."""
    *path, last = dotted.split(".")
    node = root
    for part in path:
        if not hasattr(node, part):
            node.add_module(part, torch.nn.Module())
        node = getattr(node, part)
    node.add_module(last, module)


def _linear_shape(proj: str, per_expert: bool, n: int, H: int, F: int) -> tuple[int, int]:
    """``(in, out)`` of the stand-in ``nn.Linear`` for one projection's factors."""
    k = 1 if per_expert else n
    if proj in ("down_proj", "w2"):
        return k * F, H
    return H, k * (2 * F if proj == "gate_up_proj" else F)


class _ZeroLinear(torch.nn.Linear):
    """A stand-in ``nn.Linear`` (PEFT wraps it as its own ``lora.Linear``) of no storage:
    its weight is one zero expanded to ``[out, in]`` and its output is zero, so PEFT's
    layer output on it is PEFT's LoRA delta applied to the input, and nothing of the
    module's dense size is ever allocated."""

    def __init__(self, fan_in: int, fan_out: int) -> None:
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = fan_in, fan_out
        self.weight = torch.nn.Parameter(_no_storage(fan_out, fan_in), requires_grad=False)
        self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(*x.shape[:-1], self.out_features)


def _no_storage(*shape: int) -> torch.Tensor:
    """A float64 zero of ``shape`` that holds one element (a stride-0 view)."""
    return torch.zeros((), dtype=torch.float64).expand(*shape)


def _build_standin(state: Mapping[str, torch.Tensor], n: int, H: int, F: int, hidden_act: str,
                   gen: torch.Generator | None, probe: bool = False) -> tuple[torch.nn.Module, dict[str, str]]:
    """The model PEFT loads the adapter onto: only the sink modules, at the adapter's own
    paths; their weights zero, or seeded random from ``gen``; with ``probe``, zeros of
    no storage (``_ZeroLinear``, and expanded zeros for transformers' 3D parameters)."""
    root = torch.nn.Module()
    kinds = _sink_modules(state)
    def rnd(*shape: int) -> torch.Tensor:
        if gen is None:
            return torch.zeros(shape, dtype=torch.float64)
        return torch.randn(shape, generator=gen, dtype=torch.float64) / shape[-1] ** 0.5
    made: set[str] = set()
    for module, kind in kinds.items():
        path = module.removeprefix(PEFT_PREFIX)
        if kind == "params":
            from transformers import InklingTextConfig
            from transformers.models.inkling.modeling_inkling import InklingSharedExperts

            text = InklingTextConfig(hidden_size=H, moe_intermediate_size=F, n_shared_experts=n, hidden_act=hidden_act)
            if probe:  # the 3D parameters as zeros of no storage: PEFT's delta alone is computed from them
                with torch.device("meta"):
                    experts = InklingSharedExperts(text)
                for p in ("gate_proj", "up_proj", "down_proj"):
                    setattr(experts, p, torch.nn.Parameter(_no_storage(*getattr(experts, p).shape),
                                                           requires_grad=False))
            else:
                experts = InklingSharedExperts(text).double()
                with torch.no_grad():
                    for p in ("gate_proj", "up_proj", "down_proj"):
                        getattr(experts, p).copy_(rnd(*getattr(experts, p).shape))
            _place(root, path, experts)
            continue
        for key in state:
            fn = FactorName.parse(key)
            if fn is None or fn.module != module:
                continue
            name = f"{path}.{fn.expert}.{fn.proj}" if fn.expert is not None else f"{path}.{fn.proj}"
            if name in made:
                continue
            made.add(name)
            if fn.expert is not None and fn.expert >= n:
                raise PeftRefused(f"{key}: expert {fn.expert} has no place on a sink of n={n} shared experts")
            fan_in, fan_out = _linear_shape(fn.proj, fn.expert is not None, n, H, F)
            if probe:
                _place(root, name, _ZeroLinear(fan_in, fan_out))
                continue
            linear = torch.nn.Linear(fan_in, fan_out, bias=False, dtype=torch.float64)
            with torch.no_grad():
                linear.weight.copy_(rnd(fan_out, fan_in))
            _place(root, name, linear)
    return root, kinds


def _peft_model(config: Any, root: torch.nn.Module, state: Mapping[str, torch.Tensor], n: int, H: int, F: int,
                where: str) -> Any:
    """PEFT's own model of the adapter on the stand-in ``root`` (``_build_standin``), its
    factors loaded by PEFT (``set_peft_model_state_dict``), every key checked to have landed."""
    import copy

    from peft import PeftModel
    from peft.utils import set_peft_model_state_dict

    config = copy.copy(config)
    config.task_type = None  # a bare module tree, not a transformers model: PeftModel itself
    config.inference_mode = True
    sink = {k: v for k, v in state.items() if "shared_experts" in k}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PEFT warns of target modules the stand-in does not have
            model = PeftModel(root, config)
            model.double()
            model.eval()  # no dropout: the delta, not a training step
            result = set_peft_model_state_dict(model, sink)
            _check_loaded(result, where)
    except PeftRefused:
        raise
    except Exception as exc:  # noqa: BLE001 - PEFT's own refusal, whatever its type, is the answer
        raise PeftRefused(f"PEFT cannot load {where} onto a sink of n={n}, H={H}, F={F}: {_said(exc)}") from exc
    return model


def _merged_deltas(config: Any, state: Mapping[str, torch.Tensor], n: int, H: int, F: int, hidden_act: str,
                   seed: int, where: str) -> ReferenceDeltas:
    gen = torch.Generator().manual_seed(seed) if getattr(config, "use_dora", False) else None
    root, kinds = _build_standin(state, n, H, F, hidden_act, gen)
    if not kinds:
        raise PeftRefused(f"{where}: no shared-sink factors for PEFT to load")
    base = {name: p.detach().clone() for name, p in root.named_parameters()}
    model = _peft_model(config, root, state, n, H, F, where)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            merged = model.merge_and_unload()
    except Exception as exc:  # noqa: BLE001 - PEFT's own refusal, whatever its type, is the answer
        raise PeftRefused(f"PEFT cannot merge {where} on a sink of n={n}, H={H}, F={F}: {_said(exc)}") from exc
    after = {name: p.detach().double() for name, p in merged.named_parameters()}
    out: dict[str, Deltas] = {}
    for module, kind in kinds.items():
        path = module.removeprefix(PEFT_PREFIX)
        delta = {name[len(path) + 1:]: after[name] - base[name] for name in base if name.startswith(path + ".")}
        out[module] = _per_expert(delta, kind, n, H, F)
    return ReferenceDeltas(out, "peft")


def _check_loaded(result: Any, where: str) -> None:
    """Every sink key of the file went into a PEFT layer and every LoRA layer PEFT made got
    its weights: else a delta would be silently zero."""
    unexpected = [k for k in result.unexpected_keys if "shared_experts" in k]
    missing = [k for k in result.missing_keys if "lora_" in k]
    if unexpected or missing:
        raise PeftRefused(f"PEFT cannot load {where}: " + "; ".join(
            part for part in (f"keys PEFT puts nowhere: {unexpected[:4]}" if unexpected else "",
                              f"LoRA weights PEFT made but the file lacks: {missing[:4]}" if missing else "") if part))


def _per_expert(delta: Mapping[str, torch.Tensor], kind: str, n: int, H: int, F: int) -> Deltas:
    """The stand-in's weight deltas (by name under the sink module) as per-expert
    gate ``[n, F, H]``, up ``[n, F, H]``, down ``[n, H, F]``."""
    z = torch.zeros
    gate, up, down = (z(n, F, H, dtype=torch.float64), z(n, F, H, dtype=torch.float64),
                      z(n, H, F, dtype=torch.float64))
    if kind == "params":
        return (gate + delta["gate_proj"], up + delta["up_proj"], down + delta["down_proj"])
    for name, d in delta.items():
        *expert, proj = name.removesuffix(".weight").split(".")
        if expert:  # per expert: [F, H] (gate/up), [2F, H] (fused), [H, F] (down)
            e = int(expert[0])
            parts = {"gate_up_proj": ((gate, d[:F]), (up, d[F:])), "down_proj": ((down, d),), "w2": ((down, d),)}
            for target, block in parts.get(proj, (((gate if proj in ("gate_proj", "w1") else up), d),)):
                target[e] += block
        elif proj in ("down_proj", "w2"):  # [H, n*F], experts side by side
            down += d.reshape(H, n, F).transpose(0, 1)
        elif proj == "gate_up_proj":  # [n*2F, H], per expert [gate_e ‖ up_e]
            blocks = d.reshape(n, 2 * F, H)
            gate += blocks[:, :F]
            up += blocks[:, F:]
        else:  # [n*F, H], experts stacked
            (gate if proj in ("gate_proj", "w1") else up).add_(d.reshape(n, F, H))
    return gate, up, down


def kit_reading(adapter: Adapter, module: str, n: int) -> Deltas:
    """The kit's own reading of PEFT's math for one sink module (the fallback where PEFT
    is absent): each projection's ``scaling * B @ A`` with the kit's per-projection
    scalings (``Adapter.projection_scalings``); flat gate/up B ``[n*F, r]`` stacked by
    expert, fused ``[n*2F, r]`` as per-expert gate/up blocks, down A ``[r, n*F]`` side by
    side; per-expert factors expert by expert. No normalization and no pool."""
    s = adapter.projection_scalings(module, n)
    out: dict[str, list[torch.Tensor | None]] = {"gate": [None] * n, "up": [None] * n, "down": [None] * n}
    for key in adapter.factor_keys:
        fn = FactorName.parse(key)
        if fn.module != module or fn.ab != "A":
            continue
        a = adapter.weights[key].double()
        b = adapter.weights[fn.with_(ab="B").key].double()
        if not a.numel() or not b.numel():
            continue
        experts = range(n) if fn.expert is None else [fn.expert]
        for e in experts:
            if fn.canonical == "down_proj":
                cols = a if fn.expert is not None else a.reshape(a.shape[0], n, -1)[:, e]
                out["down"][e] = s["down"][e] * b @ cols
            else:
                rows = b if fn.expert is not None else b.reshape(n, -1, b.shape[1])[e]
                parts = (("gate", rows[: rows.shape[0] // 2]), ("up", rows[rows.shape[0] // 2:])) \
                    if fn.canonical == "gate_up_proj" else ((fn.canonical.removesuffix("_proj"), rows),)
                for part, block in parts:
                    out[part][e] = s[part][e] * block @ a
    # a projection the adapter does not train adds nothing: zeros of the trained ones' F and H
    some = next(d if part != "down" else d.T for part, ds in out.items() for d in ds if d is not None)
    F, H = some.shape
    zero = {"gate": (F, H), "up": (F, H), "down": (H, F)}
    return tuple(torch.stack([d if d is not None else torch.zeros(zero[p], dtype=torch.float64) for d in out[p]])
                 for p in ("gate", "up", "down"))  # type: ignore[return-value]
