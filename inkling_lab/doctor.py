"""The adapter doctor: what sglang 0.5.23 would do with one PEFT adapter, and what to fix.

``doctor`` walks one adapter down upstream's path (normalize, slice, load, validate)
and reports the first error upstream would raise (its exact message), then every
finding with its fix.
"""
from __future__ import annotations

import os
import sys
import types
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from .adapters import Adapter, FactorName, load_adapter
from .convert import ConvertedPool, convert
from .errors import find_entry
from .geometry import BUFFER_NAMES, Geometry
from .pool import LoRAFactors
from .upstream_defect import doctor_finding
from .validate import PRETTY, Finding, diagnose_pool

# ----------------------------------------------------------------------------

def _fmt(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


_SOURCES = {"gate_up_a": ("gate_up_proj", "A"), "gate_up_b": ("gate_up_proj", "B"),
            "down_a": ("down_proj", "A"), "down_b": ("down_proj", "B")}


def shape_journey(adapter: Adapter, module: str, factors: LoRAFactors | None = None,
                  pool_shapes: dict[str, tuple[int, ...]] | None = None) -> list[dict[str, Any]]:
    """Each pool buffer's way from the PEFT file: the 2D factors it comes from, the
    normalized factor ``[O or n, ...]`` and the pool buffer ``[S, ...]``."""
    rows = []
    normalized = factors.tensors() if factors is not None else {}
    for name, (proj, ab) in _SOURCES.items():
        peft = []
        for key in adapter.factor_keys:
            fn = FactorName.parse(key)
            stacks = {"gate_proj", "up_proj", "gate_up_proj"} if proj == "gate_up_proj" else {"down_proj"}
            if fn.module == module and fn.ab == ab and fn.canonical in stacks:
                label = f"{'' if fn.expert is None else f'{fn.expert}.'}{fn.proj}.lora_{ab}"
                order = (fn.expert or 0, fn.canonical == "up_proj")  # gate before up, as stacked
                peft.append((order, label, [int(d) for d in adapter.weights[key].shape]))
        peft = [(label, shape) for _, label, shape in sorted(peft)]
        rows.append({"buffer": name, "peft": peft,
                     "normalized": list(normalized[name].shape) if name in normalized else None,
                     "pool": list(pool_shapes[name]) if pool_shapes else None})
    return rows


@dataclass
class DoctorReport:
    """What loading one adapter into an Inkling sink would do, and what to fix.

    ``error``: the first exception along upstream's path (``None`` when it loads);
    ``findings``: every finding with its fix (repairs and notes included), the error
    first; ``journey``: each pool buffer's shapes from file to pool.
    """

    adapter: str
    n: int
    hidden: int
    intermediate: int
    tp: int
    max_rank: int | None
    findings: list[Finding] = field(default_factory=list)
    error: BaseException | None = None
    journey: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    pool: ConvertedPool | None = None
    about: str = ""

    @property
    def fails(self) -> bool:
        return self.error is not None

    @property
    def error_code(self) -> str | None:
        if self.error is None:
            return None
        entry = find_entry(self.error)
        return entry.code if entry else None

    @property
    def upstream_raises(self) -> bool:
        """True when the error is one sglang itself raises (not a kit refusal)."""
        entry = find_entry(self.error) if self.error is not None else None
        return entry is not None and entry.origin.startswith("sglang")

    def _error_line(self) -> str:
        if self.error is None:
            return "sglang 0.5.23 loading it: passes (normalize, load into the pool, set_lora_info)"
        text = f"{type(self.error).__name__}: {self.error}"
        if self.upstream_raises:
            return f"sglang 0.5.23 loading it raises:\n  {text}"
        return f"inkling_lab refuses it (sglang would fail later or silently):\n  {text}"

    def __str__(self) -> str:
        lines = [f"Adapter {self.adapter}" + (f": {self.about}" if self.about else ""),
                 f"Sink: n={self.n}, H={self.hidden}, F={self.intermediate}"
                 + (f" (tp={self.tp}: F={self.intermediate // self.tp} per rank)" if self.tp > 1 else "")
                 + (f", pool max rank R={self.max_rank}" if self.max_rank else ""),
                 self._error_line()]
        for module, rows in self.journey.items():
            lines.append(f"Shapes, file -> normalized -> pool ({module}):")
            for row in rows:
                peft = " + ".join(f"{label} {_fmt(s)}" for label, s in row["peft"]) or "(none: zeros)"
                norm = _fmt(row["normalized"]) if row["normalized"] else "?"
                pool = _fmt(row["pool"]) if row["pool"] else "?"
                lines.append(f"  {PRETTY[row['buffer']]:<10} {peft} -> {norm} -> {pool}")
        lines.append(f"Findings ({len(self.findings)}):" if self.findings else "Findings: none")
        lines += [str(f) for f in self.findings]
        warned = any(f.code.startswith("ISL-W") for f in self.findings)  # loads, but computed wrongly
        lines.append("Verdict: FAILS to load (exit status 1)" if self.fails
                     else "Verdict: loads, but see the warning above" if warned
                     else "Verdict: loads" + (" after the repairs above"
                                              if any(f.code.startswith("ISL-K") for f in self.findings) else ""))
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def to_dict(self) -> dict[str, Any]:
        """The report for machines (``--json``)."""
        err = None
        if self.error is not None:
            err = {"type": type(self.error).__name__, "message": str(self.error), "code": self.error_code,
                   "raised_by": "sglang" if self.upstream_raises else "inkling_lab"}
        return {"adapter": self.adapter, "ok": not self.fails, "error": err,
                "sink": {"n_shared_experts": self.n, "hidden": self.hidden, "intermediate": self.intermediate,
                         "tp": self.tp, "max_rank": self.max_rank},
                "findings": [asdict(f) for f in self.findings], "shapes": self.journey}


def _split_fix(adapter: Adapter, n: int) -> str:
    """Why a flat factor does not split into ``n`` experts, and which ``n`` it would."""
    for key in adapter.factor_keys:
        fn = FactorName.parse(key)
        t = adapter.weights[key]
        if fn.expert is not None or fn.is_outer or t.dim() != 2:
            continue
        size = t.shape[1] if fn.ab == "A" else t.shape[0]
        if size % n:
            fits = [k for k in range(1, min(size, 16) + 1) if size % k == 0]
            return (f"{fn.proj}.lora_{fn.ab} {_fmt(t.shape)} holds {size} expert features, not a multiple of "
                    f"n={n}: check --n-shared-experts (it splits for n in {fits}) or re-export the adapter "
                    "for this model")
    return "re-export the adapter for this model's number of shared experts"


def _fit_findings(adapter: Adapter, pool: Geometry, n: int, tp: int) -> list[Finding]:
    """Why an adapter does not fit its pool slot (``ISL-E016``), in plain words: its
    rank against ``R``, its ``H`` and per-rank ``F`` against the sink's."""
    f = next(iter(adapter.factors(n).values()))  # every module of one adapter has one geometry
    H, F = int(f.gate_up_a.shape[-1]), int(f.down_a.shape[-1])
    out = []
    if f.rank > pool.rank:
        out.append(Finding("ISL-E016", "down_a", f"the adapter has rank r={f.rank}; the pool's max rank is "
                           f"R={pool.rank}", f"convert with --max-rank {f.rank} or larger (sglang: "
                           "--max-lora-rank)", upstream=True))
    if H != pool.hidden:
        out.append(Finding("ISL-D101", "gate_up_a", f"the adapter has H={H}; the sink's hidden size is "
                           f"{pool.hidden}", "check --hidden: this adapter was trained for a model of "
                           f"hidden size {H}"))
    if F != pool.intermediate * tp:
        total = n * F
        fits = [k for k in range(1, total + 1) if total % k == 0 and total // k == pool.intermediate * tp]
        guess = f"; its {total} expert features would give F={pool.intermediate * tp} with n={fits[0]}" if fits else ""
        out.append(Finding("ISL-D102", "down_a", f"with n={n} the adapter has F={F}; the sink's F is "
                           f"{pool.intermediate * tp}", "check --n-shared-experts and --intermediate (the "
                           f"model's full F, before tensor parallelism){guess}"))
    return out


def doctor(adapter: Adapter | str | os.PathLike[str], n_shared_experts: int, hidden: int, intermediate: int,
           max_rank: int | None = None, tp: int = 1) -> DoctorReport:
    """Walk one adapter down upstream's path for a sink of ``n``, ``H=hidden`` and
    full per-expert ``F=intermediate`` over ``tp`` ranks; never raises on bad input.

    Reading (the kit's ``ISL-K2xx``), normalization (upstream's raw reshape error),
    the tensor-parallel slice (rank 0 of ``tp``), loading into a pool of max rank
    ``max_rank`` (default: the adapter's rank), and ``set_lora_info``'s checks.
    """
    n = n_shared_experts
    label = (adapter.source or adapter.name) if isinstance(adapter, Adapter) else str(adapter)
    report = DoctorReport(label, n, hidden, intermediate, tp, max_rank)
    try:
        if not isinstance(adapter, Adapter):
            adapter = load_adapter(adapter)
    except (OSError, ValueError) as exc:
        report.error = exc
        report.findings.append(_error_finding(exc))
        return report
    report.about = (f"r={adapter.r}, lora_alpha={adapter.lora_alpha:g} (scaling {adapter.scaling:g}), "
                    f"{len(adapter.modules)} module(s)"
                    + (f", sha256 {adapter.sha256[:12]}…" if adapter.sha256 else ""))
    report.max_rank = max_rank if max_rank is not None else adapter.r
    try:
        pool = convert([adapter], n, hidden=hidden, intermediate=intermediate, max_rank=report.max_rank,
                       tp_size=tp)
    except RuntimeError as exc:  # torch's reshape error from normalization
        report.error = exc
        report.findings.append(_error_finding(exc, _split_fix(adapter, n)))
    except AssertionError as exc:
        report.error = exc
        geometry = Geometry(n=n, hidden=hidden, intermediate=max(intermediate // max(tp, 1), 1),
                            rank=report.max_rank)
        specific = _fit_findings(adapter, geometry, n, tp)
        report.findings.append(_error_finding(exc, "; ".join(f.fix for f in specific) or None))
        report.findings += [f for f in specific if f.code != "ISL-E016"]
    except ValueError as exc:
        report.error = exc
        report.findings.append(_error_finding(exc))
    else:
        report.pool = pool
        g = pool.geometry
        for module, bufs in pool.layers.items():
            report.findings += diagnose_pool(*bufs, n_shared_experts=n, hidden_size=hidden,
                                             intermediate_size=g.intermediate, lora_ranks=pool.lora_ranks).findings
        defect = doctor_finding(adapter.factors(n), what=f"adapter {adapter.name!r}")  # loads, but computed wrongly
        report.findings += [defect] if defect else []
    report.findings += [f for f in adapter.findings if f not in report.findings]
    _add_journey(report, adapter, n)
    return report


def _add_journey(report: DoctorReport, adapter: Adapter, n: int) -> None:
    try:
        factors = adapter.factors(n)
    except (RuntimeError, ValueError):
        factors = {}
    for module in adapter.modules:
        pool_shapes = None
        if report.pool is not None:
            pool_shapes = {name: tuple(t.shape) for name, t in zip(BUFFER_NAMES, report.pool.buffers(module))}
        report.journey[module] = shape_journey(adapter, module, factors.get(module), pool_shapes)


_UNREADABLE = {"ISL-K201", "ISL-K202", "ISL-K203", "ISL-K204"}
"""Refusals of a folder that no loader can read (no config, bad config, no or a corrupt
weights file), as opposed to refusals of what sglang would load and get wrong."""


def _error_finding(exc: BaseException, fix: str | None = None) -> Finding:
    """The error itself as the first finding; ``fix`` defaults to the message's own advice."""
    entry = find_entry(exc)
    code = entry.code if entry else "error"
    upstream = entry is not None and entry.origin.startswith("sglang")
    fix = fix or "follow the advice in the message"
    if entry is not None:
        fix += f" (more: inkling-lab explain {code})"
    if upstream:
        consequence = ""
    elif code in _UNREADABLE:
        consequence = "sglang cannot read this adapter either; the kit says which file and why"
    else:
        consequence = "sglang does not raise this: it fails later or computes something else"
    return Finding(code, "adapter", f"{type(exc).__name__}: {exc}", fix, upstream, consequence)


class _CallableModule(types.ModuleType):
    """``il.doctor(...)`` keeps working after ``import inkling_lab.doctor``: importing a
    submodule binds the package attribute ``doctor`` to the module, so the module
    itself calls the function."""

    def __call__(self, *args: Any, **kwargs: Any) -> DoctorReport:
        return doctor(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
