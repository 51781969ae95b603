"""The benchmark's points and their roofline: which shapes, ranks, slots and token counts
are measured, the fewest bytes and FLOPs one forward needs, the targets, and the upstream
µs issue 4 printed.

The roofline of one case is ``max(bytes / copy bandwidth, FLOPs / matmul rate)``,
with both ceilings measured on the device. ``case_bytes`` and ``case_flops`` state
the count so a reader can redo it by hand:

* bytes (each input read once, the output written once, element size ``es``):
  base weights ``es * (n*2F*H + n*H*F)``; for every slot some token uses, its pool
  slices ``es * (O*2R*H + n*2F*R + n*R*F + O*H*R)``; ``x`` and ``out``
  ``es * 2*T*H``; ``gammas`` ``es * T*n``.
* FLOPs (2 per multiply-add, at the pool's rank ``R``): the base ``2*T*H*n*2F``
  (up) plus ``2*T*n*F*H`` (down); the LoRA for the ``T_l`` tokens with a slot
  ``2*T_l*O*2R*H`` (gate/up shrink) ``+ 2*T_l*n*2F*R`` (expand) ``+ 2*T_l*n*F*R``
  (down shrink) ``+ 2*T_l*O*R*H`` (down expand). The SwiGLU is left out: a few
  FLOPs per feature, far under both terms.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from .. import records
from ..geometry import PRESETS, Geometry
from ..lora import SharedSinkLoRA
from ..scenario import Scenario

SHAPES = {"A": "A", "B": "B", "Inkling": "inkling", "Inkling-TP8": "inkling-tp8"}
"""The benchmark shapes by the names records and tables give them -> their preset in
``PRESETS`` (whose ``n, H, F`` they are): A and B (issue 4), the real model and its
tensor-parallel-8 slice (``F = 3072 / 8`` per rank, issue 15)."""

GRID_TOKENS = tuple(2 ** i for i in range(14))  # 1 .. 8192
GRID_RANKS = (16, 64)
GRID_SLOTS = (1, 4, 8)
SIDE_SHAPES = ("A", "B", "Inkling", "Inkling-TP8")
SIDE_TOKENS = (1, 8, 32, 128, 512, 2048, 8192)
"""The side-by-side grid of issue 15 (with ``GRID_RANKS`` and ``GRID_SLOTS``)."""

TARGET_SMALL_T, TARGET_LARGE_T = 3.0, 1.2
"""Target ratio to the roofline: T <= 32 and T >= 2048 (issue 15; issue 4 had 1.3)."""
TARGET_VS_BASE_LARGE_T = 1.1
"""T >= 2048: at most this times sglang's no-LoRA base (T <= 32: faster than it)."""

RECORD_FIELDS = ("shape", "n", "H", "F", "R", "S", "T", "outer", "dtype", "interleaved")
"""A case as the JSON records write it (``Case.record``), in this order."""


