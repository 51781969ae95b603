"""Checks for the course's exercises: each takes the reader's answer and the objects of
the notebook, and says right or wrong, why, and a hint.

An exercise cell ends with a check (``il.exercises.sink_shapes(answer, sink)``), which
shows a ``Verdict``; an answer left as ``...`` is "not answered yet", never an error,
so "Run All" goes on. The solution cells call the same check with
``.assert_right()``, which raises when the check disagrees with the solution: the
notebook run in CI keeps every check honest. The expected values come from the
library's own functions, never from a second copy of their logic.
"""
from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check: ``right`` is True, False, or None (not answered yet)."""

    exercise: str
    right: bool | None
    why: str
    hint: str = ""

    def __bool__(self) -> bool:
        return self.right is True

    def __str__(self) -> str:
        if self.right:
            return f"✓ {self.exercise}: right. {self.why}".rstrip()
        head = (f"… {self.exercise}: not answered yet (replace the ... with your answer)." if self.right is None
                else f"✗ {self.exercise}: not yet. {self.why}")
        return head + (f"\n  hint: {self.hint}" if self.hint else "")

    __repr__ = __str__

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def assert_right(self) -> "Verdict":
        """``self`` when right; else ``AssertionError`` with the verdict (for solution cells)."""
        if not self.right:
            raise AssertionError(str(self))
        return self


def _unanswered(*answers: Any) -> bool:
    return any(a is Ellipsis for a in answers)


ANSWER_LIMIT = 4096
"""The most entries a list-of-numbers answer may have: the course's answers are short,
and a longer one (a 10**7-element tensor) is wrong without being read element by element."""


def _ints(value: Any) -> tuple[int, ...] | str:
    """A list of whole numbers from a tuple, list, ``torch.Size``, range or integer
    tensor, read at once (never element by element for a tensor); else why not, in
    words. A float (``12.9``, and ``12.0`` too), a bool or a string is no whole number."""
    if isinstance(value, (str, bytes)):
        return f"expected whole numbers, got the string {value!r}"
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
            return f"expected whole numbers, got a {str(value.dtype).removeprefix('torch.')} tensor"
        if value.numel() > ANSWER_LIMIT:
            return f"expected a few whole numbers, got a tensor of {value.numel()} values"
        return tuple(int(v) for v in value.flatten().tolist())
    try:
        items = list(itertools.islice(iter(value), ANSWER_LIMIT + 1))
    except TypeError:
        return f"expected whole numbers, got {type(value).__name__}"
    if len(items) > ANSWER_LIMIT:
        return f"expected a few whole numbers, got more than {ANSWER_LIMIT}"
    for v in items:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            return f"expected whole numbers, but {v!r} ({type(v).__name__}) is none"
    return tuple(int(v) for v in items)


def _shape(value: Any) -> tuple[int, ...] | None:
    """A shape from a tuple/list of whole numbers, a ``torch.Size`` or a tensor (its
    shape); None otherwise."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    got = _ints(value)
    return None if isinstance(got, str) else got


def _boolean(value: Any) -> bool | None:
    """``True`` or ``False`` (a bool, or numpy's); None for anything else: the string
    ``"False"`` is no answer of False."""
    return bool(value) if type(value).__name__ in ("bool", "bool_") else None


