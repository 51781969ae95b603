"""What sglang 0.5.23 computes for a per-expert outer pool, next to what it should (docs/reference.md#per-expert-defect).

In the per-expert outer layout (``O = n``) upstream's gate/up delta is wrong, and
nothing raises. For each expert ``e`` of slot ``s`` it computes, in the raw column
order of the base activation input ``y [T, n, 2F]``::

    g = x @ gate_up_A[s, e, 0:R].T                 # the gate shrink only
    y[:, e, 0:F]  += g @ gate_up_B[s, e, 0:F].T    # gate B onto y's first F columns
    y[:, e, F:2F] += g @ gate_up_B[s, e, F:2F].T   # up B, fed by the *gate* shrink

Two independent faults follow. (1) The up half of gate-up A (rows ``R..2R-1``) is
never read. (2) B's ``[gate ‖ up]`` rows are added in contiguous order onto ``y``,
whatever the base layout. On the interleaved base (the only one 0.5.23's LoRA wrapper
serves) ``y``'s columns alternate gate/up, so the gate deltas of all ``F`` features
land on the gate and up columns of features ``0..F/2-1`` and the up deltas on those
of ``F/2..F-1``. On a contiguous base ``y``'s columns are ``[gate ‖ up]`` themselves,
so contiguous order *is* the right place and only fault (1) remains; that case is the
formula read literally, not a measurement (0.5.23 refuses a contiguous sink, ISL-E009).
The down delta and the whole shared outer layout are right.

The kit's own forward keeps computing the intended math (docs/reference.md#the-forward). This module shows
the difference: ``sglang_0_5_23_per_expert_forward`` computes what upstream computes,
``defect_report`` measures it for an adapter or pool, and ``doctor_finding`` says it.
Per-expert outer factors that are the same for every expert turn into the shared
outer layout exactly, which sidesteps the defect: ``pool.collapse_identical_outer``.
"""
from __future__ import annotations

import textwrap
import warnings
from dataclasses import dataclass, field
from typing import Literal, Mapping, Sequence

import torch

from .batch import SlotBatch
from .catalog import Finding, UpstreamDefectWarning, finding, message
from .forward import run_forward
from .lora import SharedSinkLoRA
from .pool import LoRAFactors, LoRAPool, collapse_identical_outer
from .sink import gate_up_rows

WARNING_CODE = "ISL-W001"

Computation = Literal["intended", "sglang_0_5_23"]

GATE_SHRINK, UP_SHRINK = 1, 2
"""Entries of a routing map (``gate_up_routing``): which shrink feeds a B row."""


def _intended_columns(intermediate: int, interleaved: bool, device: torch.device | None = None
                      ) -> torch.Tensor:
    """``[2F]``: the ``y`` column the intended math adds B row ``k`` to (B rows in
    ``[gate ‖ up]`` order). Upstream adds row ``k`` to column ``k``."""
    gate_cols, up_cols = gate_up_rows(intermediate, interleaved, device)
    return torch.cat([gate_cols, up_cols])


def gate_up_routing(intermediate: int, interleaved: bool, computed_by: Computation) -> torch.Tensor:
    """Which gate-up B row reaches which ``y`` column, and through which shrink.

    Returns ``[2F, 2F]`` integers: entry ``[c, k]`` is ``GATE_SHRINK`` (1) or
    ``UP_SHRINK`` (2) when row ``k`` of one expert's gate-up B (``[gate ‖ up]``)
    is added to column ``c`` of its ``y`` (the sink's layout) fed by that shrink,
    else 0. Intended: gate row ``f`` to gate column ``f`` via the gate shrink, up row
    ``f`` to up column ``f`` via the up shrink. sglang 0.5.23 (per-expert outer):
    row ``k`` to column ``k``, always via the gate shrink.
    """
    two_f = 2 * intermediate
    routing = torch.zeros(two_f, two_f, dtype=torch.long)
    rows = torch.arange(two_f)
    if computed_by == "intended":
        source = torch.where(rows < intermediate, GATE_SHRINK, UP_SHRINK)
        routing[_intended_columns(intermediate, interleaved), rows] = source
    elif computed_by == "sglang_0_5_23":
        routing[rows, rows] = GATE_SHRINK
    else:
        raise ValueError(f"computed_by must be 'intended' or 'sglang_0_5_23', got {computed_by!r}")
    return routing


