"""Three LoRA deltas side by side: PEFT's math, what sglang 0.5.23 serves, the kit's pool.

For one or more adapters (slot ``i`` holds adapter ``i``) and a seeded random batch on
a seeded random sink of ``n``, ``H``, ``F``, ``compare`` computes each shared expert's
LoRA delta of the sink output (``[T, H]``: the expert's output with the adapter minus
without it) three ways, in float64:

* ``peft``: PEFT's own merged-weight delta, computed by PEFT itself where it is
  installed (``inkling_lab.peft_reference``: the folder loaded with PEFT onto
  transformers' ``InklingSharedExperts`` or an ``nn.Linear`` stand-in with the adapter's
  module names), so that it cannot share a mistake of the kit's reader; the kit's own
  reading of the factors only where PEFT is absent or refuses the folder, and the report
  says so;
* ``sglang``: what sglang 0.5.23 serves (``inkling_lab.sglang_path.run_sglang``): one
  ``lora_alpha / r``, nothing when the sink is not wrapped or its load fails (weights that
  match no target module fail the buffer load),
  the per-expert outer defect of docs/reference.md#per-expert-defect applied (``SglangRun.served``);
* ``kit``: the pool ``inkling-lab convert`` writes.

The report reads like ``torch.testing.assert_close``'s mismatch report, per module,
slot and expert: mismatched elements, the greatest absolute and relative difference
and where they are, and the cause by name.
"""
from __future__ import annotations

import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
import torch.nn.functional as Fn

from .adapters import Adapter, FactorName, as_path, load_adapter
from .catalog import message
from .convert import convert
from .geometry import check_seed, check_size
from .peft_reference import (Deltas, PeftRefused, ReferenceDeltas, ReferenceProbes, kit_reading, peft_probes,
                             peft_reference, probe)
from .records import FLOAT64_ROUNDING
from .releases import Release, release
from .sglang_path import SglangRun, config_causes, exception_text, run_sglang

RTOL, ATOL = 1.3e-6, 1e-5
"""``torch.testing.assert_close``'s float32 tolerances: the adapters are float32."""



def factor_deltas(gate_up_a: torch.Tensor, gate_up_b: torch.Tensor, down_a: torch.Tensor, down_b: torch.Tensor,
                  scaling: float = 1.0) -> Deltas:
    """Dense per-expert deltas from normalized factors or one slot of the pool
    (``[O, 2R, H]``, ``[n, 2F, R]``, ``[n, R, F]``, ``[O, H, R]``; B times ``scaling``)."""
    ga, gb, da, db = (t.double() for t in (gate_up_a, gate_up_b, down_a, down_b))
    n, R, F = gb.shape[0], ga.shape[-2] // 2, gb.shape[-2] // 2
    ga, db = ga.expand(n, -1, -1), db.expand(n, -1, -1)
    return (scaling * gb[:, :F] @ ga[:, :R], scaling * gb[:, F:] @ ga[:, R:], scaling * db @ da)


@dataclass(frozen=True)
class Batch:
    """A seeded random sink (float64 ``gate``/``up`` ``[n, F, H]``, ``down`` ``[n, H, F]``)
    and tokens ``x [T, H]`` with sink weights ``gammas [T, n]``."""

    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    x: torch.Tensor
    gammas: torch.Tensor

    @classmethod
    def random(cls, n: int, hidden: int, intermediate: int, tokens: int = 8, seed: int = 0) -> "Batch":
        gen = torch.Generator().manual_seed(seed)
        rnd = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64) / s[-1] ** 0.5  # noqa: E731
        return cls(rnd(n, intermediate, hidden), rnd(n, intermediate, hidden), rnd(n, hidden, intermediate),
                   torch.randn(tokens, hidden, generator=gen, dtype=torch.float64),
                   torch.rand(tokens, n, generator=gen, dtype=torch.float64))

    def expert_outputs(self, deltas: Deltas | None) -> torch.Tensor:
        """``[n, T, H]``: each expert's weighted output (SwiGLU), with ``deltas`` added."""
        dg, du, dd = deltas if deltas is not None else (0, 0, 0)
        g = torch.einsum("th,efh->etf", self.x, self.gate + dg)
        u = torch.einsum("th,efh->etf", self.x, self.up + du)
        act = Fn.silu(g) * u * self.gammas.T[:, :, None]
        return torch.einsum("etf,ehf->eth", act, self.down + dd)

    def delta(self, deltas: Deltas | None) -> torch.Tensor:
        """``[n, T, H]``: each expert's LoRA delta of the output (zero for ``None``)."""
        return self.expert_outputs(deltas) - self.expert_outputs(None)


