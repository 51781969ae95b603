"""Checking the four pool buffers (docs/reference.md#validation-order).

``validate_pool`` is upstream-exact: the same exception type and message, in the
same order, first failure wins. ``diagnose_pool`` never raises: it reports every
finding, upstream's and the ones upstream leaves to a raw torch error later, each
with a stable code, a one-line message and a concrete fix.

Both accept tensors or bare shapes (tuples), so a reader can try shapes without
allocating anything.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from .catalog import CATALOG, Finding, diagnosis, finding
from .geometry import BUFFER_NAMES, Geometry

PRETTY = {"gate_up_a": "gate-up A", "gate_up_b": "gate-up B", "down_a": "down A", "down_b": "down B"}
SYMBOLS = {"gate_up_a": "[S, O, 2R, H]", "gate_up_b": "[S, n, 2F, R]",
           "down_a": "[S, n, R, F]", "down_b": "[S, O, H, R]"}

# Upstream's words, from the catalog (their one source; docs/reference.md#validation-order). Templates: format them.
MSG_NOT_4D = CATALOG["ISL-E001"].message
MSG_OUTER_DIM = CATALOG["ISL-E002"].message  # {n}
MSG_OUTER_LAYOUT = CATALOG["ISL-E003"].message
MSG_EXPERT_COUNT = CATALOG["ISL-E004"].message
MSG_RANK = CATALOG["ISL-E005"].message
MSG_V2_DISAGREE = CATALOG["ISL-E006"].message  # {n}
GENERATIONS = ("v1", "v2")
"""``v1``: ``InklingBatchDenseMLPWithLoRA``; ``v2``: ``InklingBatchDenseMLPWithLoRAV2``
(the dense engine). Both are in the sglang 0.5.23 wheel."""

# The rest of the module's own words (sglang 0.5.23, srt/models/inkling_common/lora.py),
# raised by SharedSinkLoRA.
MSG_POOL_SHAPE = CATALOG["ISL-E007"].message  # {old_gate_up} {new_gate_up} {old_down} {new_down}
MSG_V2_POOL_SHAPE = CATALOG["ISL-E020"].message  # {old} {new}
MSG_SLOT_RANGE = CATALOG["ISL-E008"].message  # {slot_ids}: every id given, sorted
V1_CLASS, V2_CLASS = "InklingBatchDenseMLPWithLoRA", "InklingBatchDenseMLPWithLoRAV2"
MSG_INELIGIBLE = CATALOG["ISL-E009"].message  # {problems}: joined by "; "
PROBLEM_BACKEND = "multi-slot dense LoRA requires the Triton backend"
PROBLEM_WEIGHTS = "the shared sink does not use linearized BF16 weights"
MSG_V2_NO_ENGINE = CATALOG["ISL-E017"].message  # {cls}
MSG_V2_NOT_BF16 = CATALOG["ISL-E018"].message  # {cls}
MSG_V2_INTERLEAVED = CATALOG["ISL-E019"].message


@dataclass(frozen=True, init=False)
class PoolLayout(Geometry):
    """The geometry that four valid pool buffers spell out (``[S, O, 2R, H]`` and friends,
    in numbers). Upstream's checks let zero extents through, so none is refused here."""

    def _validate(self, about: str = "") -> None:
        """Nothing more than upstream's checks, which ran before the layout was read."""