def sglang_0_5_23_equivalent_buffers(gate_up_a: torch.Tensor, gate_up_b: torch.Tensor, interleaved: bool
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The gate-up factors whose *intended* math is what sglang 0.5.23 computes.

    ``gate_up_a [..., 2R, H]`` and ``gate_up_b [..., 2F, R]`` (pool buffers or one
    adapter's factors) -> new tensors of the same shapes: A's up half replaced by a
    copy of its gate half (fault 1: the gate shrink feeds both B halves), and B's rows
    reordered so that the intended placement puts each one where upstream adds it
    (fault 2: row ``k`` onto ``y`` column ``k``). On a contiguous base that order is
    the identity, so B comes back unchanged. The inputs are not modified.
    """
    R, F = gate_up_a.shape[-2] // 2, gate_up_b.shape[-2] // 2
    ga = gate_up_a.clone()
    ga[..., R:, :] = gate_up_a[..., :R, :]
    # The intended math adds gb_eq[k] to column cols[k]; upstream adds gb[c] to column c.
    gb = gate_up_b[..., _intended_columns(F, interleaved, gate_up_b.device), :].clone()
    return ga, gb


def sglang_0_5_23_per_expert_forward(sink: SharedSinkLoRA, x: torch.Tensor, gammas: torch.Tensor,
                                     batch: SlotBatch | None, backend: str = "reference") -> torch.Tensor:
    """What sglang 0.5.23 returns for this sink, whose pool is in the per-expert outer
    layout (docs/reference.md#per-expert-defect), instead of the intended ``sink(x, gammas, batch)``.

    ``x [T, H]`` (or ``[B, L, H]``), ``gammas [T, n]`` -> ``out`` like ``x`` (float64
    with the default ``reference`` backend). Computed as the kit's forward over
    ``sglang_0_5_23_equivalent_buffers`` (substituted in the sink's operands only, so
    the sink and its pool are left as they were).
    """
    if sink.lora_buffers is None or sink.layout is None:
        raise ValueError("sglang_0_5_23_per_expert_forward needs a sink with a pool: "
                         "call sink.set_lora_info(*pool.buffers()) first")
    if sink.layout.shared_outer:
        raise ValueError("this sink's pool is in the shared outer layout (O = 1), which sglang 0.5.23 "
                         "computes as intended: use sink(x, gammas, batch) instead")
    ga, gb, da, db = sink.lora_buffers
    upstream = sink.operands_for(*sglang_0_5_23_equivalent_buffers(ga, gb, sink.interleaved), da, db)
    return run_forward(upstream, x, gammas, batch, backend)


# -- the report ---------------------------------------------------------------------------

@dataclass
class DefectReport:
    """How far sglang 0.5.23's output is from the intended one, for one adapter or pool.

    ``relative_error``: ``‖upstream − intended‖ / ‖intended‖`` over the sink output of
    all tokens that use an adapter; ``delta_error``: the same difference relative to the
    adapter's own effect ``‖intended − base‖``; ``slot_errors``: ``relative_error`` per
    loaded slot. ``intended``, ``upstream`` ``[T, H]`` (float64) are the two outputs,
    ``None`` where nothing was computed (a shared outer source). ``collapsible``: every
    expert's outer factors are the same, so the shared outer layout is exact.
    """

    what: str
    n: int
    outer: int
    interleaved: bool
    relative_error: float = 0.0
    delta_error: float = 0.0
    slot_errors: dict[int, float] = field(default_factory=dict)
    tokens: int = 0
    seed: int = 0
    collapsible: bool = False
    intended: torch.Tensor | None = field(default=None, repr=False)
    upstream: torch.Tensor | None = field(default=None, repr=False)

    @property
    def affected(self) -> bool:
        """True for the per-expert outer layout (``O = n > 1``), whatever it holds."""
        return self.outer > 1

    @property
    def message(self) -> str:
        """The warning's words: catalog ``ISL-W001`` filled in."""
        return message(WARNING_CODE, **self._fields())

    def _fields(self) -> dict[str, object]:
        return {"subject": self.what, "n": self.outer, "error": f"{self.relative_error:.2g}"}

    def warn(self, stacklevel: int = 2) -> None:
        """Emit ``UpstreamDefectWarning`` (ISL-W001) when affected; nothing otherwise."""
        if self.affected:
            warnings.warn(UpstreamDefectWarning(self.message), stacklevel=stacklevel)

    @property
    def explanation(self) -> str:
        """The report in plain words: what goes wrong, how much, what to do."""
        if not self.affected:
            return (f"{self.what} uses the shared outer layout (O = 1): sglang 0.5.23 computes its "
                    "gate/up and down deltas as intended. Nothing to do.")
        wrap = lambda s: textwrap.fill(s, 88)  # noqa: E731
        placement = (
            "(2) gate-up B's [gate ‖ up] rows are added in contiguous order onto the interleaved "
            "activation input: the gate deltas of all F features land on the gate and up columns of "
            "the first F/2 features, the up deltas on those of the last F/2."
            if self.interleaved else
            "(2) does not arise on a contiguous base: gate-up B's rows are added in contiguous order, "
            "which is that base's own order (sglang 0.5.23 serves LoRA on the interleaved base only).")
        slots = ", ".join(f"slot {s}: {e:.2g}" for s, e in self.slot_errors.items())
        measured = (
            f"On random base weights and inputs ({self.tokens} tokens, seed {self.seed}) sglang 0.5.23's "
            f"sink output is off by a relative error of {self.relative_error:.2g}"
            + (f" ({slots})" if len(self.slot_errors) > 1 else "")
            + f"; that is {self.delta_error:.2g} of the adapter's own effect."
            if self.slot_errors else
            "It holds no adapter yet; every adapter loaded into it will be affected.")
        return "\n".join([
            wrap(f"{WARNING_CODE}: {self.what} uses the per-expert outer layout (O = {self.outer}): every "
                 "expert has its own gate-up A and down B."),
            wrap("On sglang 0.5.23 this layout loads without an error, but its gate/up delta is computed "
                 "wrongly: (1) the up half of gate-up A (rows R..2R-1) is never read; the gate shrink "
                 "feeds the up B too. " + placement + " The down delta is right."),
            wrap(measured),
            wrap("What to do: " + self.fix),
        ])

    @property
    def fix(self) -> str:
        if self.collapsible:
            return ("convert it (inkling-lab convert): its outer factors are the same for every expert, so the "
                    "converter collapses them to the shared outer layout, exactly, and sglang 0.5.23 computes "
                    "that layout right.")
        return ("its experts' outer factors differ, so no shared outer form is exact: do not serve it from a "
                "per-expert pool on sglang 0.5.23; merge it into the base weights, export shared outer factors, "
                "or use an sglang whose per-expert path you have checked (notebooks/08_per_expert_defect.ipynb).")

    def __str__(self) -> str:
        return self.explanation

    def _repr_pretty_(self, p, cycle: bool) -> None:  # IPython shows the explanation
        p.text(self.explanation)


Source = LoRAFactors | LoRAPool | Sequence[torch.Tensor]


def _as_pool(source: Source, what: str | None) -> tuple[tuple[torch.Tensor, ...], list[int], str]:
    """The four pool buffers ``[S, O, 2R, H]`` ..., the per-slot ranks and a label."""
    if isinstance(source, LoRAFactors):
        pool = LoRAPool(n=source.n, hidden=source.gate_up_a.shape[-1],
                        intermediate=source.gate_up_b.shape[-2] // 2, slots=1, max_rank=source.rank,
                        outer=source.outer)
        pool.load(0, source)
        return pool.buffers(), pool.lora_ranks, what or (f"adapter {source.name!r}" if source.name else "this adapter")
    if isinstance(source, LoRAPool):
        return source.buffers(), source.lora_ranks, what or "the pool"
    buffers = tuple(source) if isinstance(source, (tuple, list)) else ()
    if len(buffers) != 4 or any(not isinstance(b, torch.Tensor) or b.dim() != 4 or b.device.type == "meta"
                                for b in buffers):
        got = [f"{tuple(b.shape)} on {b.device.type}" if isinstance(b, torch.Tensor) else type(b).__name__
               for b in buffers] or type(source).__name__
        raise ValueError("defect_report takes LoRAFactors, a LoRAPool or the four 4D pool buffers "
                         f"(gate_up_a, gate_up_b, down_a, down_b) holding values (not on meta), got {got}")
    # Without the pool's records, a slot whose four buffers are all zero is an empty one.
    ranks = [0 if all(not b[s].any() for b in buffers) else buffers[1].shape[-1]
             for s in range(buffers[1].shape[0])]
    return buffers, ranks, what or "the pool"


def defect_report(source: Source, *, interleaved: bool = True, tokens_per_slot: int = 8, seed: int = 0,
                  what: str | None = None) -> DefectReport:
    """Measure sglang 0.5.23's per-expert outer defect for one adapter or pool.

    ``source``: ``LoRAFactors`` (loaded into a one-slot pool of its own layout), a
    ``LoRAPool``, or its four buffers. For a per-expert outer source, runs a sink of
    its sizes (seeded random weights, ``interleaved`` base) on ``tokens_per_slot``
    seeded random tokens per loaded slot, through the intended math and through what
    upstream computes, both in float64. A shared outer source is reported as
    unaffected without running anything.
    """
    buffers, ranks, label = _as_pool(source, what)
    ga, gb, _, _ = buffers
    n, outer = gb.shape[1], ga.shape[1]
    report = DefectReport(what=label, n=n, outer=outer, interleaved=interleaved, seed=seed,
                          collapsible=collapse_identical_outer(ga, buffers[3])[2])
    if not report.affected:
        return report
    active = [s for s, r in enumerate(ranks) if r != 0]
    if not active:
        return report
    sink = SharedSinkLoRA(n, ga.shape[-1], gb.shape[-2] // 2, interleaved=interleaved, seed=seed)
    sink.set_lora_info(*buffers)
    gen = torch.Generator().manual_seed(seed)
    T = tokens_per_slot * len(active)
    x = torch.randn(T, sink.hidden_size, generator=gen)
    gammas = torch.rand(T, n, generator=gen)
    token_slots = torch.tensor(active).repeat_interleave(tokens_per_slot)
    batch = SlotBatch.from_token_slots(token_slots, num_slots=gb.shape[0], lora_ranks=ranks)
    intended = sink(x, gammas, batch=batch, backend="reference")
    upstream = sglang_0_5_23_per_expert_forward(sink, x, gammas, batch)
    base = sink(x, gammas, backend="reference")
    diff = upstream - intended
    report.relative_error = _ratio(diff, intended)
    report.delta_error = _ratio(diff, intended - base)
    report.slot_errors = {s: _ratio(diff[token_slots == s], intended[token_slots == s]) for s in active}
    report.tokens, report.intended, report.upstream = T, intended, upstream
    return report


def _ratio(num: torch.Tensor, den: torch.Tensor) -> float:
    d = float(den.norm())
    return float(num.norm()) / d if d > 0 else 0.0


def doctor_finding(source: Source | Mapping[str, LoRAFactors], *, interleaved: bool = True,
                   what: str | None = None) -> Finding | None:
    """The doctor's ``ISL-W001`` finding for a per-expert outer adapter or pool (``None``
    for a shared outer one): what goes wrong on sglang 0.5.23, how large the error is
    for this source on random inputs (``defect_report``), and what to do.

    ``source`` may also be an adapter's factors by module: the first per-expert module
    is measured (one sink of the model's size is enough to show the size of the error),
    and the collapse is offered only when it applies to every per-expert module.
    """
    if isinstance(source, Mapping):
        per_expert = [m for m, f in source.items() if f.outer > 1]
        if not per_expert:
            return None
        more = f" and {len(per_expert) - 1} more module(s)" if len(per_expert) > 1 else ""
        report = defect_report(source[per_expert[0]], interleaved=interleaved,
                               what=f"{what or 'the adapter'} ({per_expert[0]}{more})")
        report.collapsible = all(collapse_identical_outer(source[m].gate_up_a, source[m].down_b)[2]
                                 for m in per_expert)
    else:
        report = defect_report(source, interleaved=interleaved, what=what)
    if not report.affected:
        return None
    return finding(WARNING_CODE, "gate_up_a", fix=report.fix, **report._fields())
