"""A batch of tokens in contiguous segments, each naming one slot or none (docs/reference.md#batches)."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from .catalog import error
from .geometry import check_size


def _not_an_int(v: object) -> bool:
    if isinstance(v, torch.Tensor):
        return v.numel() != 1 or v.dtype == torch.bool or v.is_floating_point() or v.is_complex()
    return isinstance(v, bool) or not isinstance(v, numbers.Integral)


def _as_long(values: Sequence[int] | torch.Tensor, what: str) -> torch.Tensor:
    """``values`` as a flat CPU long tensor; a float, boolean, string or NaN anywhere is
    refused (``TypeError`` naming ``what`` and the first such element) instead of being
    truncated or read as a slot."""
    if isinstance(values, (str, bytes)):
        raise TypeError(f"SlotBatch: {what} must be a sequence of integers, got the string {values!r}")
    if isinstance(values, torch.Tensor) or hasattr(values, "__array__"):
        try:
            t = torch.as_tensor(values).flatten()
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(f"SlotBatch: {what} must hold integers: {exc}") from None
        if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
            first = f" ({what}[0] is {t[0].item()!r})" if t.numel() else ""
            fix = ("booleans are no ids: pass the integers themselves" if t.dtype == torch.bool
                   else "convert it with .long() once you know no value has a fraction")
            raise TypeError(f"SlotBatch: {what} must be an integer tensor, got {t.dtype}{first}: {fix}")
        return t.to(torch.long).cpu()
    try:
        items = list(values)
    except TypeError:
        raise TypeError(f"SlotBatch: {what} must be a sequence of integers, got {type(values).__name__}") from None
    for i, v in enumerate(items):
        if _not_an_int(v):
            kind = "NaN" if isinstance(v, float) and math.isnan(v) else type(v).__name__
            raise error("ISL-K152", what=what, index=i, value=repr(v), kind=kind)
    try:
        return torch.tensor([int(v) for v in items], dtype=torch.long)
    except (RuntimeError, ValueError, OverflowError):  # torch's words for an int past int64: "Overflow ..."
        i = next(i for i, v in enumerate(items) if not -2**63 <= int(v) < 2**63)
        raise ValueError(f"SlotBatch: {what}[{i}] is {int(items[i])}, outside the int64 range") from None


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
    tokens: int | None = None
    """Host copy of ``seg_indptr[-1]``, kept by ``to()``: a device-resident batch
    answers ``num_tokens`` without a device sync (CUDA graph capture allows none)."""

    @property
    def num_tokens(self) -> int:
        if self.tokens is not None:
            return self.tokens
        # Every forward asks (check_batch); reading a host tensor's element costs ~3 µs of a ~30 µs call. The count is
        # kept with the storage and version counter it was read at: an in-place write to seg_indptr bumps the counter.
        ip = self.seg_indptr
        key, kept = (ip.data_ptr(), ip._version), self.__dict__.get("_count")
        if kept is None or kept[0] != key:
            kept = (key, int(ip[-1]))
            object.__setattr__(self, "_count", kept)  # a cache, not a field: equality and replace() ignore it
        return kept[1]

    def to(self, device: torch.device | str) -> "SlotBatch":
        """This batch with its tensors on ``device`` (like sglang's ``LoRABatchInfo``).

        Copy once, before capture; afterwards rewrite the tensors in place
        (``seg_indptr.copy_(...)``, same ``T`` and segment count) and a captured
        forward replays with the new segments and slots."""
        try:  # torch's words for a device it does not know, or one this build has not, name neither
            torch.empty(0, device=device)
        except (RuntimeError, AssertionError, TypeError) as exc:
            raise ValueError(f"SlotBatch.to: the device {device!r} is not available here ({exc})") from None

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return replace(self, seg_indptr=move(self.seg_indptr), weight_indices=move(self.weight_indices),
                       lora_ranks=move(self.lora_ranks), scalings=move(self.scalings),
                       permutation=move(self.permutation), tokens=self.num_tokens)

    @property
    def num_segments(self) -> int:
        return int(self.weight_indices.numel())

    @classmethod
    def from_segments(cls, lengths: Sequence[int], slots: Sequence[int], num_slots: int,
                      lora_ranks: Sequence[int] | None = None, scalings: Sequence[float] | None = None
                      ) -> "SlotBatch":
        """Segments given directly: ``lengths[g]`` tokens use slot ``slots[g]`` (``-1``: none)."""
        lengths_t, slots_t = _as_long(lengths, "lengths"), _as_long(slots, "slots")
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
        ids = _as_long(token_slots, "token_slots")
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
    if isinstance(num_slots, bool) or not isinstance(num_slots, numbers.Integral):
        raise TypeError(f"SlotBatch: num_slots must be an integer (the pool's S), got {num_slots!r}")
    if num_slots < 0:
        raise ValueError(f"SlotBatch: num_slots must be >= 0 (the pool's S), got {num_slots}")
    check_size("SlotBatch: num_slots", num_slots)  # compared with int64 ids: past any pool (ISL-K162)
    bad = torch.nonzero((ids < -1) | (ids >= num_slots)).flatten()
    if bad.numel():
        i = int(bad[0])
        raise error("ISL-K103", where=what, index=i, slot=int(ids[i]), last=num_slots - 1, count=bad.numel())


def _rank_scaling(num_slots: int, lora_ranks: Sequence[int] | None, scalings: Sequence[float] | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    ranks = (_as_long(lora_ranks, "lora_ranks") if lora_ranks is not None
             else torch.full((num_slots,), -1, dtype=torch.long))
    scal = _as_scalings(scalings) if scalings is not None else torch.ones(num_slots)
    for name, t in (("lora_ranks", ranks), ("scalings", scal)):
        if t.numel() != num_slots:
            raise ValueError(f"SlotBatch: {name} has {t.numel()} entries but the pool has {num_slots} slots")
    if (ranks < -1).any():
        i = int(torch.nonzero(ranks < -1)[0])
        raise ValueError(f"SlotBatch: lora_ranks[{i}] is {int(ranks[i])}: a rank is >= 0 (-1: unknown)")
    return ranks, scal


def _as_scalings(scalings: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """Per-slot scalings as float32; a string, boolean, NaN or infinity is refused (a NaN
    scaling would silently turn every token of its slot into NaN)."""
    items = scalings.flatten().tolist() if isinstance(scalings, torch.Tensor) else scalings
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
        raise TypeError(f"SlotBatch: scalings must be a sequence of numbers, got {items!r}")
    items = list(items)
    for i, v in enumerate(items):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"SlotBatch: scalings must hold numbers, but scalings[{i}] is {v!r} "
                            f"({type(v).__name__})")
        if not math.isfinite(v):
            raise ValueError(f"SlotBatch: scalings[{i}] is {v!r}: a scaling must be finite")
    return torch.tensor(items, dtype=torch.float32)
