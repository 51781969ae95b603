"""The adapter doctor: what an sglang release (default 0.5.23) does with one PEFT adapter, next to what it means.

``doctor(folder, n, H, F)`` follows the adapter down sglang's own loading path, one
stage at a time, each run once and recorded (what it produced, or the error it hit;
the path itself is ``sglang_path.run_sglang``):

1. ``read``: the config as ``LoRAConfig`` and ``LoRAAdapter.__init__`` read it, the
   DoRA refusal of ``LoRAManager.validate_new_adapter``, the weights files as
   ``DefaultModelLoader`` finds them (every ``*.safetensors``, else ``*.bin``);
2. ``normalize``: upstream's three steps (docs/reference.md#adapters-on-disk), with its raw errors;
3. ``targets``: the server's target modules decide whether the sink is wrapped at
   all and which weights match no target module (``init_lora_modules``, ``load_lora_weight_to_buffer``);
4. ``shard``: tensor-parallel rank 0's slice (docs/reference.md#tensor-parallelism);
5. ``pool``: the buffer load with sglang's one ``lora_alpha / r`` and its shape asserts;
6. ``set_lora_info``: the five checks (docs/reference.md#validation-order) on the pool sglang built;
7. ``forward``: what the served sink then computes (the per-expert defect, NaN).

The report carries three verdicts that are never mixed: what sglang does when it
loads the adapter (loads / raises, with the exact text, and the exact warning it
logs first for weights that match no target module), what sglang then computes (the adapter's math, something else and
why, or the base model only), and what the kit's converter does (writes the
adapter's math, with its repairs, or refuses, with the reason). Exit status 1
whenever sglang fails or serves something other than the adapter's math.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import numbers
import os
import sys
import types
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence


from .adapters import (CONFIG_FILE, WEIGHTS_FILE, Adapter, as_path, FactorName, load_adapter, open_safetensors,
                       peft_target_parameter_keys)
from .catalog import CatalogEntry, Finding, UpstreamDefectWarning, finding
from .convert import ConvertedPool, convert
from .errors import find_entry
from .geometry import BUFFER_NAMES, check_size
from .pool import LoRAFactors
from .releases import Release, release
from .shard import shard_factors
from .sglang_path import SINK_TARGETS, config_causes, exception_text, run_sglang
from .upstream_defect import doctor_finding
from .validate import PRETTY



# -- the three verdicts ---------------------------------------------------------------

@dataclass
class SglangLoad:
    """Verdict 1, what sglang 0.5.23 does when it loads the adapter. ``outcome``:
    ``loads``, ``raises`` (``text``: the exact ``Type: message``), or ``unknown`` (the kit
    cannot see; ``why``). ``warning``: the exact warning it logs first for weights that
    match no target module (``ISL-W002``; its buffer load then raises on them). ``note``:
    where ``text`` is not sglang's to the letter (its target set printed sorted)."""

    outcome: str
    text: str = ""
    stage: str = ""
    upstream: str = ""
    why: str = ""
    warning: str = ""
    note: str = ""


@dataclass
class SglangCompute:
    """Verdict 2, what the served sink computes. ``outcome``: ``adapter`` (the adapter's
    math), ``different`` (``causes`` by name; ``relative_error`` of the LoRA delta when
    measured), ``base`` (the base model only), ``nan``, ``nothing`` (it does not load),
    or ``unknown``."""

    outcome: str
    causes: list[str] = field(default_factory=list)
    relative_error: float | None = None


@dataclass
class KitVerdict:
    """Verdict 3, what ``inkling-lab convert`` does: ``writes`` the adapter's math (with
    ``repairs``, each a finding), or ``refuses`` (``text``: its error, with the way out)."""

    outcome: str
    text: str = ""
    code: str | None = None
    repairs: list[str] = field(default_factory=list)


