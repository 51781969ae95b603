"""The LoRA pool: four 4D buffers with one slot per adapter in a batch (docs/reference.md#the-pool).

``gate_up_a [S, O, 2R, H]``, ``gate_up_b [S, n, 2F, R]``, ``down_a [S, n, R, F]``,
``down_b [S, O, H, R]``. Loading an adapter of rank ``r <= R`` zeroes its slot,
writes gate A to rows ``0..r-1`` and up A to rows ``R..R+r-1`` (halves at max-rank
offsets), and folds the scaling ``lora_alpha / r`` into the B factors.
``collapse_identical_outer`` turns per-expert outer factors that are the same for
every expert into the shared outer layout (exact); ``collapse_pool_outer`` does it for
the adapters of one pool, toward a shared outer pool only.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from .catalog import Finding, error, finding
from .geometry import Geometry, allocate, check_dtype


def _outer_mismatch(which: str, k: int) -> ValueError:
    return error("ISL-E015", factor=which, k=k)


def _copy_checked(view: torch.Tensor, weight: torch.Tensor) -> None:
    # Upstream's loader asserts exact shape equality before it copies (an adapter
    # of too large a rank, or of another H or F, fails here). Raised, not asserted,
    # so that ``python -O`` cannot turn it into a broadcast or a raw copy error.
    if view.shape != weight.shape:
        # upstream formats the shapes as torch.Size([...]), and so do we
        raise error("ISL-E016", buffer_shape=view.shape, weight_shape=weight.shape)
    view.copy_(weight)


_SYMBOLS = {"gate_up_a": "[O, 2r, H]", "gate_up_b": "[n, 2F, r]", "down_a": "[n, r, F]", "down_b": "[O, H, r]"}


def check_finite(t: torch.Tensor, what: str, how: str) -> torch.Tensor:
    """``t`` if every value is finite, else ``ValueError`` (``ISL-K160``) naming ``what``:
    a NaN or an overflow to infinity (``how`` says what made the values: a cast, a
    scaling) would reach the pool silently and make every output of its slot NaN.
    Meta tensors (a dry run that only checks shapes) hold no values and pass."""
    if t.device.type != "meta" and t.numel() and not bool(torch.isfinite(t).all()):
        raise error("ISL-K160", tensor=what, count=int((~torch.isfinite(t)).sum()), total=t.numel(),
                    dtype=str(t.dtype).removeprefix("torch."), how=how)
    return t


@dataclass
class LoRAFactors:
    """One adapter's shared-sink factors, normalized for the pool (docs/reference.md#adapters-on-disk, step 3).

    ``gate_up_a [O, 2r, H]`` (gate rows, then up rows), ``gate_up_b [n, 2F, r]``
    (per expert: gate rows, then up rows), ``down_a [n, r, F]``, ``down_b [O, H, r]``;
    ``O`` is 1 (shared outer) or ``n``. ``lora_alpha / r`` is the scaling.
    """

    gate_up_a: torch.Tensor
    gate_up_b: torch.Tensor
    down_a: torch.Tensor
    down_b: torch.Tensor
    lora_alpha: float = 1.0
    name: str = ""

    def __post_init__(self) -> None:
        # Checked where the factors are made: a NaN alpha (or an integer factor) would
        # otherwise load a slot of NaN (or of truncated values) without a word.
        a = self.lora_alpha
        if isinstance(a, bool) or not isinstance(a, numbers.Real) or not math.isfinite(a):
            raise ValueError(f"LoRAFactors{self._label}: lora_alpha must be a finite number, got {a!r}: the "
                             "scaling lora_alpha / r is folded into every B, so every output would be NaN")
        dtypes = {}
        for key, t in self.tensors().items():
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"LoRAFactors{self._label}: {key} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 3:
                raise ValueError(f"LoRAFactors{self._label}: {key} must be 3D {_SYMBOLS[key]}, got shape "
                                 f"{list(t.shape)}")
            dtypes[key] = check_dtype(f"LoRAFactors{self._label}: {key}'s dtype", t.dtype)
        if len(set(dtypes.values())) > 1:
            raise TypeError(f"LoRAFactors{self._label}: the four factors must share one dtype, got "
                            + ", ".join(f"{k} {str(d).removeprefix('torch.')}" for k, d in dtypes.items())
                            + ": cast them to one (the widest keeps every value)")

    @property
    def _label(self) -> str:
        return f" {self.name!r}" if self.name else ""

    @property
    def rank(self) -> int:
        """``r``, this adapter's own rank (a pool holds it if ``r <= R``, its ``max_rank``)."""
        return int(self.down_a.shape[-2])

    @property
    def outer(self) -> int:
        return int(self.gate_up_a.shape[0])

    @property
    def n(self) -> int:
        return int(self.gate_up_b.shape[0])

    @property
    def scaling(self) -> float:
        return self.lora_alpha / self.rank if self.rank else 0.0

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"gate_up_a": self.gate_up_a, "gate_up_b": self.gate_up_b,
                "down_a": self.down_a, "down_b": self.down_b}

    @classmethod
    def random(cls, n: int, hidden: int, intermediate: int, rank: int, outer: int = 1,
               lora_alpha: float | None = None, seed: int = 0, dtype: torch.dtype = torch.float32,
               name: str = "") -> "LoRAFactors":
        """Seeded random factors of unit-ish size (B is not zero, unlike at PEFT init,
        so that the delta is visible)."""
        gen = torch.Generator().manual_seed(seed)
        O = outer

        def rnd(*shape: int, fan_in: int) -> torch.Tensor:
            return (torch.randn(shape, generator=gen) / max(fan_in, 1) ** 0.5).to(dtype)

        return cls(
            gate_up_a=rnd(O, 2 * rank, hidden, fan_in=hidden),
            gate_up_b=rnd(n, 2 * intermediate, rank, fan_in=rank),
            down_a=rnd(n, rank, intermediate, fan_in=intermediate),
            down_b=rnd(O, hidden, rank, fan_in=rank),
            lora_alpha=float(rank if lora_alpha is None else lora_alpha),
            name=name,
        )


