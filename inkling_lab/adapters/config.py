"""``adapter_config.json`` read as PEFT reads it: ``PeftConfig`` (ranks, alphas and their patterns, the fields that
decide the math) and the refusals of what a LoRA pool cannot hold."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..catalog import error
from .names import CONFIG_FILE


BASE_CHANGING_INITS = ("pissa", "olora", "corda", "loftq")
"""``init_lora_weights`` values with which PEFT changes the base weights too (the saved
adapter then means "this delta on that residual base") unless the adapter was converted
to plain LoRA when saved."""


def _pattern_key(patterns: Mapping[str, Any], module: str) -> str | None:
    # PEFT's own rule (peft.utils.other.get_pattern_key): the first key that matches the
    # module name's end, at a dot boundary.
    for key in patterns:
        if re.match(rf"(.*\.)?({key})$", module):
            return key
    return None


@dataclass(frozen=True)
class PeftConfig:
    """The fields of a PEFT ``LoraConfig`` that decide what an adapter computes.

    ``rank_of``/``alpha_of``/``scaling_of`` take a module name
    (``...mlp.shared_experts.gate_proj``) and apply ``rank_pattern`` and
    ``alpha_pattern`` by PEFT's matching rule; ``scaling_of`` is PEFT's
    ``alpha / r`` (``alpha / sqrt(r)`` with ``use_rslora``) for that module.
    """

    r: int
    lora_alpha: float
    target_modules: Any = None
    use_rslora: bool = False
    alpha_pattern: Mapping[str, float] = field(default_factory=dict)
    rank_pattern: Mapping[str, int] = field(default_factory=dict)
    use_dora: bool = False
    lora_bias: bool = False
    init_lora_weights: Any = True
    peft_type: str = "LORA"
    modules_to_save: tuple[str, ...] = ()
    fan_in_fan_out: bool = False

    def rank_of(self, module: str) -> int:
        key = _pattern_key(self.rank_pattern, module)
        return int(self.rank_pattern[key]) if key is not None else self.r

    def alpha_of(self, module: str) -> float:
        key = _pattern_key(self.alpha_pattern, module)
        return float(self.alpha_pattern[key]) if key is not None else self.lora_alpha

    def scaling_of(self, module: str) -> float:
        r = self.rank_of(module)
        return self.alpha_of(module) / (math.sqrt(r) if self.use_rslora else r)

    @property
    def base_changing_init(self) -> str | None:
        """``pissa``, ``olora``, ``corda`` or ``loftq`` (``pissa_niter_4`` reads as pissa), else None."""
        init = self.init_lora_weights
        if isinstance(init, str):
            return next((k for k in BASE_CHANGING_INITS if init.lower().startswith(k)), None)
        return None


def read_peft_config(config: Mapping[str, Any], where: str = CONFIG_FILE) -> PeftConfig:
    """Read and check a PEFT adapter config (``adapter_config.json`` as a dict).

    Raises ``ISL-K202`` for a malformed field and ``ISL-K301`` for a ``lora_alpha``
    (or ``alpha_pattern`` value) that is not a finite number (JSON's ``NaN``,
    ``Infinity``, or ``1e400``, which reads as infinity).
    """
    def bad(detail: str) -> ValueError:
        return ValueError(f"{where}: malformed adapter config: {detail}")

    def number(value: Any, what: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad(f'{what} must be a number, got {value!r}')
        if not math.isfinite(value):
            raise error("ISL-K301", file=where, field=what, value=repr(value))
        return float(value)

    def rank(value: Any, what: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad(f'{what} must be a positive integer, got {value!r}')
        return value

    def mapping(value: Any, what: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise bad(f"{what} must be an object (module pattern -> value), got {value!r}")
        return dict(value)

    if not isinstance(config, Mapping):
        raise bad(f"expected a JSON object, got {type(config).__name__}")
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise bad(f"peft_type is {config['peft_type']!r}; only LoRA adapters have shared-sink factors")
    if config.get("r") is None:
        raise bad('no "r" (the LoRA rank), e.g. "r": 8')
    r = rank(config["r"], '"r"')
    alpha = number(config.get("lora_alpha", 8), '"lora_alpha"')  # PEFT's default
    ranks = {k: rank(v, f'rank_pattern[{k!r}]') for k, v in mapping(config.get("rank_pattern"), "rank_pattern").items()}
    alphas = {k: number(v, f'alpha_pattern[{k!r}]')
              for k, v in mapping(config.get("alpha_pattern"), "alpha_pattern").items()}
    saved = config.get("modules_to_save") or ()
    for what, value in (("target_modules", config.get("target_modules")), ("modules_to_save", saved)):
        if not (value is None or isinstance(value, str)
                or isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
            raise bad(f"{what} must be a module name or a list of them, got {value!r}")
    return PeftConfig(
        r=r, lora_alpha=alpha, target_modules=config.get("target_modules"),
        use_rslora=bool(config.get("use_rslora")), alpha_pattern=alphas, rank_pattern=ranks,
        use_dora=bool(config.get("use_dora")), lora_bias=bool(config.get("lora_bias")),
        init_lora_weights=config.get("init_lora_weights", True), peft_type=peft_type,
        modules_to_save=(saved,) if isinstance(saved, str) else tuple(saved),
        fan_in_fan_out=bool(config.get("fan_in_fan_out")))


def _read_config(config: Mapping[str, Any], where: str) -> tuple[int, float, Any]:
    peft = read_peft_config(config, where)
    return peft.r, peft.lora_alpha, peft.target_modules


def _refuse_unrepresentable(peft: PeftConfig, where: str) -> None:
    """What a LoRA pool cannot hold, refused with the reason and the way out."""
    if peft.use_dora:
        raise error("ISL-K303", file=where)
    if peft.lora_bias:
        raise error("ISL-K304", file=where)
    init = peft.base_changing_init
    if init is not None:
        raise error("ISL-K305", file=where, init=repr(peft.init_lora_weights), method=init, way_out=(
            "serve it on the LoftQ-quantized base it was made with, or merge it" if init == "loftq" else
            "convert it to plain LoRA when saving (PEFT save_pretrained(..., "
            "path_initial_model_for_weight_conversion=<the initial adapter>)) and use that folder"))