def shape_of(x: Any) -> tuple[int, ...]:
    """The shape of a tensor, array or bare shape tuple. ``TypeError`` for anything else
    (a size that is no whole number, ``inf`` or ``"3"`` included)."""
    sizes = x.shape if hasattr(x, "shape") else x
    if isinstance(sizes, (str, bytes)):
        raise TypeError(f"a shape is a sequence of whole numbers, got {sizes!r}")
    return tuple(operator.index(d) for d in sizes)


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

    ``v1``: the five checks of docs/reference.md#validation-order in order. ``v2`` has no 4D check: it unpacks
    ``S, O, 2R, _ = gate-up A`` and ``_, _, 2F, R = gate-up B``, reads down B's axis 2,
    then tests checks 2-5 in one condition, left to right, with one message. So on
    ``v2`` a gate-up A or B with another number of axes raises Python's own unpacking
    ``ValueError`` from here, and a down B (or down A) with too few axes
    its own ``IndexError`` (ISL-E023), exactly where upstream's do.
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
    """Upstream's ``set_lora_info`` checks (docs/reference.md#validation-order), in order, first failure wins.

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



@dataclass
class Diagnosis:
    """All findings for one set of four buffers, in upstream's check order first."""

    shapes: dict[str, tuple[int, ...]]
    n: int
    findings: list[Finding] = field(default_factory=list)
    upstream_error: str | None = None
    layout: PoolLayout | None = None
    targets: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """The pool every shape fix leads to, one shape per buffer."""
    moves: dict[str, list[Step] | None] = field(default_factory=dict, repr=False)

    @property
    def fixable(self) -> bool:
        """Whether ``apply_fix`` can reshape all four buffers into ``targets``."""
        return bool(self.moves) and all(m is not None for m in self.moves.values())

    def apply_fix(self, gate_up_a: Any, gate_up_b: Any, down_a: Any, down_b: Any) -> tuple[torch.Tensor, ...]:
        """The four buffers with every suggested shape fix applied, in the order the
        fixes say; they pass ``validate_pool`` for this ``n``. Bare shapes come back as
        ``meta`` tensors. Shapes only: dtype, device and NaN findings are left to you.
        Raises ``ValueError`` naming each buffer that needs re-exporting (no plain fix)."""
        stuck = [PRETTY[k] for k, m in self.moves.items() if m is None]
        if stuck or not self.moves:
            want = ", ".join(f"{PRETTY[k]} {_fmt(t)}" for k, t in self.targets.items()) or "this pool"
            raise ValueError(f"no shape fix for {', '.join(stuck) or 'these buffers'}: re-export "
                             + ("it" if len(stuck) == 1 else "them") + f" for {want}")
        out = []
        for name, buf in zip(BUFFER_NAMES, (gate_up_a, gate_up_b, down_a, down_b)):
            if not isinstance(buf, torch.Tensor):
                t = torch.empty(shape_of(buf), device="meta")
            else:
                t = buf if buf.layout == torch.strided else buf.to_dense()  # the pool is dense
            for _, step, _ in self.moves[name]:
                t = step(t)
            out.append(t)
        return tuple(out)

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
            lines.append(f"sglang 0.5.23 set_lora_info (first generation) raises: ValueError: {self.upstream_error}")
        else:
            lines.append("sglang 0.5.23 set_lora_info (first generation) validation: passes")
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


# ----------------------------------------------------------------------------
# Fixes that compose: one target pool, one move per buffer
# ----------------------------------------------------------------------------

Step = tuple[str, Callable[[torch.Tensor], torch.Tensor], bool]
"""One step of a fix: how to say it, how to do it, and whether it is exact (not a guess)."""


def _mode(values: Sequence[int]) -> int | None:
    """The most frequent value, the first one seen on a tie."""
    return max(values, key=lambda v: (values.count(v), -values.index(v))) if values else None