@dataclass(frozen=True)
class Case:
    """One grid point: a ``geometry`` (its ``n, H, F``, the pool's rank ``R``, ``S``
    slots and the outer layout), ``T`` tokens split evenly into ``S`` segments
    (segment ``i`` on slot ``i``), the dtype and the gate/up layout. ``shape`` is the
    geometry's name in the records (``SHAPES``)."""

    shape: str
    geometry: Geometry
    T: int
    dtype: str = "bfloat16"
    interleaved: bool = True

    @classmethod
    def of(cls, shape: str, R: int, S: int, T: int, outer: int = 1, **kw) -> "Case":
        """The benchmark shape ``shape`` at rank ``R``, ``S`` slots, ``T`` tokens
        (``outer``: 1 shared, ``n`` per expert)."""
        if shape not in SHAPES:
            raise ValueError(f"unknown shape {shape!r}; choose one of {sorted(SHAPES)}")
        return cls(shape, PRESETS[SHAPES[shape]].with_(max_rank=R, slots=S, outer=outer), T, **kw)

    def record(self) -> dict:
        """The case's fields as the JSON records hold them (``RECORD_FIELDS``)."""
        g = self.geometry
        return dict(zip(RECORD_FIELDS, (self.shape, g.n, g.hidden, g.intermediate, g.max_rank, g.slots, self.T,
                                        g.outer, self.dtype, self.interleaved)))

    @classmethod
    def from_record(cls, fields: dict) -> "Case":
        """The case of a record's ``case`` fields (``record``'s inverse)."""
        g = Geometry(fields["n"], fields["H"], fields["F"], fields["R"], fields["S"], fields["outer"])
        return cls(fields["shape"], g, fields["T"], fields["dtype"], fields["interleaved"])

    def segment_lengths(self) -> list[int]:
        """``T`` split evenly over ``S`` segments, the first ones one longer."""
        T, S = self.T, self.geometry.slots
        return [T // S + (i < T % S) for i in range(S)]

    @property
    def slots_used(self) -> int:
        return sum(1 for length in self.segment_lengths() if length)

    @property
    def element_size(self) -> int:
        return torch.empty(0, dtype=getattr(torch, self.dtype)).element_size()

    def scenario(self, device: torch.device | str, seed: int = 0, sink: SharedSinkLoRA | None = None) -> Scenario:
        """The case's inputs, from the one factory (``Scenario.random``): seeded weights
        and pool (every slot at rank ``R``), ``x`` and gammas, the tokens in their even
        segments. ``sink``: one of the same ``n, H, F``, layout and dtype whose base
        weights are kept (a grid over one shape draws them once)."""
        slots = torch.repeat_interleave(torch.arange(self.geometry.slots), torch.tensor(self.segment_lengths()))
        return Scenario.random(self.geometry, tokens=self.T, seed=seed, dtype=getattr(torch, self.dtype),
                               device=device, interleaved=self.interleaved, token_slots=slots, sink=sink)


def case_bytes(c: Case) -> int:
    """The fewest bytes one forward must move (module docstring)."""
    g, T = c.geometry, c.T
    n, H, F, R, O = g.n, g.hidden, g.intermediate, g.max_rank, g.outer
    weights = n * 2 * F * H + n * H * F
    pool = c.slots_used * (O * 2 * R * H + n * 2 * F * R + n * R * F + O * H * R)
    io = 2 * T * H + T * n
    return c.element_size * (weights + pool + io)


def case_flops(c: Case) -> int:
    """Useful FLOPs of one forward (module docstring); every token has a slot here."""
    g, T = c.geometry, c.T
    n, H, F, R, O = g.n, g.hidden, g.intermediate, g.max_rank, g.outer
    base = 2 * T * H * n * 2 * F + 2 * T * n * F * H
    lora = 2 * T * O * 2 * R * H + 2 * T * n * 2 * F * R + 2 * T * n * F * R + 2 * T * O * R * H
    return base + lora


@dataclass(frozen=True)
class Roofline:
    bytes: int
    flops: int
    memory_us: float
    compute_us: float

    @property
    def us(self) -> float:
        return max(self.memory_us, self.compute_us)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_us >= self.compute_us else "compute"


def roofline(c: Case, copy_TBps: float, matmul_TFLOPs: float) -> Roofline:
    """Bytes over the copy bandwidth and FLOPs over the matmul rate, in µs."""
    b, f = case_bytes(c), case_flops(c)
    return Roofline(b, f, b / (copy_TBps * 1e12) * 1e6, f / (matmul_TFLOPs * 1e12) * 1e6)


def target_ratio(T: int) -> float | None:
    """The issue's ceiling on measured/roofline at ``T`` (none between 32 and 2048)."""
    if T <= 32:
        return TARGET_SMALL_T
    if T >= 2048:
        return TARGET_LARGE_T
    return None


# -- what issue 4 printed for upstream ---------------------------------------------------

UPSTREAM_ISSUE4 = Path(__file__).resolve().parents[2] / "data" / "profiles" / "upstream_issue4.json"
"""The upstream µs issue 4 printed (not measured here; the file says where they came from)."""


@dataclass(frozen=True)
class Issue4:
    """Issue 4's upstream numbers: the ``ceilings`` its rooflines used, its multi-slot
    ``rows`` ``(shape, T, S, R, upstream µs, its roofline µs)`` and its ``one_slot`` µs
    by ``(shape, T)``."""

    ceilings: dict[str, float]
    rows: tuple[tuple[str, int, int, int, float, float], ...]
    one_slot: dict[tuple[str, int], float]


@cache
def issue4_upstream() -> Issue4:
    """``data/profiles/upstream_issue4.json``, read at the first call (never at import)."""
    raw = records.load_record(UPSTREAM_ISSUE4, ("source", "ceilings", "multi_slot"), "upstream record")
    rows = tuple((r["shape"], r["T"], r["S"], r["R"], r["upstream_us"], r["roofline_us"]) for r in raw["multi_slot"])
    return Issue4(raw["ceilings"], rows, {(r["shape"], r["T"]): r["upstream_us"] for r in raw["one_slot"]})


def upstream_us(shape: str, T: int, S: int, R: int) -> float | None:
    """Issue 4's upstream µs at this point, if it printed one."""
    for row in issue4_upstream().rows:
        if row[:4] == (shape, T, S, R):
            return row[4]
    return None