@dataclass
class DoctorReport:
    """What sglang 0.5.23 does with one adapter for a sink of ``n``, ``H``, ``F``, next to
    the adapter's math and the kit's converter; every finding with its fix.

    ``load``, ``computes``, ``kit``: the three verdicts. ``stages``: each stage of the
    path, what it produced or where it failed. ``journey``: each pool buffer's shapes,
    as saved in the file -> normalized -> in the kit's pool. ``targets``: the server's
    target modules the verdicts assume, and ``targets_from`` where they came from.
    """

    adapter: str
    n: int
    hidden: int
    intermediate: int
    tp: int
    max_rank: int | None
    targets: list[str] = field(default_factory=list)
    targets_from: str = ""
    load: SglangLoad = field(default_factory=lambda: SglangLoad("unknown"))
    computes: SglangCompute = field(default_factory=lambda: SglangCompute("unknown"))
    kit: KitVerdict = field(default_factory=lambda: KitVerdict("refuses"))
    findings: list[Finding] = field(default_factory=list)
    stages: list[dict[str, Any]] = field(default_factory=list)
    journey: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    pool: ConvertedPool | None = None
    about: str = ""
    error: BaseException | None = None
    """The kit's own refusal (its converter's error), if any."""
    cure: str = ""
    """Where sglang would not serve the adapter's math: whether ``inkling-lab export``
    writes an adapter it serves as trained, or why it cannot be cured."""
    release: Release = field(default_factory=release)
    """The sglang release whose verdicts these are (``--sglang``; default 0.5.23)."""
    activation: str = "silu"
    activation_from: str = ""
    """The model's ``hidden_act`` and where the doctor learnt it (``model_activation``)."""

    @property
    def exit_status(self) -> int:
        """0 only when sglang loads the adapter and serves its math; else 1."""
        return 0 if self.load.outcome == "loads" and self.computes.outcome == "adapter" else 1

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    @property
    def fails(self) -> bool:
        """True when sglang raises while loading it."""
        return self.load.outcome == "raises"

    @property
    def error_code(self) -> str | None:
        """The catalog code of sglang's error, else of the kit's refusal."""
        for text in (self.load.text if self.load.outcome == "raises" else "", self.kit.text):
            entry = find_entry(text) if text else None
            if entry is not None:
                return entry.code
        return None

    def raise_for_sglang(self) -> None:
        """Raise what sglang 0.5.23 raises loading the adapter (verdict 1, ``load.text``),
        as the builtin exception type its text names (``RuntimeError`` for another type);
        nothing when sglang loads it. For scripts and ``expect_error``: the doctor itself
        never raises."""
        if self.load.outcome != "raises":
            return
        name, _, text = self.load.text.partition(": ")
        exc_type = getattr(builtins, name, None)
        if not (isinstance(exc_type, type) and issubclass(exc_type, Exception)):
            raise RuntimeError(self.load.text)
        if exc_type is KeyError:  # its text is the key's repr: raise the key, so str() reads the same
            with contextlib.suppress(ValueError, SyntaxError):
                raise KeyError(ast.literal_eval(text))
        raise exc_type(text)

    def warn(self, stacklevel: int = 2) -> None:
        """Emit every ``ISL-W…`` finding as an ``UpstreamDefectWarning`` (its message: the
        catalog entry it belongs to is found from it)."""
        for f in self.findings:
            if f.code.startswith("ISL-W"):
                warnings.warn(UpstreamDefectWarning(f.message), stacklevel=stacklevel)

    def _verdict_lines(self) -> list[str]:
        wrapped = ("\n    (with the adapter in --lora-paths, at startup, as RuntimeError: Failed to load LoRA adapter "
                   f"{Path(self.adapter).name}: {self.load.text.split(': ', 1)[-1] if ': ' in self.load.text else ''})"
                   if self.load.stage in ("read", "normalize") else "")
        warned = (f"loads it; when a batch first uses it, logs this warning (mem_pool.py: "
                  f"LoRAMemoryPool.load_lora_weight_to_buffer):\n    {self.load.warning}\n  then "
                  if self.load.warning else "")
        load = {"loads": "loads it" + (f" ({self.load.why})" if self.load.why else ""),
                "raises": f"{warned}raises (in {self.load.stage}; {self.load.upstream}):\n    {self.load.text}"
                          + (f"\n    ({self.load.note})" if self.load.note else "") + wrapped,
                "unknown": f"may load it; the kit cannot tell: {self.load.why}"}[self.load.outcome]
        c = self.computes
        computes = {"adapter": "the adapter's math",
                    "different": "something other than the adapter's math",
                    "base": "the base model only (the adapter changes nothing)",
                    "nan": "NaN (every output of the adapter's requests)",
                    "nothing": "nothing (it does not load)",
                    "unknown": "what the kit cannot tell from the files"}[c.outcome]
        if c.relative_error is not None and c.outcome in ("different", "base"):
            computes += f" (relative error of the LoRA delta on random inputs: {c.relative_error:.3g})"
        kit = ("writes the adapter's math" + (f", after {len(self.kit.repairs)} repair(s): "
                                                + "; ".join(self.kit.repairs) if self.kit.repairs else "")
               if self.kit.outcome == "writes" else f"refuses it:\n    {self.kit.text}")
        label = self.release.label
        lines = [f"1. {label} {load}", f"2. {label} then computes {computes}"]
        lines += [f"     because {cause}" for cause in c.causes if cause != self.load.why]
        lines.append(f"3. inkling-lab convert {kit}")
        if self.cure:
            lines.append(f"4. {self.cure}")
        return lines

    def __str__(self) -> str:
        lines = [f"{self.release.label}, adapter {self.adapter}" + (f": {self.about}" if self.about else ""),
                 f"Sink: n={self.n}, H={self.hidden}, F={self.intermediate}"
                 + (f" (tp={self.tp}: F={self.intermediate // self.tp} per rank)" if self.tp > 1 else "")
                 + (f", pool max rank R={self.max_rank}" if self.max_rank else ""),
                 f"Server target modules: {self.targets} ({self.targets_from})"]
        lines += self._verdict_lines()
        for module, rows in self.journey.items():
            lines.append(f"Shapes, as saved -> normalized -> in the kit's pool ({module}):")
            for row in rows:
                peft = " + ".join(f"{label} {_fmt(s)}" for label, s in row["peft"]) or row.get("from", "")
                norm = _fmt(row["normalized"]) if row["normalized"] else "?"
                pool = _fmt(row["pool"]) if row["pool"] else "?"
                lines.append(f"  {PRETTY[row['buffer']]:<10} {peft} -> {norm} -> {pool}")
        lines.append(f"Findings ({len(self.findings)}):" if self.findings else "Findings: none")
        quoted = self.load.warning or None
        # the skip warning is quoted in full under verdict 1: its finding points there
        lines += [str(f).replace(quoted, "the warning quoted under 1. above", 1) if quoted and f.message == quoted
                  else str(f) for f in self.findings]
        lines.append(f"Exit status {self.exit_status}: " + (
            f"{self.release.label} loads it and serves the adapter's math" if self.ok else
            f"the {self.release.label} server does not start with these target modules (ISL-E038), so it never "
            f"loads the adapter" if self.error_code == "ISL-E038" else
            f"{self.release.label} fails to load it" if self.fails else
            f"the kit cannot tell whether {self.release.label} loads it" if self.load.outcome == "unknown" else
            f"{self.release.label} would not serve the adapter's math"))
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def to_dict(self) -> dict[str, Any]:
        """The report for machines (``--json``): the three verdicts, the stages, findings and shapes."""
        return {"adapter": self.adapter, "ok": self.ok, "exit_status": self.exit_status,
                "sink": {"n_shared_experts": self.n, "hidden": self.hidden, "intermediate": self.intermediate,
                         "tp": self.tp, "max_rank": self.max_rank},
                "server": {"target_modules": self.targets, "from": self.targets_from,
                           "wraps_sink": all(t in self.targets for t in SINK_TARGETS) or "all" in self.targets},
                "sglang": {"release": self.release.version, "load": asdict(self.load),
                           "computes": asdict(self.computes)},
                "model": {"hidden_act": self.activation, "from": self.activation_from},
                "kit": asdict(self.kit), "error_code": self.error_code, "export": self.cure,
                "findings": [asdict(f) for f in self.findings], "stages": self.stages, "shapes": self.journey}


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"




