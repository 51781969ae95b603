"""The frozen record a forward backend computes from: weights, layout, pool, derived operands.

``SharedSinkLoRA.operands()`` hands one out; ``forward/`` knows this record and
``SlotBatch`` and nothing else (the arrow runs module -> backends only).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .merged import KeptMerge


@dataclass(frozen=True, eq=False)  # tensors have no single truth value: compare fields yourself
class SinkOperands:
    """What one forward reads, in the reference's symbols (docs/reference.md).

    * ``w13 [n, 2F, H]``, ``w2 [n, H, F]``: the base weights (``w13_lin``/``w2_lin``
      are their linearized views ``[n*2F, H]`` and ``[n*F, H]``, docs/reference.md#the-base-module);
    * ``interleaved``: the gate/up row layout of ``w13``;
    * ``buffers``: the four pool buffers ``gate_up_a [S, O, 2R, H]``,
      ``gate_up_b [S, n, 2F, R]``, ``down_a [S, n, R, F]``, ``down_b [S, O, H, R]``,
      or ``None`` (no pool: the base sink);
    * ``w1_delta [S, n*2F, 2R]`` and ``a_cat [S, R, n*F]`` (shared outer only, else ``None``);
    * ``kept``: the slots whose merged weights the sink keeps (``merged.KeptMerge``), or ``None``.

    The sizes, dtype and device of the weights are read once (every forward asks for
    them, and the record's weight views are its own); the pool's are read each time.
    """

    w13: torch.Tensor
    w2: torch.Tensor
    w13_lin: torch.Tensor
    w2_lin: torch.Tensor
    interleaved: bool
    buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    w1_delta: torch.Tensor | None = None
    a_cat: torch.Tensor | None = None
    kept: "KeptMerge | None" = None

    @cached_property
    def n(self) -> int:
        return self.w13.shape[0]

    @cached_property
    def hidden(self) -> int:
        return self.w13.shape[2]

    @cached_property
    def intermediate(self) -> int:
        return self.w2.shape[2]

    @cached_property
    def dtype(self) -> torch.dtype:
        return self.w13.dtype

    @cached_property
    def device(self) -> torch.device:
        return self.w13.device

    @property
    def has_pool(self) -> bool:
        return self.buffers is not None

    @property
    def slots(self) -> int:
        """``S``, or 0 without a pool."""
        return self.buffers[0].shape[0] if self.buffers is not None else 0

    @property
    def shared_outer(self) -> bool:
        """``O == 1``: one gate-up A and one down B serve every expert."""
        return self.buffers is not None and self.buffers[0].shape[1] == 1

    @property
    def max_rank(self) -> int:
        """``R``, the pool's max rank (``gate_up_b.shape[-1]``), or 0 without a pool."""
        return self.buffers[1].shape[-1] if self.buffers is not None else 0

    @property
    def rank(self) -> int:
        """Another name for ``max_rank`` (the pool's ``R``, not an adapter's ``r``)."""
        return self.max_rank
