"""Checking the four pool buffers (SPEC §3).

``validate_pool`` is upstream-exact: the same exception type and message, in the
same order, first failure wins. ``diagnose_pool`` never raises: it reports every
finding, upstream's and the ones upstream leaves to a raw torch error later, each
with a stable code, a one-line message and a concrete fix.

Both accept tensors or bare shapes (tuples), so a reader can try shapes without
allocating anything.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from .geometry import BUFFER_NAMES, Geometry

PRETTY = {"gate_up_a": "gate-up A", "gate_up_b": "gate-up B", "down_a": "down A", "down_b": "down B"}
SYMBOLS = {"gate_up_a": "[S, O, 2R, H]", "gate_up_b": "[S, n, 2F, R]",
           "down_a": "[S, n, R, F]", "down_b": "[S, O, H, R]"}

MSG_NOT_4D = "Inkling shared-sink LoRA requires four 4D MoE buffers"
MSG_OUTER_DIM = "Inkling shared-sink LoRA outer factors must have expert dimension 1 or {n}"
MSG_OUTER_LAYOUT = "Inkling shared-sink gate-up A and down B must use the same expert layout"
MSG_EXPERT_COUNT = "Inkling shared-sink LoRA expert count does not match"
MSG_RANK = "Inkling shared-sink LoRA rank dimensions do not match"
MSG_V2_DISAGREE = (
    "Inkling shared-sink LoRA pool buffers do not agree: expected gate-up A [slots, 1 or {n}, 2R, H], "
    "gate-up B [slots, {n}, 2F, R], down A [slots, {n}, R, F], down B [slots, 1 or {n}, H, R] "
    "with one layout")
GENERATIONS = ("v1", "v2")
"""``v1``: ``InklingBatchDenseMLPWithLoRA``; ``v2``: ``InklingBatchDenseMLPWithLoRAV2``
(the dense engine). Both are in the sglang 0.5.23 wheel."""

# The rest of the module's own words (sglang 0.5.23, srt/models/inkling_common/lora.py),
# raised by SharedSinkLoRA; kept here so that every message of set_lora_info, the slot
# refresh and initialize_lora has one source.
MSG_POOL_SHAPE = ("Shared-sink LoRA pool shape changed after initialization: "
                  "gate-up {old_gate_up} -> {new_gate_up}, down-A {old_down} -> {new_down}")  # ISL-E007
MSG_V2_POOL_SHAPE = "Shared-sink LoRA pool shape changed after initialization: {old} -> {new}"
MSG_SLOT_RANGE = "Shared-sink LoRA slot out of range: {slot_ids}"  # ISL-E008, every id given, sorted
V1_CLASS, V2_CLASS = "InklingBatchDenseMLPWithLoRA", "InklingBatchDenseMLPWithLoRAV2"
MSG_INELIGIBLE = V1_CLASS + " is ineligible: {problems}"  # ISL-E009, problems joined by "; "
PROBLEM_BACKEND = "multi-slot dense LoRA requires the Triton backend"
PROBLEM_WEIGHTS = "the shared sink does not use linearized BF16 weights"
MSG_V2_NO_ENGINE = "{cls} needs a backend with the dense engine"
MSG_V2_NOT_BF16 = "{cls} needs the linearized BF16 shared sink"
MSG_V2_INTERLEAVED = "The V2 shared sink must select contiguous W13 before loading"


@dataclass(frozen=True, init=False)
class PoolLayout(Geometry):
    """The geometry that four valid pool buffers spell out (``[S, O, 2R, H]`` and friends,
    in numbers). Upstream's checks let zero extents through, so none is refused here."""

    def _validate(self) -> None:
        """Nothing more than upstream's checks, which ran before the layout was read."""


def shape_of(x: Any) -> tuple[int, ...]:
    """The shape of a tensor, array or bare shape tuple."""
    if hasattr(x, "shape"):
        return tuple(int(d) for d in x.shape)
    return tuple(int(d) for d in x)