@dataclass
class _SlotRecord:
    name: str
    rank: int
    scaling: float


class LoRAPool:
    """The four 4D buffers of a serving engine's shared-sink LoRA pool.

    >>> pool = LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=4)
    >>> [tuple(b.shape) for b in pool.buffers()]
    [(3, 1, 8, 8), (3, 2, 12, 4), (3, 2, 4, 6), (3, 1, 8, 4)]
    """

    def __init__(self, n: int, hidden: int, intermediate: int, slots: int, max_rank: int,
                 outer: int = 1, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        self.geometry = Geometry(n=n, hidden=hidden, intermediate=intermediate, max_rank=max_rank,
                                 slots=slots, outer=outer)
        g = self.geometry
        check_dtype("LoRAPool: dtype", dtype)
        self.gate_up_a, self.gate_up_b, self.down_a, self.down_b = (
            allocate(shape, f"LoRAPool: {name}", dtype, device) for name, shape in g.buffer_shapes().items())
        self._slots: list[_SlotRecord | None] = [None] * slots

    @classmethod
    def from_geometry(cls, g: Geometry, dtype: torch.dtype = torch.float32,
                      device: torch.device | str | None = None) -> "LoRAPool":
        return cls(g.n, g.hidden, g.intermediate, g.slots, g.max_rank, g.outer, dtype, device)

    @property
    def slots(self) -> int:
        return self.geometry.slots

    @property
    def max_rank(self) -> int:
        return self.geometry.max_rank

    @property
    def shared_outer(self) -> bool:
        return self.geometry.shared_outer

    def buffers(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(gate_up_a, gate_up_b, down_a, down_b)``, in ``set_lora_info`` order."""
        return self.gate_up_a, self.gate_up_b, self.down_a, self.down_b

    def _check_slot(self, slot: int) -> None:
        if isinstance(slot, bool) or not isinstance(slot, numbers.Integral):
            raise TypeError(f"LoRAPool: slot must be an integer in 0..{self.slots - 1}, got {slot!r}")
        if not 0 <= slot < self.slots:
            raise error("ISL-K104", slot=slot, last=self.slots - 1)

    def load(self, slot: int, factors: LoRAFactors, name: str | None = None) -> None:
        """Write one adapter into ``slot``: zero it, copy the gate/up halves at max-rank
        offsets, and scale the B factors by ``lora_alpha / r``.

        A load that fails (upstream's shape assertion, an outer-layout mismatch, a tensor
        that cannot be copied) leaves the slot, its adapter and ``names`` as they were.
        """
        self._check_slot(slot)
        if not isinstance(factors, LoRAFactors):
            raise TypeError(f"LoRAPool.load: factors must be LoRAFactors, got {type(factors).__name__}")
        if self.gate_up_a.device.type != "meta" and any(t.device.type == "meta" for t in factors.tensors().values()):
            raise ValueError(f"LoRAPool.load: the factors{factors._label} are on the meta device (shapes only, no "
                             "values): load the real tensors")
        r, R = factors.rank, self.max_rank
        if self.shared_outer:
            if factors.gate_up_a.shape[0] != 1:
                raise _outer_mismatch("gate_up_proj_moe lora_A", factors.gate_up_a.shape[0])
            if factors.down_b.shape[0] != 1:
                raise _outer_mismatch("down_proj_moe lora_B", factors.down_b.shape[0])
        dtype = self.gate_up_a.dtype
        label = f"adapter {factors.name!r}: " if factors.name else ""
        ga, gb, da, db = (check_finite(t.to(dtype), f"{label}{key}", f"cast to the pool's {dtype}")
                          for key, t in factors.tensors().items())
        if not self.shared_outer and ga.shape[0] == 1:
            # A shared-outer adapter in a per-expert pool: every expert gets the same
            # outer factor, which is exact.
            ga = ga.expand(self.geometry.outer, -1, -1)
            db = db.expand(self.geometry.outer, -1, -1)
        scaling = factors.scaling
        half = ga.shape[1] // 2
        with torch.no_grad():
            # Built off to the side (one slot's worth), so that any failure happens before
            # the slot is touched; the final copies cannot fail (same shape, dtype, device).
            sga, sgb, sda, sdb = staged = [torch.zeros_like(buf[slot]) for buf in self.buffers()]
            _copy_checked(sga[:, :min(half, R)], ga[:, :half])
            _copy_checked(sga[:, R:R + min(half, R)], ga[:, half:])
            how = f"scaled by lora_alpha / r = {scaling:g} in the pool's {dtype}"
            _copy_checked(sgb[:, :, :min(r, R)], check_finite(gb * scaling, f"{label}gate_up_b", how))
            _copy_checked(sda[:, :min(r, R)], da)
            _copy_checked(sdb[:, :, :min(r, R)], check_finite(db * scaling, f"{label}down_b", how))
            for buf, new in zip(self.buffers(), staged):
                buf[slot].copy_(new)
        self._slots[slot] = _SlotRecord(name if name is not None else factors.name, r, scaling)

    def clear(self, slot: int) -> None:
        """Zero one slot: a zero slot is the base model ("no adapter")."""
        self._check_slot(slot)
        with torch.no_grad():
            for buf in self.buffers():
                buf[slot].zero_()
        self._slots[slot] = None

    def evict(self, name: str) -> int:
        """Clear the slot that holds adapter ``name``; returns that slot."""
        for slot, rec in enumerate(self._slots):
            if rec is not None and rec.name == name:
                self.clear(slot)
                return slot
        loaded = [rec.name for rec in self._slots if rec is not None]
        raise KeyError(f"no adapter named {name!r} is loaded; loaded: {loaded}")

    def slot_of(self, name: str) -> int | None:
        for slot, rec in enumerate(self._slots):
            if rec is not None and rec.name == name:
                return slot
        return None

    @property
    def lora_ranks(self) -> list[int]:
        """Per-slot adapter rank (0 for an empty slot)."""
        return [rec.rank if rec else 0 for rec in self._slots]

    @property
    def adapter_scalings(self) -> list[float]:
        """Per-slot ``lora_alpha / r`` as loaded (already folded into B)."""
        return [rec.scaling if rec else 0.0 for rec in self._slots]

    @property
    def names(self) -> list[str | None]:
        return [rec.name if rec else None for rec in self._slots]

    def __repr__(self) -> str:
        g = self.geometry
        layout = "shared outer" if g.shared_outer else "per-expert outer"
        return (f"LoRAPool(n={g.n}, H={g.hidden}, F={g.intermediate}, S={g.slots}, R={g.max_rank}, "
                f"{layout}, dtype={self.gate_up_a.dtype}, ranks={self.lora_ranks})")


# -- identical per-expert outer factors ------------------------------------------------

def collapse_identical_outer(gate_up_a: torch.Tensor, down_b: torch.Tensor, atol: float = 0.0
                             ) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Per-expert outer factors that are the same for every expert, as shared outer.

    ``gate_up_a [..., O, 2R, H]`` and ``down_b [..., O, H, R]`` (one adapter's factors,
    or pool buffers with a leading slot axis). When every expert's gate-up A *and*
    down B equal expert 0's (within ``atol``; exactly by default), returns expert 0's
    as ``[..., 1, 2R, H]`` and ``[..., 1, H, R]`` (copies) and ``True``: the shared
    outer layout then computes the same function, and sglang 0.5.23 computes it right.
    Otherwise (or when ``O`` is already 1) returns the inputs and ``False``.
    """
    if gate_up_a.dim() < 3 or down_b.dim() < 3:
        raise ValueError(f"collapse_identical_outer needs gate-up A [..., O, 2R, H] and down B [..., O, H, R], "
                         f"got shapes {tuple(gate_up_a.shape)} and {tuple(down_b.shape)}")
    outer = gate_up_a.shape[-3]
    if down_b.shape[-3] != outer:
        raise ValueError(f"gate-up A has {outer} outer experts but down B has {down_b.shape[-3]} "
                         f"(shapes {tuple(gate_up_a.shape)} and {tuple(down_b.shape)}): both outer factors "
                         "must use one layout")
    if outer == 1 or not (_same_for_every_expert(gate_up_a, atol) and _same_for_every_expert(down_b, atol)):
        return gate_up_a, down_b, False
    return gate_up_a[..., :1, :, :].clone(), down_b[..., :1, :, :].clone(), True


def _same_for_every_expert(t: torch.Tensor, atol: float) -> bool:
    first = t[..., :1, :, :]
    if atol == 0.0:
        return bool((t == first).all())
    return bool(((t - first).abs() <= atol).all())


def collapse_pool_outer(adapters: Sequence[Mapping[str, LoRAFactors]], names: Sequence[str], outer: int | None
                        ) -> tuple[list[dict[str, LoRAFactors]], list[Finding]]:
    """Each adapter's factors by module, with per-expert outer factors that are the same
    for every expert collapsed to shared outer (exact), and a note for each collapse.

    Collapses only toward a shared outer pool: when ``outer`` is 1, or ``None`` (auto)
    and every per-expert factor collapses. Otherwise (``outer`` = n, or some experts'
    outer factors differ, so the pool stays per expert) returns the factors unchanged
    and no notes (what sglang 0.5.23 then serves is the doctor's to say).
    """
    collapsed, notes = [], []
    for factors, name in zip(adapters, names):
        out = dict(factors)
        for module, f in factors.items():
            ga, db, done = collapse_identical_outer(f.gate_up_a, f.down_b)
            if done:
                out[module] = LoRAFactors(ga, f.gate_up_b, f.down_a, db, f.lora_alpha, f.name)
                notes.append(finding("ISL-N001", module, name=repr(name), module=module, n=f.outer))
        collapsed.append(out)
    shared = all(f.outer == 1 for fs in collapsed for f in fs.values())
    if outer == 1 or (outer is None and shared):
        return collapsed, notes
    return [dict(fs) for fs in adapters], []