@dataclass
class Mismatch:
    """One comparison in ``assert_close``'s terms: ``got`` against ``peft`` for one
    module, slot and expert (``expert`` ``None``: the sink output, all experts summed)."""

    module: str
    slot: int
    adapter: str
    expert: int | None
    got: str
    mismatched: int
    total: int
    max_abs: float
    max_abs_at: tuple[int, int]
    max_rel: float
    max_rel_at: tuple[int, int]
    cause: str = ""
    rounding: bool = False
    """Every difference is float64 rounding (``records.FLOAT64_ROUNDING`` of the largest
    value compared): the report then prints no number, which would be the CPU's."""

    @property
    def close(self) -> bool:
        return self.mismatched == 0

    def __str__(self) -> str:
        where = f"{self.module} slot {self.slot} ({self.adapter}) " + (
            f"expert {self.expert}" if self.expert is not None else "sink output (all experts)")
        if self.close and self.rounding:
            return f"{where}: {self.got} == peft (equal to float64 rounding)"
        if self.close:
            return f"{where}: {self.got} == peft (greatest absolute difference {self.max_abs:.3g})"
        return (f"{where}: {self.got} != peft\n"
                f"    Mismatched elements: {self.mismatched} / {self.total} ({100 * self.mismatched / self.total:.1f}%)\n"
                f"    Greatest absolute difference: {self.max_abs:.6g} at index {self.max_abs_at} (up to {ATOL} allowed)\n"
                f"    Greatest relative difference: {self.max_rel:.6g} at index {self.max_rel_at} (up to {RTOL} allowed)"
                + (f"\n    Cause: {self.cause}" if self.cause else ""))


def mismatch(out: torch.Tensor, peft: torch.Tensor, **labels: Any) -> Mismatch:
    """``out`` against ``peft`` (both ``[T, H]``), counted as ``assert_close`` counts;
    ``labels``: the ``Mismatch`` fields that say what was compared."""
    diff = (out - peft).abs()
    rel = diff / peft.abs()
    rel = torch.where(diff == 0, torch.zeros_like(rel), rel)  # 0/0 is no difference
    bad = ~(diff <= ATOL + RTOL * peft.abs())
    at = lambda t: tuple(int(i) for i in divmod(int(torch.nan_to_num(t, nan=float("inf")).argmax()), t.shape[1]))  # noqa: E731
    max_abs = float(diff.max()) if diff.numel() else 0.0
    rounding = peft.dtype == torch.float64 and max_abs <= FLOAT64_ROUNDING * (float(peft.abs().max()) if peft.numel() else 0.0)
    return Mismatch(mismatched=int(bad.sum()), total=diff.numel(), max_abs=max_abs, max_abs_at=at(diff),
                    max_rel=float(rel.max()) if rel.numel() else 0.0, max_rel_at=at(rel), rounding=rounding, **labels)