def _journey(saved: dict[str, list[int]], module: str, factors: LoRAFactors | None,
             pool_shapes: dict[str, tuple[int, ...]] | None) -> list[dict[str, Any]]:
    """Each pool buffer's way from the file: the 2D factors *as saved* (``saved``: key ->
    shape in the file, before any repair), normalized ``[O or n, ...]``, pool ``[S, ...]``
    (``None`` where the kit stopped before)."""
    rows = []
    normalized = factors.tensors() if factors is not None else {}
    exported = any(k.startswith(module + ".") for k in peft_target_parameter_keys(saved))
    # what a buffer with no factor of its own in the file is made from
    origin = "(PEFT target_parameters export, read per expert)" if exported else "(not in the adapter: zeros)"
    for name, (proj, ab) in {"gate_up_a": ("gate_up_proj", "A"), "gate_up_b": ("gate_up_proj", "B"),
                             "down_a": ("down_proj", "A"), "down_b": ("down_proj", "B")}.items():
        peft = []
        stacks = {"gate_proj", "up_proj", "gate_up_proj"} if proj == "gate_up_proj" else {"down_proj"}
        for key, shape in saved.items():
            fn = FactorName.parse(key)
            if fn is not None and fn.module == module and fn.ab == ab and fn.canonical in stacks:
                label = f"{'' if fn.expert is None else f'{fn.expert}.'}{fn.proj}.lora_{ab}"
                order = (fn.expert or 0, fn.canonical == "up_proj")  # gate before up, as stacked
                peft.append((order, label, list(shape)))
        rows.append({"buffer": name, "peft": [(label, shape) for _, label, shape in sorted(peft)],
                     "from": "" if peft else origin,
                     "normalized": list(normalized[name].shape) if name in normalized else None,
                     "pool": list(pool_shapes[name]) if pool_shapes else None})
    return rows


