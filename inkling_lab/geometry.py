"""The symbols of the shared sink and its LoRA pool, in one small record (docs/reference.md#the-base-module, #the-pool).

``n`` shared experts, ``H`` hidden size, ``F`` per-rank intermediate size of one
expert, ``R`` the pool's max LoRA rank, ``S`` adapter slots and ``O`` the outer
expert dimension of the two outer factors (``1`` shared, ``n`` per expert).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

import torch

from .catalog import CATALOG, message

Shape = tuple[int, ...]

MSG_TP_SPLIT = CATALOG["ISL-K102"].message  # {what} {intermediate} {tp_size} {divisors}
MSG_TP_SIZE = "tp_size must be at least 1, got {tp_size}"

SIZE_LIMIT = 2 ** 31 - 1
"""The largest size of one axis the kit accepts (``n``, ``H``, ``F``, ``R``, ``S``, tokens):
what an int32 index holds, far past any real model; a larger one is a typo, refused
before anything is allocated."""

SEED_RANGE = (-2 ** 63, 2 ** 64 - 1)
"""The seeds ``torch.Generator.manual_seed`` takes."""


def check_seed(what: str, seed: object) -> int:
    """``seed`` if it is a whole number ``torch.Generator.manual_seed`` takes, else
    ``TypeError``/``ValueError`` naming ``what`` (torch's own words: "Overflow when
    unpacking long long")."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{what} must be a whole number, got {seed!r}")
    if not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise ValueError(f"{what} must be in {SEED_RANGE[0]}..{SEED_RANGE[1]} (what torch's generator takes), "
                         f"got {seed}")
    return int(seed)


BUFFER_NAMES = ("gate_up_a", "gate_up_b", "down_a", "down_b")
"""The four pool buffers, in ``set_lora_info`` order."""


def check_size(what: str, value: object, minimum: int = 0, about: str = "") -> int:
    """``value`` as an axis size: an integer (not a bool) in ``minimum..SIZE_LIMIT``, else
    ``TypeError``/``ValueError`` (``ISL-K162``) naming ``what``; ``about``: what the
    refusal adds (an adapter's own sizes)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an integer, got {value!r}{about}")
    if not minimum <= value <= SIZE_LIMIT:
        raise ValueError(message("ISL-K162", what=what, low=minimum, limit=SIZE_LIMIT, value=value, about=about))
    return int(value)


WORKING_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
"""The dtypes a sink, a pool and a LoRA factor may have: the float types torch's matmuls
and sglang's kernels compute in (no integers, booleans, complex or float8)."""


def check_numel(what: str, shape: Shape, about: str = "") -> Shape:
    """``shape`` if a tensor of it holds at most ``SIZE_LIMIT`` values, else ``ValueError``
    (``ISL-K164``) naming ``what`` and the shape: sizes each within bounds can still
    multiply past any memory (a max rank of 2**30 at H 8 is 2**34 values). Checked from
    the sizes alone, before anything is allocated; ``about``: what the refusal adds."""
    count = math.prod(shape)
    if count > SIZE_LIMIT:
        raise ValueError(message("ISL-K164", what=what, shape=list(shape), count=count,
                                 gib=f"{count * 4 / 2 ** 30:.3g}", about=about))
    return shape


def check_dtype(what: str, dtype: object) -> torch.dtype:
    """``dtype`` if it is one of ``WORKING_DTYPES``, else ``TypeError`` naming ``what``."""
    if dtype not in WORKING_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in WORKING_DTYPES)
        raise TypeError(f"{what} is {dtype}, not a working dtype: use one of {names}")
    return dtype