def _shapes(buffers: Sequence[Any]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for name, b in zip(BUFFER_NAMES, buffers):
        try:
            shapes[name] = shape_of(b)
        except TypeError:
            raise TypeError(f"{PRETTY[name]} {SYMBOLS[name]} must be a tensor or a shape tuple, "
                            f"got {type(b).__name__}") from None
    return shapes


def check_generation(generation: str) -> None:
    if generation not in GENERATIONS:
        raise ValueError(f"generation must be 'v1' or 'v2', got {generation!r}")


def upstream_check(shapes: dict[str, tuple[int, ...]], n: int, generation: str = "v1") -> tuple[str, str] | None:
    """The first of upstream's checks that fails, as ``(code, message)``, else ``None``.

    ``v1``: the five checks of SPEC §3 in order. ``v2`` has no 4D check: it unpacks
    ``S, O, 2R, _ = gate-up A`` and ``_, _, 2F, R = gate-up B``, reads down B's axis 2,
    then tests checks 2-5 in one condition, left to right, with one message. So on
    ``v2`` a gate-up A or B with another number of axes raises Python's own unpacking
    ``ValueError`` from here, and a down B (or down A) with too few axes
    ``IndexError: tuple index out of range``, exactly where upstream's do.
    """
    check_generation(generation)
    ga, gb, da, db = (shapes[k] for k in BUFFER_NAMES)
    if generation == "v2":
        _, outer, two_rank, _ = ga
        _, _, _, rank = gb
        db[2]  # upstream reads H here, before its condition: too few axes is its IndexError
        if (outer not in (1, n) or db[1] != outer or gb[1] != n or da[1] != n
                or two_rank != 2 * rank or da[2] != rank or db[-1] != rank):
            return "ISL-E006", MSG_V2_DISAGREE.format(n=n)
        return None
    if any(len(s) != 4 for s in (ga, gb, da, db)):
        return "ISL-E001", MSG_NOT_4D
    if ga[1] not in (1, n) or db[1] not in (1, n):
        return "ISL-E002", MSG_OUTER_DIM.format(n=n)
    if ga[1] != db[1]:
        return "ISL-E003", MSG_OUTER_LAYOUT
    if gb[1] != n or da[1] != n:
        return "ISL-E004", MSG_EXPERT_COUNT
    R = gb[-1]
    if ga[2] != 2 * R or da[2] != R or db[-1] != R:
        return "ISL-E005", MSG_RANK
    return None


def validate_pool(gate_up_a: Any, gate_up_b: Any, down_a: Any, down_b: Any, *,
                  n_shared_experts: int, generation: str = "v1") -> PoolLayout:
    """Upstream's ``set_lora_info`` checks (SPEC §3), in order, first failure wins.

    Buffers ``[S, O, 2R, H]``, ``[S, n, 2F, R]``, ``[S, n, R, F]``, ``[S, O, H, R]``.
    Raises ``ValueError`` with upstream's exact message, else returns the layout.
    ``generation="v2"``: the dense-engine wrapper, which folds checks 2-5 into one
    message and has no 4D check (Python's own errors instead: ``upstream_check``).
    Like upstream it checks nothing else (not H, F, an odd 2F, slot counts, dtypes).
    """
    check_generation(generation)
    shapes = _shapes((gate_up_a, gate_up_b, down_a, down_b))
    failure = upstream_check(shapes, n_shared_experts, generation)
    if failure is not None:
        raise ValueError(failure[1])
    ga, gb = shapes["gate_up_a"], shapes["gate_up_b"]
    outer = ga[1]
    return PoolLayout(n=gb[1], hidden=ga[3], intermediate=gb[2] // 2, max_rank=gb[3],
                      slots=ga[0] if generation == "v2" else gb[0], outer=outer)


# ----------------------------------------------------------------------------
# Diagnosis
# ----------------------------------------------------------------------------

FINDING_TITLES = {
    "ISL-E001": "a buffer is not 4D",
    "ISL-E002": "an outer factor's expert dimension is neither 1 nor n",
    "ISL-E003": "gate-up A and down B use different outer layouts",
    "ISL-E004": "an inner factor's expert count is not n",
    "ISL-E005": "rank dimensions disagree",
    "ISL-D101": "hidden size H disagrees",
    "ISL-D102": "intermediate size F disagrees",
    "ISL-D103": "gate-up B has an odd 2F",
    "ISL-D104": "slot counts differ between buffers",
    "ISL-D105": "mixed dtypes",
    "ISL-D106": "mixed devices",
    "ISL-D107": "NaN or Inf in a buffer",
    "ISL-D108": "more slots than the pool has",
    "ISL-D109": "rank padding is not zero",
}
"""Every finding code ``diagnose_pool`` can report. ``ISL-E…`` codes are upstream's
checks (``validate_pool`` raises them); ``ISL-D…`` codes are what upstream does not
check and users trip over later."""


@dataclass(frozen=True)
class Finding:
    """One thing wrong with a pool: a stable ``code``, what is wrong, how to fix it.

    ``upstream`` is true for the five checks upstream's ``set_lora_info`` raises on.
    ``consequence`` says what upstream does with it when it does not raise.
    """

    code: str
    buffer: str
    message: str
    fix: str
    upstream: bool = False
    consequence: str = ""

    def __str__(self) -> str:
        head = f"[{self.code}] {self.message}"
        return f"{head}\n    fix: {self.fix}" + (f"\n    upstream: {self.consequence}" if self.consequence else "")


@dataclass
class Diagnosis:
    """All findings for one set of four buffers, in upstream's check order first."""

    shapes: dict[str, tuple[int, ...]]
    n: int
    findings: list[Finding] = field(default_factory=list)
    upstream_error: str | None = None
    layout: PoolLayout | None = None

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    @property
    def upstream_findings(self) -> list[Finding]:
        return [f for f in self.findings if f.upstream]

    def __str__(self) -> str:
        lines = [f"Pool diagnosis (n_shared_experts={self.n})"]
        for name in BUFFER_NAMES:
            lines.append(f"  {PRETTY[name]:<10} {SYMBOLS[name]:<14} = {list(self.shapes[name])}")
        if self.upstream_error:
            lines.append(f"sglang 0.5.23 set_lora_info raises: ValueError: {self.upstream_error}")
        else:
            lines.append("sglang 0.5.23 set_lora_info validation: passes")
        if self.ok:
            lines.append("No findings: this pool is consistent.")
        for f in self.findings:
            lines.append(str(f))
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython shows the report
        p.text(str(self))


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _fix_not_4d(name: str, s: tuple[int, ...], n: int) -> str:
    if len(s) == 3:
        return f"add the slot axis: {name}.unsqueeze(0) -> {_fmt((1,) + s)} (one slot)"
    if len(s) == 2:
        if name in ("gate_up_a", "down_b"):
            return (f"add slot and outer-expert axes: {name}.reshape(1, 1, {s[0]}, {s[1]}) -> "
                    f"{_fmt((1, 1) + s)} (shared outer)")
        if name == "gate_up_b":
            if s[0] % n == 0:
                return (f"split the stacked experts: {name}.reshape(1, {n}, {s[0] // n}, {s[1]}) -> "
                        f"{_fmt((1, n, s[0] // n, s[1]))}")
            return f"its height {s[0]} is not divisible by n={n}: this is not a gate/up B for {n} experts"
        if s[1] % n == 0:
            return (f"split the side-by-side experts: {name}.reshape({s[0]}, {n}, {s[1] // n})"
                    f".transpose(0, 1).unsqueeze(0) -> {_fmt((1, n, s[0], s[1] // n))}")
        return f"its width {s[1]} is not divisible by n={n}: this is not a down A for {n} experts"
    return f"give it exactly four axes {SYMBOLS[name]}; it has {len(s)}: {_fmt(s)}"


class _Diagnoser:
    def __init__(self, buffers: Sequence[Any], n: int, hidden: int | None, intermediate: int | None,
                 max_loras: int | None, lora_ranks: Sequence[int] | None) -> None:
        self.buffers = dict(zip(BUFFER_NAMES, buffers))
        self.shapes = _shapes(buffers)
        self.n, self.hidden, self.intermediate = n, hidden, intermediate
        self.max_loras, self.lora_ranks = max_loras, lora_ranks
        self.findings: list[Finding] = []

    def add(self, code: str, buffer: str, message: str, fix: str, consequence: str = "") -> None:
        self.findings.append(Finding(code, buffer, message, fix, code.startswith("ISL-E"), consequence))

    def run(self) -> list[Finding]:
        s, n = self.shapes, self.n
        four_d = {k: len(v) == 4 for k, v in s.items()}
        for name, shape in s.items():
            if not four_d[name]:
                self.add("ISL-E001", name, f"{PRETTY[name]} is {len(shape)}D {_fmt(shape)}; "
                         f"the pool needs 4D {SYMBOLS[name]}", _fix_not_4d(name, shape, n))
        self._outer(four_d)
        self._experts(four_d)
        self._ranks(four_d)
        self._sizes(four_d)
        self._slots(four_d)
        self._tensors()
        return self.findings

    def _outer(self, four_d: dict[str, bool]) -> None:
        s, n = self.shapes, self.n
        for name in ("gate_up_a", "down_b"):
            if four_d[name] and s[name][1] not in (1, n):
                k = s[name][1]
                self.add("ISL-E002", name,
                         f"{PRETTY[name]} has outer expert dimension {k}; it must be 1 (shared) or n={n}",
                         f"if its {k} experts are one shared factor keep one: {name}[:, :1] -> "
                         f"{_fmt((s[name][0], 1) + s[name][2:])}; else re-export it for n={n} -> "
                         f"{_fmt((s[name][0], n) + s[name][2:])}")
        if four_d["gate_up_a"] and four_d["down_b"]:
            oa, ob = s["gate_up_a"][1], s["down_b"][1]
            if oa in (1, n) and ob in (1, n) and oa != ob:
                shared, other = ("gate_up_a", "down_b") if oa == 1 else ("down_b", "gate_up_a")
                self.add("ISL-E003", shared,
                         f"gate-up A has outer dimension {oa} but down B has {ob}: both outer factors "
                         "must be shared (1) or both per expert (n)",
                         f"expand the shared one to every expert (exact): {shared}.expand(-1, {n}, -1, -1)"
                         f" -> {_fmt((s[shared][0], n) + s[shared][2:])}, matching {PRETTY[other]}")

    def _experts(self, four_d: dict[str, bool]) -> None:
        s, n = self.shapes, self.n
        for name in ("gate_up_b", "down_a"):
            if four_d[name] and s[name][1] != n:
                k = s[name][1]
                target = (s[name][0], n) + s[name][2:]
                if k == 1 and name == "gate_up_b" and s[name][2] % n == 0:
                    fix = (f"its {s[name][2]} rows look like {n} experts stacked: "
                           f"{name}.reshape({s[name][0]}, {n}, {s[name][2] // n}, {s[name][3]}) -> "
                           f"{_fmt((s[name][0], n, s[name][2] // n, s[name][3]))}")
                elif k == 1 and name == "down_a" and s[name][3] % n == 0:
                    fix = (f"its {s[name][3]} columns look like {n} experts side by side: "
                           f"{name}.reshape({s[name][0]}, {s[name][2]}, {n}, {s[name][3] // n})"
                           f".transpose(1, 2) -> {_fmt((s[name][0], n, s[name][2], s[name][3] // n))}")
                else:
                    fix = (f"the sink has n={n} shared experts: export one factor per expert -> "
                           f"{_fmt(target)} (or build the sink with n_shared_experts={k})")
                self.add("ISL-E004", name, f"{PRETTY[name]} has {k} experts; the sink has n={n}", fix)

    def _ranks(self, four_d: dict[str, bool]) -> None:
        s = self.shapes
        if not four_d["gate_up_b"]:
            return
        R = s["gate_up_b"][3]
        expected = {"gate_up_a": (2, 2 * R), "down_a": (2, R), "down_b": (3, R)}
        for name, (axis, want) in expected.items():
            if not four_d[name] or s[name][axis] == want:
                continue
            got = s[name][axis]
            target = list(s[name])
            target[axis] = want
            if name == "down_a" and s[name][3] == R and s[name][2] != R:
                fix = f"it looks transposed: {name}.transpose(2, 3) -> {_fmt(s[name][:2] + (R, s[name][2]))}"
            elif name == "down_b" and s[name][2] == R:
                fix = f"it looks transposed: {name}.transpose(2, 3) -> {_fmt(s[name][:2] + (s[name][3], R))}"
            elif name == "gate_up_a" and got == R:
                fix = (f"it holds one half only: put gate A at rows 0..{R - 1} and up A at rows {R}..{2 * R - 1}"
                       f" -> {_fmt(target)} (a fused gate_up A serves both halves: repeat it)")
            elif got < want:
                fix = f"zero-pad axis {axis} from {got} to {want} -> {_fmt(target)}"
            else:
                fix = (f"R is taken from gate-up B's last axis ({R}); pad gate-up B to the larger rank, "
                       f"or cut axis {axis} to {want} -> {_fmt(target)}")
            self.add("ISL-E005", name,
                     f"{PRETTY[name]} axis {axis} is {got}; with R={R} (gate-up B's last axis) it must be {want}",
                     fix)

    def _agree(self, code: str, symbol: str, values: dict[str, float], sink_value: int | None,
               sink_name: str, between_fix: str, sink_fix: str) -> None:
        """One size (H or F) read from several buffers: they must agree, and equal the sink's."""
        consequence = "not checked by set_lora_info; the forward fails with a matmul shape error"
        if len(set(values.values())) > 1:
            parts = ", ".join(f"{PRETTY[k]} has {symbol}={v:g}" for k, v in values.items())
            self.add(code, list(values)[-1], f"{symbol} disagrees: {parts}", between_fix, consequence)
        if sink_value is not None:
            for k, v in values.items():
                if v != sink_value:
                    self.add(code, k, f"{PRETTY[k]} has {symbol}={v:g}; the sink's {sink_name} is {sink_value}",
                             sink_fix, consequence)

    def _sizes(self, four_d: dict[str, bool]) -> None:
        s = self.shapes
        hs = {k: s[k][a] for k, a in (("gate_up_a", 3), ("down_b", 2)) if four_d[k]}
        self._agree("ISL-D101", "H", hs, self.hidden, "hidden size",
                    "export both outer factors for the sink's hidden size",
                    "this adapter was trained for another model: its H must equal the sink's")
        two_f = s["gate_up_b"][2] if four_d["gate_up_b"] else None
        if two_f is not None and two_f % 2:
            self.add("ISL-D103", "gate_up_b", f"gate-up B has 2F={two_f}, which is odd: gate and up halves "
                     "cannot be split", f"2F must be twice down A's F: {_fmt(s['gate_up_b'][:2] + (2 * (two_f // 2), s['gate_up_b'][3]))}"
                     " or larger; re-export gate and up B with F rows each",
                     "shared outer: a raw RuntimeError (shape '[...]' is invalid for input of size ...) "
                     "inside set_lora_info; per-expert outer: wrong output")
        fs: dict[str, float] = {}
        if two_f is not None:
            fs["gate_up_b"] = two_f / 2
        if four_d["down_a"]:
            fs["down_a"] = s["down_a"][3]
        self._agree("ISL-D102", "F", fs, self.intermediate, "(per-rank) F",
                    "both inner factors must come from the same sink (per-rank F under tensor parallelism)",
                    "shard the adapter for this tensor-parallel size, or check that it was trained for this model")

    def _slots(self, four_d: dict[str, bool]) -> None:
        counts = {k: v[0] for k, v in self.shapes.items() if four_d[k]}
        if len(set(counts.values())) > 1:
            most = max(counts.values())
            detail = ", ".join(f"{PRETTY[k]} {v}" for k, v in counts.items())
            short = [k for k, v in counts.items() if v != most]
            self.add("ISL-D104", short[0], f"slot counts differ: {detail}",
                     f"every buffer needs one entry per slot: give {', '.join(PRETTY[k] for k in short)} "
                     f"{most} slots (zero slots are 'no adapter')",
                     "shared outer: IndexError while set_lora_info builds the derived operands; "
                     "per-expert outer: an error or a wrong slot in the forward")
        if self.max_loras is not None and counts:
            most = max(counts.values())
            if most > self.max_loras:
                self.add("ISL-D108", "gate_up_b", f"the buffers have {most} slots but the pool serves "
                         f"max_loras_per_batch={self.max_loras}",
                         f"keep {self.max_loras} slots (buf[:{self.max_loras}]) or raise max_loras_per_batch")

    def _tensors(self) -> None:
        tensors = {k: v for k, v in self.buffers.items() if isinstance(v, torch.Tensor)}
        if len(tensors) < 2:
            return
        dtypes = {k: v.dtype for k, v in tensors.items()}
        if len(set(dtypes.values())) > 1:
            first = next(iter(dtypes.values()))
            self.add("ISL-D105", "gate_up_a", "mixed dtypes: " + ", ".join(
                f"{PRETTY[k]} {str(d).replace('torch.', '')}" for k, d in dtypes.items()),
                f"cast all four to the sink's dtype, e.g. .to({first})",
                "not checked; a matmul of mixed dtypes fails in the forward")
        devices = {k: v.device for k, v in tensors.items()}
        if len(set(devices.values())) > 1:
            self.add("ISL-D106", "gate_up_a", "mixed devices: " + ", ".join(
                f"{PRETTY[k]} {d}" for k, d in devices.items()),
                "move all four to the sink's device with .to(device)",
                "not checked; the forward fails with a device mismatch")
        for k, v in tensors.items():
            if v.is_floating_point() and v.numel() and not v.device.type == "meta":
                bad = int((~torch.isfinite(v)).sum())
                if bad:
                    self.add("ISL-D107", k, f"{PRETTY[k]} holds {bad} NaN/Inf value(s)",
                             "reload the adapter: a finite checkpoint never gives NaN; check the export's dtype "
                             "range (fp16 overflows above 65504)", "not checked; every output of that slot is NaN")
        self._padding(tensors)

    def _padding(self, tensors: dict[str, torch.Tensor]) -> None:
        if len(tensors) != 4 or any(len(self.shapes[k]) != 4 for k in BUFFER_NAMES):
            return
        if upstream_check(self.shapes, self.n) is not None:
            return
        ga, gb, da, db = (tensors[k] for k in BUFFER_NAMES)
        R = gb.shape[3]
        slots = min(t.shape[0] for t in tensors.values())
        if min(t.numel() for t in tensors.values()) == 0 or any(t.device.type == "meta" for t in tensors.values()):
            return

        def used(t: torch.Tensor, axis: int) -> int:
            """One past the highest nonzero rank index of ``t`` along ``axis``."""
            other = tuple(i for i in range(t.dim()) if i != axis)
            nz = (t != 0).any(dim=other) if other else t != 0
            idx = torch.nonzero(nz).flatten()
            return int(idx.max()) + 1 if idx.numel() else 0

        for slot in range(slots):
            r_given = self.lora_ranks[slot] if self.lora_ranks is not None and slot < len(self.lora_ranks) else None
            seen = {"gate A": used(ga[slot, :, :R], 1), "up A": used(ga[slot, :, R:], 1),
                    "gate-up B": used(gb[slot], 2), "down A": used(da[slot], 1), "down B": used(db[slot], 2)}
            if r_given is not None:
                over = {k: v for k, v in seen.items() if v > r_given}
                if over:
                    parts = ", ".join(f"{k} up to rank {v}" for k, v in over.items())
                    self.add("ISL-D109", "gate_up_b", f"slot {slot} has rank {r_given} but nonzero padding: {parts}",
                             f"zero ranks {r_given}..{R - 1} of slot {slot} (LoRAPool.load does this)",
                             "not checked; the padding adds a delta nobody trained")
            elif len({v for v in seen.values() if v}) > 1:
                parts = ", ".join(f"{k} {v}" for k, v in seen.items())
                self.add("ISL-D109", "gate_up_b", f"slot {slot}: the factors use different ranks ({parts})",
                         f"pad every factor of slot {slot} to one rank with zeros past it "
                         "(gate A and up A each from their own half's start)",
                         "not checked; ranks that only one factor uses add nothing or a delta nobody trained")


def diagnose_pool(gate_up_a: Any, gate_up_b: Any, down_a: Any, down_b: Any, *, n_shared_experts: int,
                  hidden_size: int | None = None, intermediate_size: int | None = None,
                  max_loras: int | None = None, lora_ranks: Sequence[int] | None = None) -> Diagnosis:
    """Every finding for four pool buffers; never raises on any input.

    Buffers (tensors or shapes) ``[S, O, 2R, H]``, ``[S, n, 2F, R]``, ``[S, n, R, F]``,
    ``[S, O, H, R]``. Optional ``hidden_size``/``intermediate_size`` (the sink's H and
    per-rank F), ``max_loras`` (slots the pool serves) and ``lora_ranks`` (each slot's
    adapter rank, to check that padding is zero).
    """
    buffers = (gate_up_a, gate_up_b, down_a, down_b)
    try:
        shapes = _shapes(buffers)
    except (TypeError, ValueError) as exc:
        bad = Finding("ISL-E001", "gate_up_a", f"could not read the buffers' shapes: {exc}",
                      "pass four tensors (or four shape tuples)", True)
        return Diagnosis({k: () for k in BUFFER_NAMES}, n_shared_experts, [bad], MSG_NOT_4D)
    failure = upstream_check(shapes, n_shared_experts)
    findings = _Diagnoser(buffers, n_shared_experts, hidden_size, intermediate_size, max_loras, lora_ranks).run()
    layout = None
    if failure is None:
        layout = validate_pool(*shapes.values(), n_shared_experts=n_shared_experts)
    return Diagnosis(shapes, n_shared_experts, findings, failure[1] if failure else None, layout)