def shape_journey(adapter: Adapter, module: str, factors: LoRAFactors | None = None,
                  pool_shapes: dict[str, tuple[int, ...]] | None = None) -> list[dict[str, Any]]:
    """Each pool buffer's way from the PEFT file: the 2D factors it comes from, the
    normalized factor ``[O or n, ...]`` and the pool buffer ``[S, ...]``."""
    return _journey({k: list(adapter.weights[k].shape) for k in adapter.factor_keys}, module, factors, pool_shapes)


def _saved_shapes(folder: Path) -> dict[str, list[int]]:
    try:
        with open_safetensors(folder / WEIGHTS_FILE) as f:  # a regular file only: a FIFO would block
            return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception:  # noqa: BLE001 - unreadable: the verdicts say why
        return {}


def doctor(adapter: Adapter | str | os.PathLike[str], n_shared_experts: int, hidden: int, intermediate: int,
           max_rank: int | None = None, tp: int = 1, *, target_modules: Sequence[str] | None = None,
           repair: bool = False, measure: bool = True, hidden_act: str | None = None,
           config: str | os.PathLike[str] | None = None, sglang: str | Release | None = None) -> DoctorReport:
    """What sglang release ``sglang`` (default 0.5.23) does with one adapter folder for a
    sink of ``n``, ``H=hidden`` and full per-expert ``F=intermediate`` over ``tp`` ranks;
    never raises on bad input (an unknown release is a ``ValueError`` listing the known
    ones: that is the caller's mistake, not the adapter's). The report's first line names
    the release.

    ``target_modules``: the server's ``--lora-target-modules`` (default: the adapter's
    own ``target_modules``, and the report says so). ``max_rank``: the server's
    ``--max-lora-rank`` (default: the adapter's ``r``). ``repair``: let the kit's
    converter make repairs that guess (a folded down A, a rank read from the factors).
    ``measure``: run ``compare`` to size a difference (skip it for speed). ``hidden_act``:
    the model's ``config.hidden_act`` (an ``ACT2FN`` name; ``ISL-K154`` for one the kit
    does not know); default: read from ``config`` (the base model's ``config.json`` or its
    folder), else a ``config.json`` in the adapter folder or of its local base model, else
    ``silu`` (``transformers_interop.model_activation``; ``activation_from`` says where).
    Another than ``silu`` is ``ISL-W113``, sglang's sink computing SiLU.
    """
    from .transformers_interop import model_activation

    for what, value, low in (("n_shared_experts", n_shared_experts, 1), ("hidden", hidden, 1),
                             ("intermediate", intermediate, 1), ("tp", tp, 1), ("max_rank", max_rank, 0)):
        # not a size at all, or n and tp past any model (the path reshapes by them): refused by name before
        # anything is read; H, F or R past any model is the kit's verdict (ISL-K162, K164: with the adapter's
        # own sizes) and sglang's (its pool, unknown)
        if (value is not None or what != "max_rank") and (
                isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low
                or what in ("n_shared_experts", "tp")):
            check_size(f"doctor: {what}", value, low)
    n = n_shared_experts
    folder = Path(adapter.source) if isinstance(adapter, Adapter) else as_path("doctor: adapter", adapter)
    if folder.name in (CONFIG_FILE, WEIGHTS_FILE):
        folder = folder.parent
    held = isinstance(adapter, Adapter) and not adapter.source
    hidden_act, activation_from = model_activation(None if held else folder, config, hidden_act)
    # An adapter in memory is read as it stands (its factors as the kit repaired them); from a folder, as saved.
    in_memory = adapter if isinstance(adapter, Adapter) and not (folder / CONFIG_FILE).is_file() else None
    name = (in_memory.name if in_memory is not None else folder.name) or str(folder)
    sglang = release(sglang)
    report = DoctorReport(name if in_memory is not None else str(folder), n, hidden, intermediate, tp, max_rank,
                          release=sglang, activation=hidden_act, activation_from=activation_from)
    path = run_sglang(folder, n, hidden, intermediate, tp, max_rank, target_modules, name, state=in_memory,
                      sglang=sglang)
    raised = path.raised
    sglang_findings = [*([raised.finding] if raised is not None and raised.finding is not None else []),
                       *path.findings]
    if raised is not None:
        report.load = SglangLoad("raises", raised.text, raised.stage, raised.upstream,
                                 warning=path.skip_warning if raised.upstream.startswith("mem_pool.py") else "",
                                 note=raised.note)
    else:
        report.load = SglangLoad("loads")
    report.stages = path.stages
    report.targets = sorted(path.server)
    report.targets_from = ("--lora-target-modules" if target_modules is not None
                           else "the adapter's own target_modules (pass --lora-target-modules for the server's)")

    read = _kit(report, folder, adapter if isinstance(adapter, Adapter) else None, repair)
    causes, config_findings = config_causes(path.config, [k for k in path.weights
                                                          if FactorName.parse(k) is not None], name, sglang)
    report.findings = sglang_findings + config_findings + [f for f in report.findings if f not in sglang_findings]
    causes = [*path.causes, *causes]
    if hidden_act != "silu":
        report.findings.insert(0, finding("ISL-W113", "the model", more=True, activation=hidden_act,
                                          release=sglang.version))
        causes.append(f"the model computes {hidden_act}(gate) * up ({activation_from}), sglang's sink silu(gate) * up")
    if report.load.outcome == "raises":
        report.computes = SglangCompute("nothing")
    elif path.unknown:
        report.load = SglangLoad("unknown" if "torch.load" not in path.unknown else "loads", why=path.unknown)
        report.computes = SglangCompute("unknown", [path.unknown] + causes)
    elif path.base_only:
        report.computes = SglangCompute("base", causes)
    elif any("NaN" in c for c in causes):
        report.computes = SglangCompute("nan", causes)
    elif causes:
        report.computes = SglangCompute("different", causes)
    else:
        report.computes = SglangCompute("adapter")
    said = {"loads": "loads it", "unknown": "may load it",
            "raises": f"raises {report.load.text}"}[report.load.outcome]
    then = {"adapter": "and serves its math", "nothing": "", "different": "and serves something else (verdict 2)",
            "base": "and serves the base model", "nan": "and serves NaN", "unknown": ""}[report.computes.outcome]
    report.findings = [replace(f, consequence=f"{sglang.label} {said} {then}".strip())
                       if f.consequence == "inkling-lab convert refuses it" else f for f in report.findings]
    # (the measure runs a SiLU sink: it sizes the adapter's part, not another activation's)
    if measure and report.computes.outcome in ("different", "base") and read is not None and tp == 1 \
            and hidden_act == "silu":
        from .compare import Batch, CompareReport, add_slot

        sized = CompareReport([name], n, hidden, intermediate, 8, 0, {"peft": ["computed"]}, release=sglang)
        add_slot(sized, 0, Batch.random(n, hidden, intermediate), path, read, report.pool)  # the stages already run
        report.computes.relative_error = sized.sglang_error
    if not report.ok:
        from .export import cure

        report.cure = cure(read, report.error, folder, n, tp=tp, activation=(hidden_act, activation_from),
                           config=config, sglang=sglang)
    return report