def allocate(shape: Shape, what: str, dtype: torch.dtype, device: torch.device | str | None = None,
             fill: str = "zeros", generator: torch.Generator | None = None) -> torch.Tensor:
    """A tensor of ``shape``: ``zeros``, ``empty``, or seeded ``randn``/``rand`` (drawn on
    the CPU in float32 from ``generator``, then cast and moved, as the kit's seeded
    factories draw). A shape past the kit's bound is refused before anything is
    allocated (``check_numel``, ``ISL-K164``); a size this machine cannot hold is a
    ``MemoryError`` naming ``what``, its shape and the bytes asked for, never torch's
    allocator text."""
    check_numel(what, shape)
    try:
        if fill in ("randn", "rand"):
            return getattr(torch, fill)(shape, generator=generator).to(dtype=dtype, device=device)
        return (torch.zeros if fill == "zeros" else torch.empty)(shape, dtype=dtype, device=device)
    except AssertionError as exc:  # torch's words for a device this build has not ("not compiled with CUDA")
        raise ValueError(f"{what}: the device {device!r} is not available here ({exc}): use device='cpu', or run "
                         "where it is") from None
    except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
        size = math.prod(shape) * dtype.itemsize
        raise MemoryError(f"{what} {list(shape)} ({dtype}) needs {size / 2 ** 30:.3g} GiB, which this machine "
                          f"cannot allocate on {device or 'cpu'} ({type(exc).__name__}): check the sizes "
                          "(a mistyped one?) or use a smaller geometry") from None


def check_tp(intermediate: int, tp_size: int, what: str = "tensor parallelism") -> int:
    """``F / tp``, the features of one expert that each rank holds; refuses a ``tp``
    below 1 or one that does not split ``F`` (``ISL-K102``; ``what`` names the tensor or
    geometry being cut). The kit's one divisibility check: ``Geometry.tp_shard`` and every
    cut of ``shard`` use it."""
    if tp_size < 1:
        raise ValueError(MSG_TP_SIZE.format(tp_size=tp_size))
    if intermediate % tp_size:
        divisors = [d for d in range(1, intermediate + 1) if intermediate % d == 0][:12]
        raise ValueError(MSG_TP_SPLIT.format(what=what, intermediate=intermediate, tp_size=tp_size,
                                             divisors=divisors))
    return intermediate // tp_size


