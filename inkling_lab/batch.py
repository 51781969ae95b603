"""A batch of tokens in contiguous segments, each naming one slot or none (SPEC §5)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


def _as_long(values: Sequence[int] | torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.long).flatten().cpu()


@dataclass(frozen=True)
class SlotBatch:
    """Segments of tokens and the slot each one uses.

    ``seg_indptr [G+1]``: segment ``g`` is tokens ``seg_indptr[g]..seg_indptr[g+1]-1``
    (of the permuted order when ``permutation`` is set); ``weight_indices [G]``: its
    slot, ``-1`` for base only; ``lora_ranks [S]`` and ``scalings [S]`` per slot (the
    pool folds ``lora_alpha / r`` into B, so scalings are 1 unless told otherwise);
    ``max_len``: the longest segment; ``permutation [T]``: position ``i`` of the
    grouped order holds token ``permutation[i]``.
    """

    seg_indptr: torch.Tensor
    weight_indices: torch.Tensor
    lora_ranks: torch.Tensor
    scalings: torch.Tensor
    max_len: int
    num_slots: int
    permutation: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.seg_indptr[-1])

    @property
    def num_segments(self) -> int:
        return int(self.weight_indices.numel())

    @classmethod
    def from_segments(cls, lengths: Sequence[int], slots: Sequence[int], num_slots: int,
                      lora_ranks: Sequence[int] | None = None, scalings: Sequence[float] | None = None
                      ) -> "SlotBatch":
        """Segments given directly: ``lengths[g]`` tokens use slot ``slots[g]`` (``-1``: none)."""
        lengths_t, slots_t = _as_long(lengths), _as_long(slots)
        if lengths_t.numel() != slots_t.numel():
            raise ValueError(f"SlotBatch: {lengths_t.numel()} segment lengths but {slots_t.numel()} slots")
        if (lengths_t < 0).any():
            raise ValueError(f"SlotBatch: segment lengths must be >= 0, got {lengths_t.tolist()}")
        _check_slots(slots_t, num_slots, "segment")
        indptr = torch.zeros(lengths_t.numel() + 1, dtype=torch.long)
        indptr[1:] = torch.cumsum(lengths_t, 0)
        return cls(indptr, slots_t, *_rank_scaling(num_slots, lora_ranks, scalings),
                   max_len=int(lengths_t.max()) if lengths_t.numel() else 0, num_slots=num_slots)

    @classmethod
    def from_token_slots(cls, token_slots: Sequence[int] | torch.Tensor, num_slots: int,
                         lora_ranks: Sequence[int] | None = None, scalings: Sequence[float] | None = None,
                         group: bool = False) -> "SlotBatch":
        """From each token's slot (``-1``: base only). Runs of equal slots become segments;
        ``group=True`` adds the permutation that sorts tokens by slot (one segment per slot)."""
        ids = _as_long(token_slots)
        _check_slots(ids, num_slots, "token")
        perm = None
        if group and ids.numel():
            perm = torch.sort(ids, stable=True).indices
            ids = ids[perm]
        if ids.numel():
            change = torch.nonzero(ids[1:] != ids[:-1]).flatten() + 1
            starts = torch.cat([torch.zeros(1, dtype=torch.long), change])
            lengths = torch.diff(torch.cat([starts, torch.tensor([ids.numel()])]))
            slots = ids[starts]
        else:
            lengths = slots = torch.zeros(0, dtype=torch.long)
        batch = cls.from_segments(lengths, slots, num_slots, lora_ranks, scalings)
        return cls(batch.seg_indptr, batch.weight_indices, batch.lora_ranks, batch.scalings,
                   batch.max_len, num_slots, perm)

    def token_slots(self) -> torch.Tensor:
        """``[T]``: each token's slot, in the tokens' original order."""
        lengths = torch.diff(self.seg_indptr)
        grouped = torch.repeat_interleave(self.weight_indices, lengths)
        if self.permutation is None:
            return grouped
        out = torch.empty_like(grouped)
        out[self.permutation] = grouped
        return out

    def active_slots(self) -> list[int]:
        """Slots some token uses, except rank-0 ones (a rank of -1 means unknown), in order."""
        used = torch.unique(self.weight_indices[torch.diff(self.seg_indptr)[: self.num_segments] > 0])
        return [int(s) for s in used if s >= 0 and int(self.lora_ranks[s]) != 0]

    def __repr__(self) -> str:
        segs = ", ".join(f"{int(self.seg_indptr[g + 1] - self.seg_indptr[g])}x{int(self.weight_indices[g])}"
                         for g in range(min(self.num_segments, 8)))
        more = ", ..." if self.num_segments > 8 else ""
        return (f"SlotBatch(T={self.num_tokens}, segments=[{segs}{more}] (tokens x slot), "
                f"S={self.num_slots}, ranks={self.lora_ranks.tolist()}, grouped={self.permutation is not None})")


def _check_slots(ids: torch.Tensor, num_slots: int, what: str) -> None:
    bad = torch.nonzero((ids < -1) | (ids >= num_slots)).flatten()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(
            f"SlotBatch: {what} {i} uses slot {int(ids[i])}, but the pool has slots 0..{num_slots - 1} "
            f"(-1 means base model only); {bad.numel()} {what}(s) out of range")


def _rank_scaling(num_slots: int, lora_ranks: Sequence[int] | None, scalings: Sequence[float] | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    ranks = _as_long(lora_ranks) if lora_ranks is not None else torch.full((num_slots,), -1, dtype=torch.long)
    scal = (torch.as_tensor(scalings, dtype=torch.float32).flatten().cpu() if scalings is not None
            else torch.ones(num_slots))
    for name, t in (("lora_ranks", ranks), ("scalings", scal)):
        if t.numel() != num_slots:
            raise ValueError(f"SlotBatch: {name} has {t.numel()} entries but the pool has {num_slots} slots")
    return ranks, scal