def _number(value: Any) -> float | None:
    """A finite real number (not a bool, not a string); None otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        return None
    return float(value)


def _tensor_verdict(exercise: str, answer: Any, expected: torch.Tensor, hint: str,
                    mistakes: dict[str, torch.Tensor] | None = None) -> Verdict:
    """Right when ``answer`` is a tensor equal to ``expected`` (float tolerance);
    ``mistakes``: {what that mistake is: the tensor it gives}, named when matched."""
    if _unanswered(answer):
        return Verdict(exercise, None, "", hint)
    if not isinstance(answer, torch.Tensor):
        return Verdict(exercise, False, f"expected a tensor, got {type(answer).__name__}", hint)
    if answer.is_complex() or answer.dtype == torch.bool:
        return Verdict(exercise, False, f"expected a real-valued tensor, got {answer.dtype}", hint)
    if tuple(answer.shape) != tuple(expected.shape):
        return Verdict(exercise, False, f"its shape is {list(answer.shape)}; the answer's is {list(expected.shape)}",
                       hint)
    close = lambda a, b: torch.allclose(a.double(), b.double(), rtol=1e-6, atol=1e-8)  # noqa: E731
    if close(answer, expected):
        return Verdict(exercise, True, f"{list(expected.shape)}, the same values as the library computes.")
    for mistake, wrong in (mistakes or {}).items():
        if tuple(wrong.shape) == tuple(answer.shape) and close(answer, wrong):
            return Verdict(exercise, False, f"the shape is right, but this is {mistake}", hint)
    err = float((answer.double() - expected.double()).norm() / (expected.double().norm() or 1.0))
    return Verdict(exercise, False, f"the shape is right, the values are not (relative error {err:.2g})", hint)


# -- 01 · the shared sink ----------------------------------------------------------------

def sink_shapes(w13: Any, w2: Any, sink) -> Verdict:
    """01: the shapes of ``sink.w13`` and ``sink.w2``, written from n, H, F."""
    name, hint = "the base weights' shapes", "w13 maps H to gate and up (2F rows) per expert; w2 maps F back to H"
    if _unanswered(w13, w2):
        return Verdict(name, None, "", hint)
    want13, want2 = tuple(sink.w13.shape), tuple(sink.w2.shape)
    got13, got2 = _shape(w13), _shape(w2)
    if (got13, got2) == (want13, want2):
        return Verdict(name, True, f"w13 {list(want13)} = [n, 2F, H], w2 {list(want2)} = [n, H, F].")
    n, F2, H = want13
    wrong = []
    if got13 != want13:
        why = (" (one F: gate and up are stacked, 2F rows)" if got13 == (n, F2 // 2, H) else
               " (rows and columns swapped: a weight is [out, in])" if got13 == (n, H, F2) else "")
        wrong.append(f"w13 is not {list(got13) if got13 else w13!r}{why}")
    if got2 != want2:
        why = " (rows and columns swapped: a weight is [out, in])" if got2 == (n, F2 // 2, H) else ""
        wrong.append(f"w2 is not {list(got2) if got2 else w2!r}{why}")
    return Verdict(name, False, "; ".join(wrong), hint)


def gate_up_split(gate: Any, up: Any, y: torch.Tensor, sink) -> Verdict:
    """01: the gate and up features ``[T, n, F]`` of ``y = x @ w13_lin.T`` ``[T, n*2F]``."""
    from .sink import gate_up_rows

    n, F = sink.n_shared_experts, sink.intermediate_size
    per_expert = y.view(y.shape[0], n, 2 * F)
    g_rows, u_rows = gate_up_rows(F, sink.interleaved)
    hint = ("view y as [T, n, 2F] first; in the interleaved layout gate f is column 2f and up f is 2f+1, "
            "so a step-2 slice takes each")
    if _unanswered(gate, up):
        return Verdict("gate and up from y", None, "", hint)
    other_gate, other_up = gate_up_rows(F, not sink.interleaved)
    mistakes = {"the other layout's rows": per_expert[..., other_gate], "up, not gate": per_expert[..., u_rows]}
    g = _tensor_verdict("gate", gate, per_expert[..., g_rows], hint, mistakes)
    u = _tensor_verdict("up", up, per_expert[..., u_rows], hint,
                        {"the other layout's rows": per_expert[..., other_up], "gate, not up": per_expert[..., g_rows]})
    if g and u:
        return Verdict("gate and up from y", True, f"both {list(per_expert[..., g_rows].shape)} = [T, n, F].")
    return Verdict("gate and up from y", False, "; ".join(f"{v.exercise}: {v.why}" for v in (g, u) if not v), hint)


# -- 02 · the pool -----------------------------------------------------------------------

def pool_shapes(answer: Any, pool) -> Verdict:
    """02: the four buffer shapes of ``pool``, as ``{"gate_up_a": (...), ...}``."""
    expected = {name: tuple(shape) for name, shape in pool.geometry.buffer_shapes().items()}
    name = "the four buffer shapes"
    hint = "slot axis first, then the expert axis (O for the outer factors, n for the inner), then [out, in]"
    if _unanswered(answer) or (isinstance(answer, dict) and _unanswered(*answer.values())):
        return Verdict(name, None, "", hint)
    if not isinstance(answer, dict) or set(answer) != set(expected):
        return Verdict(name, False, f"give a dict with the keys {sorted(expected)}", hint)
    wrong = [_shape_slip(k, v, expected[k]) for k, v in answer.items() if _shape(v) != expected[k]]
    if wrong:
        return Verdict(name, False, "; ".join(wrong), hint)
    return Verdict(name, True, ", ".join(f"{k} {list(v)}" for k, v in expected.items()) + ".")


def _shape_slip(name: str, answer: Any, expected: tuple[int, ...]) -> str:
    """What is wrong with the shape ``answer`` of buffer ``name``, without saying the
    right one (the check must leave the working to the reader)."""
    got = _shape(answer)
    if got is None:
        return f"{name}: {answer!r} is no shape (give a tuple of sizes)"
    if len(got) != len(expected):
        return f"{name} {list(got)} has {len(got)} axes; every buffer has {len(expected)}"
    if sorted(got) == sorted(expected):
        return f"{name} {list(got)} has the right sizes in the wrong order"
    off = [str(i) for i, (g, e) in enumerate(zip(got, expected)) if g != e]
    return f"{name} {list(got)}: axis {' and '.join(off)} {'is' if len(off) == 1 else 'are'} off"


def gate_delta(answer: Any, pool, x: torch.Tensor, slot: int, expert: int) -> Verdict:
    """02: the gate features' LoRA delta ``[F]`` of one token ``x [H]`` for one slot and
    expert, from the pool buffers (their B already carries the scaling)."""
    R, F = pool.max_rank, pool.geometry.intermediate
    outer = 0 if pool.geometry.outer == 1 else expert
    a, b = pool.gate_up_a[slot, outer], pool.gate_up_b[slot, expert]
    expected = b[:F] @ (a[:R] @ x)
    hint = ("shrink x with the gate half of this slot's gate-up A (its first R rows; a shared outer A has one "
            "expert entry), then expand with the gate half of this expert's gate-up B (its first F rows)")
    return _tensor_verdict("the gate delta of one token", answer, expected, hint,
                           {"the up delta": b[F:] @ (a[R:] @ x), "the up shrink fed into gate B": b[:F] @ (a[R:] @ x)})


# -- 03 · errors -------------------------------------------------------------------------

def fixed_gate_up_b(answer: Any, pool) -> Verdict:
    """03: a flat-exported gate-up B reshaped back so that ``set_lora_info`` accepts the
    pool, with every value where it belongs."""
    from .errors import find_entry
    from .validate import validate_pool

    S, n, F2, R = pool.gate_up_b.shape
    name = "gate-up B reshaped"
    hint = ("the flat export stacked the n experts along the rows of one expert entry: give them their own "
            "axis back, in the pool's order [S, n, 2F, R], with a reshape")
    if _unanswered(answer):
        return Verdict(name, None, "", hint)
    if not isinstance(answer, torch.Tensor):
        return Verdict(name, False, f"expected a tensor, got {type(answer).__name__}", hint)
    try:
        validate_pool(pool.gate_up_a, answer, pool.down_a, pool.down_b, n_shared_experts=n)
    except ValueError as exc:
        entry = find_entry(exc)
        return Verdict(name, False, f"set_lora_info would still raise {entry.code if entry else ''} ({exc})", hint)
    if tuple(answer.shape) != (S, n, F2, R):
        return Verdict(name, False, f"the checks pass, but {list(answer.shape)} is not the pool's gate-up B shape", hint)
    if not torch.equal(answer, pool.gate_up_b):
        return Verdict(name, False, "the shape is right, but values moved: reshape (a view), do not transpose", hint)
    return Verdict(name, True, f"{[S, n, F2, R]}, and every value is where the pool had it.")


def first_error(answer: Any, shapes: tuple, n: int) -> Verdict:
    """03: the catalog code ``set_lora_info`` raises for four buffer ``shapes``."""
    from .validate import upstream_check

    keys = ("gate_up_a", "gate_up_b", "down_a", "down_b")
    if not isinstance(shapes, (tuple, list)) or len(shapes) != 4 or not all(isinstance(s, (tuple, list, torch.Size))
                                                                             for s in shapes):
        raise TypeError(f"first_error: shapes must be the four buffers' shapes (tuples), got {shapes!r}")
    failure = upstream_check(dict(zip(keys, (tuple(s) for s in shapes))), n)
    expected = failure[0] if failure else None
    name = "which check fires first"
    hint = ("the checks run in order: 4D, outer expert dim 1 or n, the same outer layout, inner expert count n, "
            "then the ranks; the first that fails wins (None: all pass)")
    if _unanswered(answer):
        return Verdict(name, None, "", hint)
    if answer is not None and not isinstance(answer, str):
        return Verdict(name, False, f"answer with a code such as 'ISL-E001' (None: all pass), got {answer!r}", hint)
    if answer == expected:
        return Verdict(name, True, f"{expected}: {failure[1]}" if failure else "none: the checks pass.")
    return Verdict(name, False, f"{answer!r} is not the first that fails", hint)


# -- 04 · adapters (the doctor's notebook) -------------------------------------------------

_DOWN_A = "m.mlp.shared_experts.down_proj.lora_A.weight"


def normalized_down_a(answer: Any, flat: torch.Tensor, n: int) -> Verdict:
    """04: a flat PEFT down A ``[r, n*F]`` given its expert axis, ``[n, r, F]``, as
    upstream's normalization does."""
    from .adapters import normalize_shared_sink

    expected = normalize_shared_sink({_DOWN_A: flat}, n)[_DOWN_A]
    r, width = flat.shape
    hint = ("the columns are expert-major (column e*F + f is expert e's feature f): split the columns into "
            "experts first, then bring the expert axis to the front")
    return _tensor_verdict("down A normalized", answer, expected, hint,
                           {"a reshape straight to [n, r, F] (it mixes rank and feature)":
                            flat.reshape(n, r, width // n)})


def stacked_gate_up_b(answer: Any, gate_b: torch.Tensor, up_b: torch.Tensor, n: int) -> Verdict:
    """04: flat PEFT gate B and up B ``[n*F, r]`` stacked into gate-up B ``[n, 2F, r]``
    (each expert: its gate rows, then its up rows), as upstream's normalization does."""
    from .adapters import normalize_shared_sink

    key = "m.mlp.shared_experts.{}_proj.lora_B.weight"
    normalized = normalize_shared_sink({key.format("gate"): gate_b, key.format("up"): up_b}, n)
    expected = normalized[key.format("gate_up")]
    F = gate_b.shape[0] // n
    hint = ("split each into its experts first, then, expert by expert, put the gate rows above the up rows "
            "(along the feature axis)")
    return _tensor_verdict("gate-up B stacked", answer, expected, hint,
                           {"gate and up stacked before the experts were split (experts mixed)":
                            torch.cat([gate_b, up_b]).reshape(n, 2 * F, -1)})


# -- 05 · the batched forward --------------------------------------------------------------

def segments(seg_indptr: Any, weight_indices: Any, token_slots: list[int], num_slots: int) -> Verdict:
    """05: the segments of a batch in arrival order (runs of equal slots)."""
    from .batch import SlotBatch

    batch = SlotBatch.from_token_slots(token_slots, num_slots)
    want_ptr, want_idx = batch.seg_indptr.tolist(), batch.weight_indices.tolist()
    name = "the segments"
    hint = "a segment is a run of tokens with the same slot; seg_indptr holds where each starts, then the token count"
    if _unanswered(seg_indptr, weight_indices):
        return Verdict(name, None, "", hint)
    got_ptr, got_idx = _ints(seg_indptr), _ints(weight_indices)
    unread = [f"{what}: {got}" for what, got in (("seg_indptr", got_ptr), ("weight_indices", got_idx))
              if isinstance(got, str)]
    if unread:
        return Verdict(name, False, "; ".join(unread), hint)
    got_ptr, got_idx = list(got_ptr), list(got_idx)
    if (got_ptr, got_idx) == (want_ptr, want_idx):
        return Verdict(name, True, f"seg_indptr {want_ptr}, weight_indices {want_idx}.")
    wrong = []
    if got_ptr != want_ptr:
        wrong.append(f"seg_indptr is not {got_ptr}" + (" (it starts at 0 and ends at the token count)"
                                                        if got_ptr[:1] != [0] or got_ptr[-1:] != [len(token_slots)] else ""))
    if got_idx != want_idx:
        wrong.append(f"weight_indices is not {got_idx} (one slot per segment, -1 for the base model)")
    return Verdict(name, False, "; ".join(wrong), hint)


def shrink(answer: Any, sink, x: torch.Tensor, token_slots: list[int], token: int) -> Verdict:
    """05: the gate/up shrink ``[2R]`` of one token: its slot's shared gate-up A times ``x``."""
    slot = token_slots[token]
    if slot < 0:
        raise ValueError(f"token {token} uses no adapter (slot -1): pick a token with a slot")
    ga = sink.lora_buffers[0]
    hint = (f"token {token} uses slot {slot}: the shrink is that slot's gate-up A (its one shared outer "
            "factor, [2R, H]) applied to the token")
    return _tensor_verdict("the shrink of one token", answer, ga[slot, 0] @ x[token], hint)


# -- 06 · profiling ----------------------------------------------------------------------

def forward_bytes(answer: Any, case) -> Verdict:
    """06: the fewest bytes one forward of ``case`` must move."""
    from .profile import case_bytes

    expected = case_bytes(case)
    name = "the bytes of one forward"
    hint = ("every weight once (base w13 and w2, plus each *used* slot's four factors), x read and out written "
            f"once, the gammas; {case.element_size} bytes per value; the answer in bytes")
    if _unanswered(answer):
        return Verdict(name, None, "", hint)
    got = _number(answer)
    if got is None:
        return Verdict(name, False, f"answer with a number of bytes, got {answer!r}", hint)
    slip = _unit_slip(got, expected, "bytes", {"MB": 1e6, "kB": 1e3, "GB": 1e9})
    if slip:
        return Verdict(name, False, slip, hint)
    if abs(got - expected) <= 0.005 * expected:
        return Verdict(name, True, f"{expected:,.0f} bytes = {expected / 1e6:.3f} MB.")
    return Verdict(name, False, f"{got:,.0f} bytes is {got / expected:.2f}x the answer", hint)


def _unit_slip(answer: float, expected: float, unit: str, others: dict[str, float], rtol: float = 0.005) -> str:
    """The sentence for an answer that is right in another unit (``others``: {unit: how
    many of the asked ``unit`` one of it is}); ``""`` otherwise."""
    for other, size in others.items():
        if expected and abs(answer * size - expected) <= rtol * expected:
            return f"that is the answer in {other}; the check takes {unit} (1 {other} = {size:g} {unit})"
    return ""


def roofline_time(answer_us: Any, bound: Any, case, ceilings: dict) -> Verdict:
    """06: the roofline time of ``case`` in µs and whether it is memory- or compute-bound."""
    from .profile import roofline

    roof = roofline(case, **ceilings)
    name = "the roofline time"
    hint = "time = max(bytes / bandwidth, FLOPs / matmul rate), in µs; the larger one names the bound"
    if _unanswered(answer_us, bound):
        return Verdict(name, None, "", hint)
    got = _number(answer_us)
    if got is None or not isinstance(bound, str):
        return Verdict(name, False, f"answer with a time in µs (a number) and a bound ('memory' or 'compute'), "
                       f"got {answer_us!r} and {bound!r}", hint)
    slip = _unit_slip(got, roof.us, "µs", {"s": 1e6, "ms": 1e3, "ns": 1e-3}, rtol=0.01)
    if slip:
        return Verdict(name, False, slip, hint)
    ok_time = abs(got - roof.us) <= 0.01 * roof.us
    if ok_time and bound == roof.bound:
        return Verdict(name, True, f"{roof.us:.2f} µs, {roof.bound}-bound.")
    why = [] if ok_time else [f"{got:.2f} µs is {got / roof.us:.2f}x the answer"]
    if bound != roof.bound:
        why.append(f"it is not {bound!r}-bound")
    return Verdict(name, False, "; ".join(why), hint)


# -- 07 · tensor parallelism ---------------------------------------------------------------

def rank_gate_up_rows(answer: Any, sink, tp_rank: int, tp_size: int) -> Verdict:
    """07: which rows of one expert's gate-up B ``[2F, r]`` (``[gate ‖ up]``) rank
    ``tp_rank`` of ``tp_size`` holds, as a list of row numbers."""
    from .shard import slice_lora_b

    F = sink.intermediate_size
    positions = torch.arange(2 * F, dtype=torch.float64)[:, None]  # one expert's [2F, r=1], each row its number
    held = slice_lora_b({0: positions}, tp_rank, "gate_up_proj_moe", tp_size, sink.n_shared_experts)[0]
    expected = [int(v) for v in held[:, 0].tolist()]
    name = "the gate-up B rows of one rank"
    hint = (f"rank k holds features k*F/tp .. (k+1)*F/tp - 1; gate-up B is [gate ‖ up], so those features "
            f"sit twice: in the gate half (rows 0..F-1) and again F rows further down (F = {F})")
    if _unanswered(answer):
        return Verdict(name, None, "", hint)
    got = _ints(answer)
    if isinstance(got, str):
        return Verdict(name, False, f"give the row numbers as a list: {got}", hint)
    got = list(got)
    if got == expected:
        return Verdict(name, True, f"rows {expected}: the rank's slice of the gate half and of the up half.")
    if got == expected[: len(expected) // 2]:
        return Verdict(name, False, "that is the gate half only; the up half holds the same features", hint)
    return Verdict(name, False, f"rank {tp_rank} does not hold rows {got}", hint)


def rank_down_a(answer: Any, sink, down_a: torch.Tensor, tp_rank: int, tp_size: int) -> Verdict:
    """07: rank ``tp_rank``'s share of a per-expert down A ``[n, r, F]``."""
    from .shard import slice_lora_a

    expected = slice_lora_a(down_a, tp_rank, "down_proj_moe", tp_size, sink.n_shared_experts)
    F = down_a.shape[-1]
    hint = f"down A acts on F: rank k keeps the columns k*F/tp .. (k+1)*F/tp - 1 of every expert (F = {F})"
    return _tensor_verdict("down A of one rank", answer, expected, hint)


# -- 08 · the per-expert defect --------------------------------------------------------------

def upstream_column(answer: Any, intermediate: int, b_row: int) -> Verdict:
    """08: the ``y`` column (interleaved base) that sglang 0.5.23's per-expert path adds
    gate-up B row ``b_row`` to, and the column it should reach."""
    from .upstream_defect import gate_up_routing

    wrong = int(gate_up_routing(intermediate, True, "sglang_0_5_23")[:, b_row].nonzero())
    right = int(gate_up_routing(intermediate, True, "intended")[:, b_row].nonzero())
    name = f"where B row {b_row} lands"
    hint = ("upstream adds B row k to y column k; on the interleaved base y column 2f is gate f, 2f+1 up f, "
            "and B's rows are [gate 0..F-1 ‖ up 0..F-1]")
    if _unanswered(answer):
        return Verdict(name, None, "", hint)
    got = _ints(answer)
    if isinstance(got, str) or len(got) != 2:
        return Verdict(name, False, "answer with two column numbers: (sglang 0.5.23's, the intended one)", hint)
    got_wrong, got_right = got
    if (got_wrong, got_right) == (wrong, right):
        return Verdict(name, True, f"sglang 0.5.23 adds it to column {wrong}, it belongs in column {right}.")
    why = [f"sglang 0.5.23 does not use column {got_wrong}"] if got_wrong != wrong else []
    if got_right != right:
        why.append(f"the intended column is not {got_right}")
    return Verdict(name, False, "; ".join(why), hint)


def collapses(answer: Any, factors) -> Verdict:
    """08: whether a per-expert adapter collapses exactly to the shared outer layout."""
    from .upstream_defect import collapse_identical_outer

    expected = collapse_identical_outer(factors.gate_up_a, factors.down_b)[2]
    name = "does it collapse"
    hint = "it collapses only when every expert's gate-up A is the same, and every expert's down B too"
    if _unanswered(answer):
        return Verdict(name, None, "", hint)
    got = _boolean(answer)
    if got is None:
        return Verdict(name, False, f"answer True or False, got {answer!r} ({type(answer).__name__})", hint)
    if got == expected:
        return Verdict(name, True, "it collapses: the shared outer form is exact." if expected else
                       "it does not: the experts' outer factors differ, so no shared form is exact.")
    return Verdict(name, False, f"{got} is not what collapse_identical_outer finds", hint)


# -- 09 · the cure: export ------------------------------------------------------------------

def stacked_outer(shared_a: Any, inner_b: Any, factors) -> Verdict:
    """09: the rank ``n·r`` block layout by hand, for the gate projection of per-expert
    ``factors`` (``LoRAFactors``, ``O = n``): the shared gate A ``[n·r, H]`` and every
    expert's inner gate B ``[n, F, n·r]``, such that ``inner_b[e] @ shared_a`` is expert
    e's own ``B_e @ A_e``. Expected: ``export.shared_outer``'s gate half."""
    from .export import shared_outer

    stacked, _ = shared_outer(factors)
    n, r, F = factors.n, factors.rank, factors.gate_up_b.shape[-2] // 2
    want_a, want_b = stacked.gate_up_a[0, : n * r], stacked.gate_up_b[:, :F]
    name = "the rank n·r block layout"
    hint = ("stack the experts' gate A's along the rank axis (expert e: rows e·r .. e·r+r-1); give expert e's "
            "inner B its own B in the same columns, zeros in the others")
    if _unanswered(shared_a, inner_b):
        return Verdict(name, None, "", hint)
    if not isinstance(shared_a, torch.Tensor) or not isinstance(inner_b, torch.Tensor):
        return Verdict(name, False, "give both as tensors", hint)
    for what, got, want in (("shared gate A", shared_a, want_a), ("inner gate B", inner_b, want_b)):
        if tuple(got.shape) != tuple(want.shape):
            return Verdict(name, False, _shape_slip(what, got, tuple(want.shape)), hint)
    own = factors.gate_up_b[:, :F].double() @ factors.gate_up_a[:, :r].double()  # [n, F, H]: B_e @ A_e
    served = inner_b.double() @ shared_a.double()
    bad = [e for e in range(n) if not torch.allclose(served[e], own[e], rtol=1e-9, atol=1e-12)]
    if bad:
        return Verdict(name, False, f"expert {bad[0]}'s inner B @ shared A is not its own B_e @ A_e", hint)
    exact = torch.equal(shared_a, want_a) and torch.equal(inner_b, want_b)
    return Verdict(name, True, "every expert's delta is its own, exactly" +
                   ("" if exact else " (in another block order than export's: also right)") + ".")


def folded_scaling(answer: Any, adapter) -> Verdict:
    """09: the factor the export multiplies lora_B by (PEFT's own scaling of the adapter,
    ``Adapter.scaling``: ``lora_alpha / sqrt(r)`` with rsLoRA), so that sglang's
    ``lora_alpha / r`` of the export is 1."""
    name = "the scaling folded into lora_B"
    hint = "PEFT's scaling of this adapter, not sglang's: read use_rslora in its config"
    if _unanswered(answer):
        return Verdict(name, None, "", hint)
    expected, value = float(adapter.scaling), _number(answer)
    if value is None:
        return Verdict(name, False, f"{answer!r} is no number", hint)
    if abs(value - expected) <= 1e-9 * max(1.0, abs(expected)):
        return Verdict(name, True, "B' = scaling · B, and the export's config says lora_alpha = r.")
    sglang = adapter.lora_alpha / adapter.r
    if abs(value - sglang) <= 1e-9 * max(1.0, abs(sglang)):
        return Verdict(name, False, "that is sglang's lora_alpha / r, which ignores use_rslora", hint)
    return Verdict(name, False, f"{value:g} is not PEFT's scaling of this adapter", hint)