def _kit(report: DoctorReport, folder: Path, given: Adapter | None, repair: bool) -> Adapter | None:
    """Verdict 3: the kit's converter on the same folder; the journey of the shapes.
    Returns the adapter as the kit read it (``None`` when it refuses to read it)."""
    n, rank = report.n, 0
    try:
        adapter = given if given is not None else load_adapter(folder, guess=repair)
        saved = adapter.saved_shapes
        report.about = (f"r={adapter.r}, lora_alpha={adapter.lora_alpha:g} (PEFT scaling {adapter.scaling:g}), "
                        f"{len(adapter.modules)} module(s)" + (f", sha256 {adapter.sha256[:12]}…" if adapter.sha256 else ""))
        factors = adapter.factors(n)
        rank = max(f.rank for f in factors.values())  # rank_pattern: a module may exceed r
        pool = convert([adapter], n, hidden=report.hidden, intermediate=report.intermediate,
                       max_rank=report.max_rank if report.max_rank is not None else rank, tp_size=report.tp,
                       factors=[factors])
        if report.max_rank is None:
            report.max_rank = rank
    except (OSError, ValueError, RuntimeError, AssertionError, MemoryError) as exc:
        report.error = exc
        entry = find_entry(exc)
        fix = _kit_fix(exc, entry, folder)
        if entry is not None and entry.code == "ISL-E016" and report.max_rank is not None and rank > report.max_rank:
            fix = f"convert with --max-rank {rank} or larger (sglang: --max-lora-rank {rank})"
        also = [note for note in getattr(exc, "__notes__", []) if note.startswith("also: ")]  # every bad factor
        report.kit = KitVerdict("refuses", "\n    ".join([exception_text(exc), *also]), entry.code if entry else None)
        report.findings.append(Finding(entry.code if entry else "error", "adapter", exception_text(exc),
                                       fix + (f" (more: inkling-lab explain {entry.code})" if entry else ""),
                                       upstream=bool(entry and entry.by_upstream),
                                       consequence="inkling-lab convert refuses it"))
        saved = _saved_shapes(folder)  # the kit refused to read it: its header, as saved
        for module in dict.fromkeys(fn.module for k in saved if (fn := FactorName.parse(k)) is not None):
            report.journey[module] = _journey(saved, module, None, None)
        return None
    report.pool = pool
    # A repair changes what the file holds (ISL-K...); a warning (ISL-W001) says what sglang does with it.
    report.kit = KitVerdict("writes", repairs=[f"{f.code} {f.message}" for f in adapter.findings
                                               if f.code.startswith("ISL-K")])
    report.findings += [f for f in adapter.findings if f.code.startswith(("ISL-K", "ISL-N"))]
    for module in adapter.modules:
        shapes = {name: tuple(t.shape) for name, t in zip(BUFFER_NAMES, pool.buffers(module))}
        report.journey[module] = _journey(saved or {k: list(adapter.weights[k].shape) for k in adapter.factor_keys},
                                          module, factors.get(module), shapes)
    return adapter


