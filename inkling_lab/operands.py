"""The frozen records a forward backend computes from: weights, layout, pool, derived operands
(``SinkOperands``), and the merged weights a sink keeps per slot (``KeptMerge``, made by ``merged.py``).

``SharedSinkLoRA.operands()`` hands one out; ``forward/`` knows this record and
``SlotBatch`` and nothing else (the arrow runs module -> backends only).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import cached_property

import torch


@dataclass(frozen=True, eq=False)  # tensors have no single truth value
class KeptMerge:
    """The kept merges of a sink: ``slots`` (ascending) at ``scalings`` (float32 values, one per
    slot), ``w13 [K, n*2F, H]`` (row ``k`` is ``slots[k]``'s, in the rows of ``w13_lin``) and
    ``w2 [K, H, n*F]`` (its ``w2_lin`` transposed: ``F.linear``'s layout, which one token's GEMV streams); ``base`` names the base weights they were made from
    (``SharedSink.linearized``' key: storage and version); ``version``: this record's own number
    (a plan made for one record is never reused for another)."""

    slots: tuple[int, ...]
    scalings: tuple[float, ...]
    w13: torch.Tensor
    w2: torch.Tensor
    base: tuple = field(default=(), compare=False)
    version: int = field(default_factory=itertools.count().__next__, compare=False)

    @property
    def nbytes(self) -> int:
        """The device memory the copies hold."""
        return self.w13.nbytes + self.w2.nbytes

    def rows(self, slots: list[int], scalings: list[float]) -> list[int] | None:
        """The row of each of ``slots`` (ascending) where every one is kept at the given scaling
        (float32 values, as a batch holds them), else ``None``: the forward then takes the LoRA path."""
        index = dict(zip(self.slots, range(len(self.slots))))
        rows = [index.get(s) for s in slots]
        if any(r is None for r in rows) or any(self.scalings[r] != c for r, c in zip(rows, scalings)):
            return None
        return rows


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
    * ``kept``: the slots whose merged weights the sink keeps (``KeptMerge``, made by ``merged.py``), or ``None``;
    * ``w2_cat [n*F + S*R, H]`` (shared outer only, else ``None``): ``w2_lin``'s rows and ``S*R`` more in its
      storage, where a one-slot forward puts the slot's down ``B^T`` (``triton_backend._down_cat``) and a
      several-slot one each used slot's (``triton_backend._down_slot_cats``).

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
    kept: KeptMerge | None = None
    w2_cat: torch.Tensor | None = None

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