@dataclass
class CompareReport:
    """``compare``'s result: per slot the three computations' status, and every mismatch."""

    adapters: list[str]
    n: int
    hidden: int
    intermediate: int
    tokens: int
    seed: int
    status: dict[str, list[str]] = field(default_factory=dict)
    """Per computation (``peft``, ``sglang``, ``kit``), per slot: ``computed`` or why not."""
    rows: list[Mismatch] = field(default_factory=list)
    deltas: dict[tuple[str, int], dict[str, torch.Tensor]] = field(default_factory=dict, repr=False)
    """``(module, slot)`` -> ``{"peft"|"sglang"|"kit": [n, T, H]}``, for figures."""
    peft_by: list[str] = field(default_factory=list)
    """Per slot, who computed the PEFT column (``ReferenceDeltas.label``): PEFT itself, or
    the kit's own reading and why."""
    release: Release = field(default_factory=release)
    """The sglang release whose serving the ``sglang`` column is (``--sglang``; default 0.5.23)."""

    @property
    def sglang_error(self) -> float | None:
        """``‖sglang − peft‖ / ‖peft‖`` of the sink's LoRA delta over all modules and slots."""
        pairs = [(d["sglang"].sum(0), d["peft"].sum(0)) for d in self.deltas.values() if "sglang" in d and "peft" in d]
        if not pairs:
            return None
        num = sum(float((a - b).norm() ** 2) for a, b in pairs) ** 0.5
        den = sum(float(b.norm() ** 2) for _, b in pairs) ** 0.5
        return num / den if den else num

    @property
    def agree(self) -> bool:
        """Every computation ran and matches PEFT's math everywhere."""
        return all(s == "computed" for ss in self.status.values() for s in ss) and all(r.close for r in self.rows)

    def __str__(self) -> str:
        lines = [f"{self.release.label}, compare: {len(self.adapters)} adapter(s) on a random sink n={self.n}, "
                 f"H={self.hidden}, F={self.intermediate}; {self.tokens} tokens, seed {self.seed}; each expert's LoRA delta [T, H], "
                 f"float64, against PEFT's math (rtol {RTOL}, atol {ATOL})"]
        by = set(filter(None, self.peft_by))
        if len(by) == 1:
            lines.append(f"PEFT's math computed by {by.pop()}")
        else:
            lines += [f"  PEFT's math of slot {slot} ({self.adapters[slot]}) computed by {label}"
                      for slot, label in enumerate(self.peft_by) if label]
        for what, states in self.status.items():
            for slot, state in enumerate(states):
                if state != "computed":
                    lines.append(f"  {what}, slot {slot} ({self.adapters[slot]}): {state}")
        for got in ("sglang", "kit"):
            rows = [r for r in self.rows if r.got == got]
            if not rows:
                continue
            bad = [r for r in rows if not r.close]
            lines.append(f"{self.release.label} vs PEFT:" if got == "sglang" else "kit's pool vs PEFT:")
            lines += [("  " + str(r).replace("\n", "\n  ")) for r in (bad or [r for r in rows if r.expert is None])]
            if not bad:
                lines.append("  every expert matches")
        if self.sglang_error is not None:
            lines.append(f"{self.release.label}'s sink LoRA delta is off by a relative error of {self.sglang_error:.4g} "
                         "(Frobenius, all modules and slots)")
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"adapters": self.adapters, "sink": {"n_shared_experts": self.n, "hidden": self.hidden,
                                                    "intermediate": self.intermediate},
                "sglang": self.release.version, "tokens": self.tokens, "seed": self.seed, "status": self.status,
                "peft_by": self.peft_by, "agree": self.agree,
                "sglang_relative_error": self.sglang_error, "rows": [asdict(r) for r in self.rows]}


def _sglang_deltas(path: SglangRun, module: str) -> Deltas | None:
    """What the served sink adds for ``module`` (``path.served``: the slot's factors as
    sglang loaded them, the per-expert defect applied)."""
    f = path.served.get(module)
    return None if f is None else factor_deltas(f.gate_up_a, f.gate_up_b, f.down_a, f.down_b)


def compare(adapters: Sequence[str | os.PathLike[str] | Adapter], n_shared_experts: int, hidden: int, intermediate: int, *,
            target_modules: Sequence[str] | None = None, repair: bool = False, tokens: int = 8,
            seed: int = 0, sglang: str | Release | None = None) -> CompareReport:
    """The three deltas of each adapter (slot ``i`` = ``adapters[i]``: a folder, or an
    ``Adapter`` in memory) on one seeded random batch of ``tokens`` tokens; never raises
    on a bad adapter (its column says why).

    ``target_modules``: the server's ``--lora-target-modules`` (default: each adapter's
    own). ``repair``: let the converter make the repairs that guess. ``sglang``: the
    release whose serving the ``sglang`` column is (default 0.5.23; the first line of the
    report names it).
    """
    if isinstance(adapters, (str, bytes, os.PathLike, Adapter)) or not isinstance(adapters, Iterable):
        raise TypeError(f"compare: adapters must be a non-empty list of adapter folders (or Adapters), one per "
                        f"slot, got {adapters!r}")
    adapters = list(adapters)  # a one-shot iterable is read once: walked twice, it compared nothing and "agreed"
    if not adapters:
        raise TypeError("compare: adapters must be a non-empty list of adapter folders (or Adapters), one per "
                        "slot, got none")
    n = n_shared_experts
    sizes = (("n_shared_experts", n), ("hidden", hidden), ("intermediate", intermediate), ("tokens", tokens))
    for name, value in sizes:  # whole numbers of at least 1 first; then the batch's size, with the adapters'
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            check_size(f"compare: {name}", value, minimum=1)
    check_seed("compare: seed", seed)
    _check_batch_size(n, hidden, intermediate, tokens, adapters)
    folders = [Path(a.source) if isinstance(a, Adapter) else as_path(f"compare: adapter {i}", a)
               for i, a in enumerate(adapters)]
    report = CompareReport([a.name if isinstance(a, Adapter) else f.name for a, f in zip(adapters, folders)], n,
                           hidden, intermediate, tokens, seed, {"peft": [], "sglang": [], "kit": []},
                           release=release(sglang))
    batch = Batch.random(n, hidden, intermediate, tokens, seed)
    for slot, (given, folder) in enumerate(zip(adapters, folders)):
        try:
            adapter: Adapter | None = given if isinstance(given, Adapter) else load_adapter(folder, guess=repair)
            refused = ""
        except (OSError, ValueError) as exc:
            adapter, refused = None, exception_text(exc)
        in_memory = given if isinstance(given, Adapter) and not (folder / "adapter_config.json").is_file() else None
        path = run_sglang(folder, n, hidden, intermediate, target_modules=target_modules,
                          name=report.adapters[slot], state=in_memory, sglang=report.release)
        if path.raised is not None:
            report.status["sglang"].append(f"not served: it fails to load ({path.raised.text}"
                                           + (f"; {path.raised.note}" if path.raised.note else "") + ")")
        elif path.unknown:
            report.status["sglang"].append(f"not computed: {path.unknown}")
        else:
            report.status["sglang"].append("computed")
        pool = None
        if adapter is None:
            report.status["kit"].append(f"not computed: the kit refuses it ({refused})")
        else:
            try:  # its slot of the pool, converted alone so that one bad adapter does not hide the others
                pool = convert([adapter], n, hidden=hidden, intermediate=intermediate)
                report.status["kit"].append("computed")
            except (ValueError, RuntimeError, AssertionError) as exc:
                report.status["kit"].append(f"not computed: the converter refuses it ({exception_text(exc)})")
        report.status["peft"].append("computed")
        add_slot(report, slot, batch, path, adapter, pool, source=given)
    return report