def _per_expert_defects(adapters: Sequence[tuple[Adapter, Mapping[str, LoRAFactors]]], pool: ConvertedPool
                        ) -> list[Finding]:
    """``ISL-W001`` for each adapter (and its normalized factors) a per-expert outer pool
    holds, module by module: sglang 0.5.23 would serve its gate/up delta wrongly."""
    if pool.geometry.shared_outer:
        return []
    n, found = pool.geometry.n, []
    for module in pool.layers:
        for adapter, factors in adapters:
            if module in factors:
                f = shard_factors(factors[module], pool.tp_rank, pool.tp_size, n)
                defect = doctor_finding({module: f}, what=f"adapter {adapter.name!r}")
                found += [defect] if defect is not None else []
    return found


def serving_findings(adapters: Sequence[Adapter], pool: ConvertedPool) -> list[Finding]:
    """What sglang 0.5.23 would do otherwise with the adapters of a converted ``pool``:
    each config as sglang reads it (rsLoRA, alpha and rank patterns, the fields it
    ignores: ``ISL-W1xx``) and, where the pool stays per expert, the per-expert defect
    (``ISL-W001``). For ``inkling-lab convert``, next to the converter's own findings."""
    n = pool.geometry.n
    config = [f for a in adapters for f in config_causes(a.config, a.factor_keys, a.name)[1]]
    return config + _per_expert_defects([(a, a.factors(n)) for a in adapters], pool)


