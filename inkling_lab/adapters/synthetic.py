"""Seeded synthetic adapters in the three namings of the sink's projections."""
from __future__ import annotations

import torch

from .names import FactorName
from .adapter import Adapter


NAMINGS = {
    "gate_up": ("gate_proj", "up_proj", "down_proj"),
    "fused": ("gate_up_proj", None, "down_proj"),
    "w": ("w1", "w3", "w2"),
}
"""The three ways to name the sink's projections (docs/reference.md#adapters-on-disk): gate and up apart,
fused, or ``w1``/``w3``/``w2``."""


def synthetic_adapter(n: int, hidden: int, intermediate: int, rank: int, *, naming: str = "gate_up",
                      per_expert: bool = False, lora_alpha: float | None = None, layers: tuple[int, ...] = (0,),
                      seed: int = 0, dtype: torch.dtype = torch.float32, name: str = "") -> Adapter:
    """A seeded PEFT adapter for an ``n``-expert sink of ``H=hidden``, ``F=intermediate``.

    ``naming``: ``"gate_up"``, ``"fused"`` or ``"w"`` (``NAMINGS``). ``per_expert``:
    every factor named per expert (``shared_experts.<e>.<proj>``, the per-expert
    outer layout) instead of flat (shared outer). B is not zero (unlike at PEFT's
    init), so that the delta is visible.
    """
    if naming not in NAMINGS:
        raise ValueError(f"naming must be one of {sorted(NAMINGS)}, got {naming!r}")
    gen = torch.Generator().manual_seed(seed)
    gate, up, down = NAMINGS[naming]
    fused = up is None

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=gen) / max(shape[-1], 1) ** 0.5).to(dtype)

    experts = range(n) if per_expert else [None]
    k = 1 if per_expert else n  # experts inside one flat inner factor
    weights: dict[str, torch.Tensor] = {}
    for layer in layers:
        module = f"base_model.model.model.layers.{layer}.mlp.shared_experts"
        for e in experts:
            def put(proj: str, a: torch.Tensor, b: torch.Tensor) -> None:
                weights[FactorName(module, e, proj, "A").key] = a
                weights[FactorName(module, e, proj, "B").key] = b

            rows = 2 * intermediate if fused else intermediate
            put(gate, rnd(rank, hidden), rnd(k * rows, rank))
            if not fused:
                put(up, rnd(rank, hidden), rnd(k * intermediate, rank))
            put(down, rnd(rank, k * intermediate), rnd(hidden, rank))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "inkling-toy",
              "r": rank, "lora_alpha": float(2 * rank if lora_alpha is None else lora_alpha),
              "lora_dropout": 0.0, "bias": "none", "use_rslora": False,
              "target_modules": [p for p in (gate, up, down) if p is not None]}
    return Adapter.from_state(config, weights, name=name or f"{naming}{'_per_expert' if per_expert else ''}")