BATCH_LIMIT = 2 ** 28
"""The most float64 values one tensor of ``compare``'s random sink or batch may hold (2 GiB):
the real Inkling sink (n 2, H 6144, F 3072) needs a seventh of it."""


def _check_batch_size(n: int, hidden: int, intermediate: int, tokens: int,
                      adapters: Sequence[str | os.PathLike[str] | Adapter]) -> None:
    """Refuse (``ISL-K163``) a random sink or batch too large to allocate, before anything is,
    with the adapters' own sizes (a mistyped --hidden is the usual cause)."""
    largest = max(n * intermediate * hidden, tokens * hidden)
    if largest <= BATCH_LIMIT:
        return
    sizes = []
    for given in adapters:
        try:
            adapter = given if isinstance(given, Adapter) else load_adapter(given)
            f = adapter.module_factors(adapter.modules[0], n)
            sizes.append(f"{adapter.name!r} has H={f.gate_up_a.shape[-1]}, F={f.down_a.shape[-1]}")
        except (OSError, ValueError, RuntimeError):
            continue  # its own column would have said why; here only the sizes matter
    raise ValueError(message("ISL-K163", n=n, hidden=hidden, intermediate=intermediate, tokens=tokens,
                             gib=f"{largest * 8 / 2 ** 30:.3g}", adapters="; ".join(sizes) or "no adapter is readable"))


def reference(source: str | os.PathLike[str] | Adapter, adapter: Adapter | None, n: int, hidden: int,
              intermediate: int, probes: tuple[torch.Tensor, torch.Tensor] | None = None) -> ReferenceDeltas:
    """PEFT's deltas of ``source`` by PEFT itself (``peft_reference``); where PEFT refuses
    the folder, the kit's reading of ``adapter`` labelled with PEFT's reason (e.g. a
    transposed factor that PEFT cannot load and the kit repairs). Raises when neither
    can (``PeftRefused``, or the kit's own error). ``probes``: ``(x [H, k], u [n, F, k])``,
    the deltas applied to them instead (``peft_probes``: a ``ReferenceProbes``, nothing
    dense formed by PEFT's layers)."""
    try:
        if probes is not None:
            return peft_probes(source, n, hidden, intermediate, *probes)
        return peft_reference(source, n, hidden, intermediate)
    except PeftRefused as exc:
        if adapter is None:
            raise
        try:
            deltas = {m: kit_reading(adapter, m, n) for m in adapter.modules}
        except (RuntimeError, ValueError, IndexError):
            raise exc from None  # it fits neither: PEFT's own words say why
        if probes is not None:
            return ReferenceProbes({m: probe(d, *probes) for m, d in deltas.items()}, "kit", str(exc))
        return ReferenceDeltas(deltas, "kit", str(exc))