@dataclass(frozen=True, init=False)
class Geometry:
    """Sizes of one shared sink and its LoRA pool.

    ``max_rank`` is the pool's ``R`` (each adapter's own rank ``r <= R`` is
    ``LoRAFactors.rank``); ``rank`` is kept as another name for it, as an argument and
    an attribute. ``outer`` is ``1`` (shared outer: one gate-up A and one down B for all
    experts) or ``n`` (per-expert outer). Every size is bounded (``ISL-K162``), and so is
    every tensor the geometry describes (``ISL-K164``): a refusal, before anything is
    allocated, adds ``about`` (what the caller knows: an adapter's own sizes).
    """

    n: int
    hidden: int
    intermediate: int
    max_rank: int
    slots: int
    outer: int

    def __init__(self, n: int, hidden: int, intermediate: int, max_rank: int | None = None, slots: int = 1,
                 outer: int = 1, *, rank: int | None = None, about: str = "") -> None:
        if max_rank is not None and rank is not None and max_rank != rank:
            raise TypeError(f"Geometry: max_rank={max_rank} and rank={rank} name the same R: give one")
        R = max_rank if max_rank is not None else rank if rank is not None else 4
        for name, value in (("n", n), ("hidden", hidden), ("intermediate", intermediate), ("max_rank", R),
                            ("slots", slots), ("outer", outer)):
            object.__setattr__(self, name, value)
        self._validate(about)

    def _validate(self, about: str = "") -> None:
        names = ("n", "hidden", "intermediate", "max_rank", "slots", "outer")
        for name in names:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"Geometry.{name} must be an integer, got {value!r}")
        for name in ("n", "hidden", "intermediate", "slots"):
            if getattr(self, name) < 1:
                raise ValueError(f"Geometry.{name} must be at least 1, got {getattr(self, name)}")
        if self.max_rank < 0:
            raise ValueError(f"Geometry.max_rank must be at least 0, got {self.max_rank}")
        for name in names:
            check_size(f"Geometry.{name}", getattr(self, name), about=about)
        if self.outer not in (1, self.n):
            raise ValueError(
                f"Geometry.outer must be 1 (shared outer) or n={self.n} (per-expert outer), got {self.outer}"
            )
        for name, shape in {**self.buffer_shapes(), "w13": self.w13, "w2": self.w2, "w1_delta": self.w1_delta,
                            "a_cat": self.a_cat}.items():
            check_numel(f"Geometry: {name}", shape, about)

    @property
    def rank(self) -> int:
        """``R``, the pool's max rank: another name for ``max_rank``."""
        return self.max_rank

    @property
    def shared_outer(self) -> bool:
        return self.outer == 1

    def with_(self, **changes: int) -> "Geometry":
        """A copy with some symbols changed (``g.with_(max_rank=8)``; ``rank=`` works too)."""
        if "rank" in changes:
            changes["max_rank"] = changes.pop("rank")
        return replace(self, **changes)

    def tp_shard(self, tp_size: int) -> "Geometry":
        """The geometry of one of ``tp_size`` tensor-parallel shards (docs/reference.md#tensor-parallelism): ``F / tp_size``
        features per expert, everything else the same; a ``tp_size`` that does not split
        ``F`` is refused (``ISL-K102``)."""
        return replace(self, intermediate=check_tp(self.intermediate, tp_size, "Geometry.tp_shard"))

    # The four buffers (docs/reference.md#the-pool).
    @property
    def gate_up_a(self) -> Shape:
        """``[S, O, 2R, H]``: rows ``0..R-1`` gate A, ``R..2R-1`` up A."""
        return (self.slots, self.outer, 2 * self.max_rank, self.hidden)

    @property
    def gate_up_b(self) -> Shape:
        """``[S, n, 2F, R]``: per expert, rows ``0..F-1`` gate B, ``F..2F-1`` up B."""
        return (self.slots, self.n, 2 * self.intermediate, self.max_rank)

    @property
    def down_a(self) -> Shape:
        """``[S, n, R, F]``."""
        return (self.slots, self.n, self.max_rank, self.intermediate)

    @property
    def down_b(self) -> Shape:
        """``[S, O, H, R]``."""
        return (self.slots, self.outer, self.hidden, self.max_rank)

    def buffer_shapes(self) -> dict[str, Shape]:
        """The four pool buffer shapes by name, in ``set_lora_info`` order."""
        return {name: getattr(self, name) for name in BUFFER_NAMES}

    # The base weights (docs/reference.md#the-base-module).
    @property
    def w13(self) -> Shape:
        """``[n, 2F, H]``."""
        return (self.n, 2 * self.intermediate, self.hidden)

    @property
    def w2(self) -> Shape:
        """``[n, H, F]``."""
        return (self.n, self.hidden, self.intermediate)

    # The derived operands of the shared-outer layout (docs/reference.md#the-forward).
    @property
    def w1_delta(self) -> Shape:
        """``[S, n*2F, 2R]``."""
        return (self.slots, self.n * 2 * self.intermediate, 2 * self.max_rank)

    @property
    def a_cat(self) -> Shape:
        """``[S, R, n*F]``."""
        return (self.slots, self.max_rank, self.n * self.intermediate)


_INKLING = Geometry(n=2, hidden=6144, intermediate=3072, max_rank=64, slots=4, outer=1)

PRESETS: dict[str, Geometry] = {
    # Small enough to print and to run in Triton's CPU interpreter.
    "toy": Geometry(n=2, hidden=8, intermediate=6, max_rank=2, slots=3, outer=1),
    # The two benchmark shapes of the profiling grid, at R 64 and 4 slots.
    "A": Geometry(n=2, hidden=1536, intermediate=768, max_rank=64, slots=4, outer=1),
    "B": Geometry(n=2, hidden=4096, intermediate=2048, max_rank=64, slots=4, outer=1),
    # The real model's text config (hidden 6144, moe_intermediate 3072, 2 shared experts),
    # whole and as one rank of each tensor-parallel degree serving uses (F / tp per rank).
    "inkling": _INKLING,
    **{f"inkling-tp{tp}": _INKLING.tp_shard(tp) for tp in (2, 4, 8)},
}
"""Named geometries: ``toy`` for reading, ``A`` and ``B`` for the benchmark grid,
``inkling`` and ``inkling-tp2/4/8`` for the real model (pool at R 64, 4 slots)."""
