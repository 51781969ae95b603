"""One forward's worth of seeded inputs: a sink with a loaded pool, tokens and their batch.

``Scenario.random(geometry, seed=...)`` is the one factory the tests, the notebooks and
the profiler build random cases with, so that "a random sink of this geometry" means
the same thing everywhere.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Sequence

import torch

from .batch import SlotBatch
from .geometry import Geometry, allocate, check_size
from .lora import SharedSinkLoRA
from .operands import SinkOperands
from .pool import LoRAFactors, LoRAPool


def _is_rank(value: object, max_rank: int) -> bool:
    """``value`` is a whole number (not a bool) in ``0..max_rank``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and 0 <= value <= max_rank


@dataclass
class Scenario:
    """A sink of ``geometry`` whose pool is set (``sink.set_lora_info(*pool.buffers())``),
    ``x [T, H]``, ``gammas [T, n]`` and the ``SlotBatch`` naming each token's slot."""

    geometry: Geometry
    sink: SharedSinkLoRA
    pool: LoRAPool
    x: torch.Tensor
    gammas: torch.Tensor
    batch: SlotBatch

    @classmethod
    def random(cls, geometry: Geometry, *, tokens: int = 8, seed: int = 0, dtype: torch.dtype = torch.float32,
               device: torch.device | str | None = None, interleaved: bool = True,
               adapters: Sequence[int | LoRAFactors] | None = None, names: Sequence[str | None] | None = None,
               token_slots: Sequence[int] | torch.Tensor | None = None, group: bool = False,
               sink: SharedSinkLoRA | None = None) -> "Scenario":
        """Seeded random weights; slot ``s`` holds ``adapters[s]``: a rank (a random adapter
        of that rank drawn by ``LoRAFactors.random`` in the geometry's outer layout, scaling
        ``lora_alpha / r = 1``; ``0``: the slot stays empty) or ``LoRAFactors`` to load as
        they are (default: a random adapter at the pool's ``R`` in every slot); ``names[s]``
        names slot ``s``'s adapter (default: the factors' own name, ``adapter{s}`` for a
        random one). ``x`` unit-normal, ``gammas`` in ``(0, 1)``; each token's slot
        ``token_slots[t]`` (default: drawn from ``-1..S-1``, ``-1`` meaning base only).
        ``group=True`` sorts the batch by slot. Everything lives on ``device`` in ``dtype``;
        the same seed gives the same scenario, and the sink's weights, ``x`` and ``gammas``
        do not depend on the adapters (two scenarios of one seed differ only in their pool).
        ``sink``: a sink of the geometry's ``n``, ``H``, ``F`` in this layout and dtype to
        reuse: its base weights (and activation) are kept and its pool replaced
        (``clear_pool``), so that a grid of pools over one shape draws the weights once.
        """
        g = geometry
        if not isinstance(g, Geometry):
            raise TypeError(f"Scenario.random: geometry must be a Geometry (il.PRESETS['toy'], say), got {g!r}")
        check_size("Scenario.random: tokens", tokens)
        adapters = [g.max_rank] * g.slots if adapters is None else list(adapters)
        if len(adapters) != g.slots or not all(isinstance(a, LoRAFactors) or _is_rank(a, g.max_rank)
                                               for a in adapters):
            shown = [f"LoRAFactors(r={a.rank})" if isinstance(a, LoRAFactors) else a for a in adapters]
            raise ValueError(f"Scenario.random: adapters must give each of the {g.slots} slots a rank in "
                             f"0..{g.max_rank} (the pool's max_rank) or LoRAFactors, got {shown}")
        names = [None] * g.slots if names is None else list(names)
        if len(names) != g.slots:
            raise ValueError(f"Scenario.random: names must name each of the {g.slots} slots' adapter "
                             f"(None: the default), got {len(names)} names")
        if sink is None:
            sink = SharedSinkLoRA.from_geometry(g, interleaved, dtype, device, seed)
        elif not isinstance(sink, SharedSinkLoRA):
            raise TypeError(f"Scenario.random: sink must be a SharedSinkLoRA to reuse (or None), got "
                            f"{type(sink).__name__}")
        else:
            have = (sink.n_shared_experts, sink.hidden_size, sink.intermediate_size, sink.interleaved, sink.dtype)
            if have != (g.n, g.hidden, g.intermediate, interleaved, dtype):
                raise ValueError(f"Scenario.random: the sink to reuse has (n, H, F, interleaved, dtype) {have}, "
                                 f"the scenario wants {(g.n, g.hidden, g.intermediate, interleaved, dtype)}")
            sink.clear_pool()
        pool = LoRAPool.from_geometry(g, dtype, device)
        for s, (a, name) in enumerate(zip(adapters, names)):
            if isinstance(a, LoRAFactors):
                pool.load(s, a, name=name)
            elif a:
                pool.load(s, LoRAFactors.random(g.n, g.hidden, g.intermediate, rank=a, outer=g.outer,
                                                seed=seed + 1 + s, dtype=dtype, name=name or f"adapter{s}"))
        sink.set_lora_info(*pool.buffers())
        gen = torch.Generator().manual_seed(seed)
        x = allocate((tokens, g.hidden), "Scenario.random: x [T, H]", dtype, device, "randn", gen)
        gammas = allocate((tokens, g.n), "Scenario.random: gammas [T, n]", dtype, device, "rand", gen)
        if token_slots is None:
            token_slots = torch.randint(-1, g.slots, (tokens,), generator=gen)
        elif len(token_slots) != tokens:
            raise ValueError(f"Scenario.random: token_slots names {len(token_slots)} tokens but tokens={tokens}")
        batch = SlotBatch.from_token_slots(token_slots, g.slots, lora_ranks=pool.lora_ranks, group=group)
        return cls(g, sink, pool, x, gammas, batch)

    def operands(self) -> SinkOperands:
        """The sink's operands, what a backend reads."""
        return self.sink.operands()

    def forward(self, backend: str = "auto") -> torch.Tensor:
        """``sink(x, gammas, batch=batch, backend=backend)``: ``out [T, H]``."""
        return self.sink(self.x, self.gammas, batch=self.batch, backend=backend)