def add_slot(report: CompareReport, slot: int, batch: Batch, path: SglangRun, adapter: Adapter | None, pool: Any,
             source: str | os.PathLike[str] | Adapter | None = None) -> None:
    """Compare one slot: PEFT's math of ``source`` (default ``adapter``; computed by PEFT
    where installed, ``reference``), what sglang serves (``path``, a finished
    ``run_sglang``) and ``pool`` (the kit's, the adapter in its slot 0, or ``None``);
    fills ``report.deltas``, ``report.rows`` and ``report.peft_by`` (the doctor sizes a
    finding with it, from the stages it already ran). ``adapter``: the kit's reading,
    ``None`` when the kit refuses the folder (PEFT's column and sglang's still compare)."""
    n = report.n
    causes = "; ".join([*path.causes, *config_causes(path.config, [k for k in path.weights if FactorName.parse(k)],
                                                     report.adapters[slot], report.release)[0]])
    while len(report.peft_by) <= slot:
        report.peft_by.append("")
    try:  # the adapter's math on this sink: it must fit (n experts of F features, hidden size H)
        ref = reference(source if source is not None else adapter, adapter, n, report.hidden, report.intermediate)
        peft = {m: batch.delta(d) for m, d in ref.deltas.items()}
    except PeftRefused as exc:
        report.status["peft"][slot] = f"not computed: {exc}"
        return
    except (RuntimeError, ValueError, IndexError, OSError) as exc:
        why = "the adapter does not fit this sink" if adapter is not None else "the kit cannot read it"
        report.status["peft"][slot] = f"not computed: {why} ({exception_text(exc)})"
        return
    report.peft_by[slot] = ref.label
    for module in peft:
        got = {"peft": peft[module]}
        if path.raised is None and not path.unknown:
            got["sglang"] = batch.delta(_sglang_deltas(path, module))
        if pool is not None:  # a module PEFT trains and the pool lacks: the kit serves nothing for it
            got["kit"] = batch.delta(factor_deltas(*(b[0] for b in pool.buffers(module))) if module in pool.layers
                                     else None)
        report.deltas[module, slot] = got
        for what in ("sglang", "kit"):
            if what not in got:
                continue
            for e in [*range(n), None]:
                a, b = (got[what].sum(0), got["peft"].sum(0)) if e is None else (got[what][e], got["peft"][e])
                row = mismatch(a, b, module=module, slot=slot, adapter=report.adapters[slot], expert=e, got=what)
                if not row.close:
                    row.cause = causes if what == "sglang" else "the kit's pool differs from PEFT's math (a bug)"
                report.rows.append(row)


def compare_figure_data(report: CompareReport, module: str | None = None, slot: int = 0) -> dict[str, Any]:
    """The numbers a figure of ``compare`` draws, for one module and slot: each
    computation's per-expert delta norm ``‖delta_e‖`` and its difference to PEFT's."""
    module = module or next(m for m, s in report.deltas if s == slot)
    got = report.deltas[module, slot]
    norms = {what: [float(d[e].norm()) for e in range(d.shape[0])] for what, d in got.items()}
    off = {what: [float((d[e] - got["peft"][e]).norm()) for e in range(d.shape[0])]
           for what, d in got.items() if what != "peft"}
    return {"module": module, "slot": slot, "adapter": report.adapters[slot], "norms": norms, "differences": off}


def compare_figure(report: CompareReport, module: str | None = None, slot: int = 0):
    """Bars per expert: the size of each computation's LoRA delta (PEFT, sglang, kit)
    and, below, how far sglang's and the kit's are from PEFT's."""
    import matplotlib.pyplot as plt

    data = compare_figure_data(report, module, slot)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 4.5), constrained_layout=True, sharex=True)
    colors = {"peft": "#4c72b0", "sglang": "#dd8452", "kit": "#55a868"}
    n = len(data["norms"]["peft"])
    width = 0.8 / len(data["norms"])
    for i, (what, values) in enumerate(data["norms"].items()):
        top.bar([e + i * width for e in range(n)], values, width, label=what, color=colors[what])
    for i, (what, values) in enumerate(data["differences"].items()):
        bottom.bar([e + (i + 1) * width for e in range(n)], values, width, label=f"{what} − peft", color=colors[what])
    top.set_ylabel("‖delta_e‖")
    bottom.set_ylabel("‖delta_e − peft_e‖")
    bottom.set_xticks([e + 0.4 - width / 2 for e in range(n)], [f"expert {e}" for e in range(n)])
    top.legend(fontsize=8)
    bottom.legend(fontsize=8)
    layer = data["module"].split(".layers.")[-1].split(".")[0]
    top.set_title(f"{data['adapter']}: each expert's LoRA delta, three ways (layer {layer}; kit − peft is zero)",
                  fontsize=10)
    return fig