def _canonical(name: str, s: tuple[int, ...], n: int) -> tuple[tuple[int, ...], list[Step]] | None:
    """A 4D reading of buffer ``name`` of shape ``s`` and the steps that give it four
    axes, or ``None`` when no reading is plain (then the buffer must be re-exported)."""
    if len(s) == 4:
        return s, []
    if len(s) > 4 and all(d == 1 for d in s[:len(s) - 4]):
        k = len(s) - 4
        return s[k:], [(f"drop {k} leading axis(es) of size 1: .reshape{s[k:]}", lambda t, k=k: t.reshape(t.shape[k:]),
                        True)]
    if len(s) == 3:
        return (None,) + s, []  # one slot's factor: its slot is placed with the slot step
    if len(s) == 2:
        x, y = s
        if name in ("gate_up_a", "down_b"):
            return (None, 1, x, y), [("add the outer-expert axis (shared outer): .unsqueeze(0)",
                                      lambda t: t.unsqueeze(0), True)]
        if name == "gate_up_b" and n and x % n == 0:
            return (None, n, x // n, y), [(f"split the stacked experts: .reshape({n}, {x // n}, {y})",
                                           lambda t: t.reshape(n, x // n, y), True)]
        if name == "down_a" and n and y % n == 0:
            return (None, n, x, y // n), [(f"split the side-by-side experts: .reshape({x}, {n}, {y // n})"
                                           ".transpose(0, 1)", lambda t: t.reshape(x, n, y // n).transpose(0, 1), True)]
    return None


def _plan(shapes: dict[str, tuple[int, ...]], n: int, hidden: int | None,
          intermediate: int | None) -> tuple[dict[str, tuple[int, ...]], dict[str, Any]]:
    """The pool the four buffers most plausibly mean (``{name: target shape}``) and each
    buffer's 4D reading (``None`` where there is none)."""
    read = {k: _canonical(k, s, n) for k, s in shapes.items()}
    c = {k: (v[0] if v else None) for k, v in read.items()}
    slots = [v[0] for v in c.values() if v and v[0] is not None]
    S = max(slots) if slots else 1
    ranks = [v for v in ((c["gate_up_b"] or (0,) * 4)[3], (c["down_a"] or (0,) * 4)[2],
                         (c["down_b"] or (0,) * 4)[3]) if v]
    if c["gate_up_a"] and c["gate_up_a"][2] % 2 == 0:
        ranks.append(c["gate_up_a"][2] // 2)
    R = _mode(ranks) or 0
    Hs = [v[i] for v, i in ((c["gate_up_a"], 3), (c["down_b"], 2)) if v]
    H = hidden if hidden is not None else (_mode(Hs) or 0)
    # F from the inner factors that already have their n experts (a stacked one reads n*F)
    Fs, stacked = [], []
    for name, axis, halve in (("gate_up_b", 2, True), ("down_a", 3, False)):
        if c[name] and (not halve or c[name][axis] % 2 == 0) and c[name][axis]:
            (Fs if c[name][1] == n else stacked).append(c[name][axis] // (2 if halve else 1))
    F = intermediate if intermediate is not None else (_mode(Fs or stacked) or 0)
    outers = [v[1] for v in (c["gate_up_a"], c["down_b"]) if v and v[1] in (1, n)]
    O = n if len(set(outers)) > 1 else (outers[0] if outers else 1)
    # a transposed outer factor reads H and R swapped: trust the other buffers' reading
    target = {"gate_up_a": (S, O, 2 * R, H), "gate_up_b": (S, n, 2 * F, R), "down_a": (S, n, R, F),
              "down_b": (S, O, H, R)}
    return target, read


def _pad_or_cut(axis: int, got: int, want: int, halves: bool) -> Step:
    if halves:  # gate-up A: gate rows, then up rows, each padded or cut on its own
        g, w = got // 2, want // 2

        def do(t: torch.Tensor) -> torch.Tensor:
            parts = [t.narrow(axis, 0, g), t.narrow(axis, g, g)]
            return torch.cat([_fit(p, axis, w) for p in parts], dim=axis)
        return (f"pad (or cut) each half of axis {axis} from {g} to {w} rows, gate A then up A", do, w >= g)
    return (f"zero-pad (or cut) axis {axis} from {got} to {want}", lambda t: _fit(t, axis, want), want >= got)


def _fit(t: torch.Tensor, axis: int, size: int) -> torch.Tensor:
    have = t.shape[axis]
    if have >= size:
        return t.narrow(axis, 0, size)
    pad = list(t.shape)
    pad[axis] = size - have
    return torch.cat([t, t.new_zeros(pad)], dim=axis)


def _move(name: str, shape: tuple[int, ...], target: tuple[int, ...], reading: Any,
          n: int) -> list[Step] | None:
    """The steps that take buffer ``name`` from ``shape`` to ``target``, or ``None``."""
    if reading is None:
        return None
    c, steps = list(reading[0]), list(reading[1])
    S = target[0]
    if c[0] is None:
        c[0] = S
        if S == 1:
            steps.append(("add the slot axis: .unsqueeze(0)", lambda t: t.unsqueeze(0), True))
        else:
            steps.append((f"it is one slot's factor: put it in slot 0 of a zero buffer of {S} slots",
                          lambda t, S=S: torch.cat([t.unsqueeze(0), t.new_zeros((S - 1,) + tuple(t.shape))]),
                          True))
    if (c[2], c[3]) != tuple(target[2:]) and (c[3], c[2]) == tuple(target[2:]):
        steps.append(("it is transposed: .transpose(2, 3)", lambda t: t.transpose(2, 3), True))
        c[2], c[3] = c[3], c[2]
    if c[1] != target[1]:
        k, want = c[1], target[1]
        if name in ("gate_up_a", "down_b") and k == 1:
            steps.append((f"give the shared factor to every expert (exact): .expand(-1, {want}, -1, -1)",
                          lambda t, w=want: t.expand(-1, w, -1, -1), True))
        elif name in ("gate_up_a", "down_b") and want == 1:
            steps.append((f"keep one of its {k} outer factors, if they are one shared factor: [:, :1]",
                          lambda t: t[:, :1], False))
        elif name == "gate_up_b" and k == 1 and c[2] == n * target[2]:
            steps.append((f"split the {n} stacked experts: .reshape({S}, {n}, {target[2]}, {c[3]})",
                          lambda t, t4=target: t.reshape(t4[0], n, t4[2], t.shape[3]), True))
            c[2] = target[2]
        elif name == "down_a" and k == 1 and c[3] == n * target[3]:
            steps.append((f"split the {n} side-by-side experts: .reshape({S}, {c[2]}, {n}, {target[3]})"
                          ".transpose(1, 2)",
                          lambda t, t4=target: t.reshape(t4[0], t.shape[2], n, t4[3]).transpose(1, 2), True))
            c[3] = target[3]
        else:
            return None
        c[1] = want
    rank_axis = {"gate_up_a": 2, "gate_up_b": 3, "down_a": 2, "down_b": 3}[name]
    if c[rank_axis] != target[rank_axis]:
        halves = name == "gate_up_a"
        if halves and c[2] % 2:
            return None
        steps.append(_pad_or_cut(rank_axis, c[rank_axis], target[rank_axis], halves))
        c[rank_axis] = target[rank_axis]
    if c[0] < S:
        steps.append((f"add {S - c[0]} zero slot(s) (a zero slot is 'no adapter')",
                      lambda t, S=S: torch.cat([t, t.new_zeros((S - t.shape[0],) + tuple(t.shape[1:]))]), True))
        c[0] = S
    return steps if tuple(c) == tuple(target) else None


def _describe(steps: list[Step] | None, target: tuple[int, ...]) -> str:
    if steps is None:
        return ""
    how = "; then ".join(s[0] + ("" if s[2] else " (a guess: check it)") for s in steps)
    return how + f" -> {_fmt(target)}"


_CHUNK = 1 << 20
"""Elements per step of a value check: the temporaries stay this small for any view."""


def _stored(t: torch.Tensor) -> torch.Tensor:
    """The values a tensor really stores: a sparse tensor's values, and a view with
    stride-0 axes (``expand``) cut to one entry along each of them. No copy."""
    if t.layout == torch.sparse_coo:
        return t._values()
    if t.layout != torch.strided:  # CSR, CSC, BSR, BSC
        return t.values()
    index = tuple(slice(0, 1) if st == 0 and d > 1 else slice(None) for d, st in zip(t.shape, t.stride()))
    return t[index] if index else t


def _chunks(t: torch.Tensor):
    """``t`` in views of at most about ``_CHUNK`` elements (along its leading axes)."""
    if t.dim() == 0 or t.numel() <= _CHUNK:
        yield t
        return
    step = max(1, _CHUNK // max(1, t[0].numel()))
    for i in range(0, t.shape[0], step):
        part = t[i:i + step]
        if part.numel() > _CHUNK and part.shape[0] == 1:
            yield from _chunks(part[0])
        else:
            yield part


def _count_nonfinite(t: torch.Tensor) -> int:
    if not (t.is_floating_point() and t.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)):
        return 0  # torch has no isfinite for float8 (its dtype is diagnosed on its own); integers are finite
    return sum(int((~torch.isfinite(c)).sum()) for c in _chunks(_stored(t)))


def _any_nonzero(t: torch.Tensor) -> bool:
    return any(bool((c != 0).any()) for c in _chunks(_stored(t)))


D103_UPSTREAM = ("shared outer: a raw RuntimeError from torch's view (ISL-E012's words) inside "
                 "set_lora_info (ISL-E012); per-expert outer: set_lora_info accepts it, nothing checks it "
                 "before the forward")
D104_UPSTREAM = ("set_lora_info raises only when down A has fewer slots than gate-up B (shared outer: an "
                 "IndexError, ISL-E013) and accepts every other difference; the kernels then index each buffer "
                 "by slot id with no bound (sgemm_lora_a.py), reading past a shorter buffer")
"""What sglang 0.5.23 does with an odd 2F and with different slot counts (its code read)."""

_SHAPE_CODES = ("ISL-E001", "ISL-E002", "ISL-E003", "ISL-E004", "ISL-E005", "ISL-D101", "ISL-D102", "ISL-D104")


class _Diagnoser:
    def __init__(self, buffers: Sequence[Any], n: int, hidden: int | None, intermediate: int | None,
                 max_loras: int | None, lora_ranks: Sequence[int] | None) -> None:
        self.buffers = dict(zip(BUFFER_NAMES, buffers))
        self.shapes = _shapes(buffers)
        self.n, self.hidden, self.intermediate = n, hidden, intermediate
        self.max_loras, self.lora_ranks = max_loras, lora_ranks
        self.findings: list[Finding] = []
        self.targets, readings = _plan(self.shapes, n, hidden, intermediate)
        self.moves = {k: _move(k, self.shapes[k], self.targets[k], readings[k], n) for k in BUFFER_NAMES}

    def reread(self, name: str) -> bool:
        """Whether the planned fix changes how this buffer's sizes are read (a transpose,
        an expert split): then its H/F are reported once, with that fix, not again."""
        return any(word in step[0] for step in self.moves[name] or () for word in ("transposed", "experts"))

    def add(self, code: str, buffer: str, fix: str, consequence: str = "", /, **fields: Any) -> None:
        """One finding, filled from ``fields``: an upstream check (``ISL-E…``) in the
        diagnosis' words (its entry's ``diagnosis``: upstream's message only names the
        check), else the catalog's message."""
        # Shape findings share one plan, so that their fixes compose into four buffers
        # that validate; a buffer with no plain move keeps the finding's own advice.
        if code in _SHAPE_CODES and self.moves[buffer]:
            fix = _describe(self.moves[buffer], self.targets[buffer])
        elif code in _SHAPE_CODES and self.moves[buffer] == [] and all(m is not None for m in self.moves.values()):
            # this buffer is right for the pool the others mean: the fix is elsewhere
            fix = "; ".join(f"{PRETTY[k]}: {_describe(m, self.targets[k])}" for k, m in self.moves.items() if m)
        self.findings.append(diagnosis(code, buffer, fix=fix, **fields) if CATALOG[code].diagnosis
                             else finding(code, buffer, fix=fix, consequence=consequence, **fields))

    def run(self) -> list[Finding]:
        s, n = self.shapes, self.n
        four_d = {k: len(v) == 4 for k, v in s.items()}
        for name, shape in s.items():
            if not four_d[name]:
                self.add("ISL-E001", name, _fix_not_4d(name, shape, n), name=PRETTY[name], ndim=len(shape),
                         shape=_fmt(shape), symbol=SYMBOLS[name])
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
                         f"if its {k} experts are one shared factor keep one: {name}[:, :1] -> "
                         f"{_fmt((s[name][0], 1) + s[name][2:])}; else re-export it for n={n} -> "
                         f"{_fmt((s[name][0], n) + s[name][2:])}", name=PRETTY[name], k=k, n=n)
        if four_d["gate_up_a"] and four_d["down_b"]:
            oa, ob = s["gate_up_a"][1], s["down_b"][1]
            if oa in (1, n) and ob in (1, n) and oa != ob:
                shared, other = ("gate_up_a", "down_b") if oa == 1 else ("down_b", "gate_up_a")
                self.add("ISL-E003", shared,
                         f"expand the shared one to every expert (exact): {shared}.expand(-1, {n}, -1, -1)"
                         f" -> {_fmt((s[shared][0], n) + s[shared][2:])}, matching {PRETTY[other]}",
                         gate_up_a=oa, down_b=ob)

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
                self.add("ISL-E004", name, fix, name=PRETTY[name], k=k, n=n)

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
            self.add("ISL-E005", name, fix, name=PRETTY[name], axis=axis, got=got, R=R, want=want)

    def _agree(self, code: str, symbol: str, values: dict[str, float], sink_value: int | None,
               sink_name: str, between_fix: str, sink_fix: str) -> None:
        """One size (H or F) read from several buffers: they must agree, and equal the sink's."""
        consequence = "not checked by set_lora_info; the forward fails with a matmul shape error"
        # a transposed or stacked buffer is one finding (with its fix), not two
        values = {k: v for k, v in values.items() if not self.reread(k)}
        if len(set(values.values())) > 1:
            parts = ", ".join(f"{PRETTY[k]} has {symbol}={v:g}" for k, v in values.items())
            self.add(code, list(values)[-1], between_fix, consequence, detail=parts)
        if sink_value is not None:
            for k, v in values.items():
                if v != sink_value:
                    detail = f"{PRETTY[k]} has {symbol}={v:g}; the sink's {sink_name} is {sink_value}"
                    self.add(code, k, sink_fix, consequence, detail=detail)

    def _sizes(self, four_d: dict[str, bool]) -> None:
        s = self.shapes
        hs = {k: s[k][a] for k, a in (("gate_up_a", 3), ("down_b", 2)) if four_d[k]}
        self._agree("ISL-D101", "H", hs, self.hidden, "hidden size",
                    "export both outer factors for the sink's hidden size",
                    "this adapter was trained for another model: its H must equal the sink's")
        two_f = s["gate_up_b"][2] if four_d["gate_up_b"] else None
        if two_f is not None and two_f % 2:
            F = self.targets["gate_up_b"][2] // 2
            self.add("ISL-D103", "gate_up_b",
                     f"re-export gate and up B with F = {F} rows each (F as down A has it) -> "
                     f"{_fmt(self.targets['gate_up_b'])}",
                     D103_UPSTREAM, two_f=two_f)
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
            self.add("ISL-D104", short[0],
                     f"every buffer needs one entry per slot: give {', '.join(PRETTY[k] for k in short)} "
                     f"{most} slots (zero slots are 'no adapter')",
                     D104_UPSTREAM, detail=detail)
        if self.max_loras is not None and counts:
            most = max(counts.values())
            if most > self.max_loras:
                self.add("ISL-D108", "gate_up_b",
                         f"keep {self.max_loras} slots (buf[:{self.max_loras}]) or raise max_loras_per_batch",
                         slots=most, max_loras=self.max_loras)

    def _tensors(self) -> None:
        tensors = {k: v for k, v in self.buffers.items() if isinstance(v, torch.Tensor)}
        if len(tensors) < 2:
            return
        dtypes = {k: v.dtype for k, v in tensors.items()}
        if len(set(dtypes.values())) > 1:
            first = next(iter(dtypes.values()))
            self.add("ISL-D105", "gate_up_a", f"cast all four to the sink's dtype, e.g. .to({first})",
                     "not checked; a matmul of mixed dtypes fails in the forward", detail=", ".join(
                         f"{PRETTY[k]} {str(d).replace('torch.', '')}" for k, d in dtypes.items()))
        devices = {k: v.device for k, v in tensors.items()}
        if len(set(devices.values())) > 1:
            self.add("ISL-D106", "gate_up_a", "move all four to the sink's device with .to(device)",
                     "not checked; the forward fails with a device mismatch",
                     detail=", ".join(f"{PRETTY[k]} {d}" for k, d in devices.items()))
        for k, v in tensors.items():
            if v.is_floating_point() and v.numel() and not v.device.type == "meta":
                bad = _count_nonfinite(v)
                if bad:
                    self.add("ISL-D107", k,
                             "reload the adapter: a finite checkpoint never gives NaN; check the export's dtype "
                             "range (fp16 overflows above 65504)", "not checked; every output of that slot is NaN",
                             buffer=PRETTY[k], count=bad)
        self._padding(tensors)

    def _padding(self, tensors: dict[str, torch.Tensor]) -> None:
        if len(tensors) != 4 or any(len(self.shapes[k]) != 4 for k in BUFFER_NAMES):
            return
        if upstream_check(self.shapes, self.n) is not None:
            return
        ga, gb, da, db = (tensors[k] for k in BUFFER_NAMES)
        R = gb.shape[3]
        slots = min(t.shape[0] for t in tensors.values())
        if min(t.numel() for t in tensors.values()) == 0 or any(
                t.device.type == "meta" or t.layout != torch.strided for t in tensors.values()):
            return

        def used(t: torch.Tensor, axis: int) -> int:
            """One past the highest nonzero rank index of ``t`` along ``axis`` (one index
            at a time, in chunks: no temporary of ``t``'s size)."""
            for i in range(t.shape[axis] - 1, -1, -1):
                if _any_nonzero(t.select(axis, i)):
                    return i + 1
            return 0

        # with the slots' ranks given, only those slots are read (a huge expanded view stays cheap)
        for slot in range(min(slots, len(self.lora_ranks)) if self.lora_ranks is not None else slots):
            r_given = self.lora_ranks[slot] if self.lora_ranks is not None and slot < len(self.lora_ranks) else None
            seen = {"gate A": used(ga[slot, :, :R], 1), "up A": used(ga[slot, :, R:], 1),
                    "gate-up B": used(gb[slot], 2), "down A": used(da[slot], 1), "down B": used(db[slot], 2)}
            if r_given is not None:
                over = {k: v for k, v in seen.items() if v > r_given}
                if over:
                    parts = ", ".join(f"{k} up to rank {v}" for k, v in over.items())
                    self.add("ISL-D109", "gate_up_b",
                             f"zero ranks {r_given}..{R - 1} of slot {slot} (LoRAPool.load does this)",
                             "not checked; the padding adds a delta nobody trained",
                             slot=slot, detail=f"rank {r_given} but nonzero padding: {parts}")
            elif len({v for v in seen.values() if v}) > 1:
                parts = ", ".join(f"{k} {v}" for k, v in seen.items())
                self.add("ISL-D109", "gate_up_b",
                         f"pad every factor of slot {slot} to one rank with zeros past it "
                         "(gate A and up A each from their own half's start)",
                         "not checked; ranks that only one factor uses add nothing or a delta nobody trained",
                         slot=slot, detail=f"the factors use different ranks ({parts})")


def _check_size(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"diagnose_pool: {name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"diagnose_pool: {name} must be at least {minimum}, got {value}")


def diagnose_pool(gate_up_a: Any, gate_up_b: Any, down_a: Any, down_b: Any, *, n_shared_experts: int,
                  hidden_size: int | None = None, intermediate_size: int | None = None,
                  max_loras: int | None = None, lora_ranks: Sequence[int] | None = None) -> Diagnosis:
    """Every finding for four pool buffers; never raises on any input.

    Buffers (tensors or shapes) ``[S, O, 2R, H]``, ``[S, n, 2F, R]``, ``[S, n, R, F]``,
    ``[S, O, H, R]``. Optional ``hidden_size``/``intermediate_size`` (the sink's H and
    per-rank F), ``max_loras`` (slots the pool serves) and ``lora_ranks`` (each slot's
    adapter rank, to check that padding is zero).

    Never raises on any buffers: what cannot be read is a finding. The sizes are the
    caller's settings: ``TypeError`` when ``n_shared_experts`` (or a given
    ``hidden_size``/``intermediate_size``/``max_loras``) is not an ``int`` or
    ``lora_ranks`` not a sequence of ints, ``ValueError``
    when ``n_shared_experts`` is below 1 or a size below 0. Value checks (NaN, padding)
    read each buffer's stored values in chunks, never a temporary of a view's size.
    """
    _check_size("n_shared_experts", n_shared_experts, minimum=1)
    for name, value in (("hidden_size", hidden_size), ("intermediate_size", intermediate_size),
                        ("max_loras", max_loras)):
        if value is not None:
            _check_size(name, value, minimum=0)
    if lora_ranks is not None and (isinstance(lora_ranks, (str, bytes)) or not all(
            isinstance(r, int) and not isinstance(r, bool) for r in lora_ranks)):
        raise TypeError(f"diagnose_pool: lora_ranks must be a sequence of ints (each slot's rank), got {lora_ranks!r}")
    buffers = (gate_up_a, gate_up_b, down_a, down_b)
    try:
        shapes = _shapes(buffers)
    except Exception as exc:  # noqa: BLE001 - any object may come in; what cannot be read is a finding
        bad = finding("ISL-D110", "gate_up_a", upstream=True, error=exc)
        return Diagnosis({k: () for k in BUFFER_NAMES}, n_shared_experts, [bad], MSG_NOT_4D)
    failure = upstream_check(shapes, n_shared_experts)
    diagnoser = _Diagnoser(buffers, n_shared_experts, hidden_size, intermediate_size, max_loras, lora_ranks)
    findings = diagnoser.run()
    layout = None
    if failure is None:
        layout = validate_pool(*shapes.values(), n_shared_experts=n_shared_experts)
    return Diagnosis(shapes, n_shared_experts, findings, failure[1] if failure else None, layout,
                     diagnoser.targets, diagnoser.moves)


def suggested_buffers(gate_up_a: Any, gate_up_b: Any, down_a: Any, down_b: Any, *, n_shared_experts: int,
                      hidden_size: int | None = None, intermediate_size: int | None = None
                      ) -> tuple[torch.Tensor, ...]:
    """``diagnose_pool(...).apply_fix(...)``: the four buffers as the diagnosis fixes them."""
    d = diagnose_pool(gate_up_a, gate_up_b, down_a, down_b, n_shared_experts=n_shared_experts,
                      hidden_size=hidden_size, intermediate_size=intermediate_size)
    return d.apply_fix(gate_up_a, gate_up_b, down_a, down_b)