def _kit_fix(exc: BaseException, entry: CatalogEntry | None, folder: Path) -> str:
    """The way out of a kit refusal: the exact step, the entry's ``doctor_fix`` where its
    message states the problem only, or the message's own advice."""
    text = str(exc)
    if entry is not None and entry.code == "ISL-K203" and any(folder.glob("*.bin")):
        binary = sorted(folder.glob("*.bin"))[0].name
        return ("convert it to safetensors once, where you trust the file: python -c \"import torch; from "
                "safetensors.torch import save_file; save_file(torch.load('" + binary + "', weights_only=True), "
                f"'{WEIGHTS_FILE}')\" (sglang reads the .bin itself with torch.load(weights_only=True))")
    if entry is not None and entry.doctor_fix:
        return entry.doctor_fix
    advice = text.split(": ", 1)[-1]
    return advice[advice.rfind(";") + 1:].strip() if ";" in advice else advice.rsplit(": ", 1)[-1]


class _CallableModule(types.ModuleType):
    """``il.doctor(...)`` keeps working after ``import inkling_lab.doctor``: importing a
    submodule binds the package attribute ``doctor`` to the module, so the module
    itself calls the function."""

    def __call__(self, *args: Any, **kwargs: Any) -> DoctorReport:
        return doctor(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
