"""From PEFT adapters to the four pool buffers, and the doctor that explains why not.

``convert`` is the multi-slot dense converter: adapters in, one slot each; per
shared-sink module the four 4D buffers out (``gate_up_a [S, O, 2R, H]``,
``gate_up_b [S, n, 2F, R]``, ``down_a [S, n, R, F]``, ``down_b [S, O, H, R]``), ready
for ``set_lora_info``. Ranks are padded to the largest (or ``max_rank``), B factors
carry the scaling, the outer layout is shared only when every adapter's is, and
tensor-parallel rank ``k`` of ``tp`` gets its slice of ``F``. ``ConvertedPool.save``
writes one safetensors file with the geometry, the slots and the source adapters'
sha256 in its metadata, atomically, never over an input.

``doctor`` walks one adapter down upstream's path (normalize, slice, load, validate)
and reports the first error upstream would raise (its exact message), then every
finding with its fix.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors import safe_open
from safetensors.torch import save as save_safetensors_bytes
from tqdm.auto import tqdm

from .adapters import CONFIG_FILE, WEIGHTS_FILE, Adapter, FactorName, load_adapter
from .atomic import atomic_write
from .errors import find_entry
from .geometry import BUFFER_NAMES, Geometry
from .lora import SharedSinkLoRA
from .parallel import check_tp
from .pool import LoRAFactors, LoRAPool
from .upstream_defect import collapse_pool_outer, doctor_finding
from .validate import PRETTY, Finding, diagnose_pool

POOL_FORMAT = "inkling-lab shared-sink pool v1"
PROGRESS_BYTES = 64 * 2 ** 20
"""Inputs above this many bytes get a progress bar (unless told otherwise)."""

Buffers = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class SlotInfo:
    """What one slot of a converted pool holds."""

    slot: int
    adapter: str
    rank: int
    lora_alpha: float
    scaling: float
    sha256: str
    source: str = ""  # where it was read from; not written into pool files (no machine paths)


@dataclass
class ConvertedPool:
    """The converter's output: per shared-sink module the four 4D buffers, one slot
    per adapter (scaling folded into B), with what each slot holds."""

    geometry: Geometry
    layers: dict[str, Buffers]
    slots: list[SlotInfo]
    tp_rank: int = 0
    tp_size: int = 1
    findings: list[Finding] = field(default_factory=list)

    def buffers(self, module: str | None = None) -> Buffers:
        """``(gate_up_a, gate_up_b, down_a, down_b)`` of ``module`` (default: the only,
        or first, module), in ``set_lora_info`` order."""
        if module is None:
            module = next(iter(self.layers))
        if module not in self.layers:
            raise KeyError(f"no module {module!r} in this pool; modules: {list(self.layers)}")
        return self.layers[module]

    @property
    def lora_ranks(self) -> list[int]:
        """Each slot's adapter rank (for ``SlotBatch``)."""
        return [s.rank for s in self.slots]

    def summary(self) -> dict[str, Any]:
        """Geometry, tensor-parallel rank, slots (adapter, rank, scaling, sha256), modules, dtype."""
        g = self.geometry
        return {
            "geometry": {"n": g.n, "hidden": g.hidden, "intermediate": g.intermediate, "rank": g.rank,
                         "slots": g.slots, "outer": g.outer},
            "tensor_parallel": {"rank": self.tp_rank, "size": self.tp_size},
            "slots": [{k: v for k, v in asdict(s).items() if k != "source"} for s in self.slots],
            "modules": list(self.layers),
            "dtype": str(next(iter(self.layers.values()))[0].dtype).replace("torch.", ""),
        }

    def metadata(self) -> dict[str, str]:
        """``summary`` as safetensors metadata (strings; JSON where structured)."""
        return {"format": POOL_FORMAT, **{k: v if isinstance(v, str) else json.dumps(v)
                                          for k, v in self.summary().items()}}

    def tensors(self) -> dict[str, torch.Tensor]:
        """The buffers by file key ``<module>.<buffer>`` (``....shared_experts.gate_up_a``)."""
        return {f"{m}.{name}": t.contiguous() for m, bufs in self.layers.items()
                for name, t in zip(BUFFER_NAMES, bufs)}

    def save(self, path: str | os.PathLike[str], force: bool = False) -> Path:
        """Write the pool as one safetensors file with metadata, atomically.

        Refuses (``ISL-K213``) to write over an existing file unless ``force``, and
        always refuses to write over one of the source adapters' files.
        """
        path = Path(path)
        inputs = {(Path(s.source) / f).resolve() for s in self.slots if s.source for f in (CONFIG_FILE, WEIGHTS_FILE)}
        refusal = None
        if path.resolve() in inputs:
            refusal = ("it is one of the input adapters' files (inkling-lab never writes over its inputs); "
                       "choose another output path")
        elif path.exists() and not force:
            refusal = "it already exists; pass --force (force=True) to replace it"
        if refusal:
            exc = FileExistsError(f"refusing to write {path.name}: {refusal}")
            exc.add_note(f"output path: {path}")
            raise exc
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, save_safetensors_bytes(self.tensors(), metadata=self.metadata()))
        return path

    def __repr__(self) -> str:
        g = self.geometry
        layout = "shared outer" if g.shared_outer else "per-expert outer"
        return (f"ConvertedPool(n={g.n}, H={g.hidden}, F={g.intermediate}, R={g.rank}, S={g.slots}, {layout}, "
                f"tp {self.tp_rank}/{self.tp_size}, {len(self.layers)} module(s), "
                f"slots={[s.adapter for s in self.slots]})")


def load_pool(path: str | os.PathLike[str]) -> ConvertedPool:
    """Read a file written by ``ConvertedPool.save``."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != POOL_FORMAT:
            raise ValueError(f"{Path(path).name}: not an inkling-lab pool file (its metadata has no "
                             f"format {POOL_FORMAT!r}); make one with `inkling-lab convert`")
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    geometry = Geometry(**json.loads(meta["geometry"]))
    tp = json.loads(meta["tensor_parallel"])
    layers = {m: tuple(tensors[f"{m}.{name}"] for name in BUFFER_NAMES) for m in json.loads(meta["modules"])}
    slots = [SlotInfo(**s) for s in json.loads(meta["slots"])]
    return ConvertedPool(geometry, layers, slots, tp["rank"], tp["size"])


def _shard(sink: SharedSinkLoRA, f: LoRAFactors, tp_rank: int, tp_size: int) -> LoRAFactors:
    """Tensor-parallel rank ``tp_rank``'s share (SPEC §7), by the sink's own slicing:
    down A cut along F, gate/up B to this rank's slice of each half, outer replicated."""
    return LoRAFactors(
        sink.slice_lora_a(f.gate_up_a, tp_rank, "gate_up_proj", tp_size),
        sink.slice_lora_b(f.gate_up_b, tp_rank, "gate_up_proj", tp_size),
        sink.slice_lora_a(f.down_a, tp_rank, "down_proj", tp_size),
        sink.slice_lora_b(f.down_b, tp_rank, "down_proj", tp_size),
        lora_alpha=f.lora_alpha, name=f.name)


def convert(adapters: Sequence[Adapter], n_shared_experts: int, *, hidden: int | None = None,
            intermediate: int | None = None, max_rank: int | None = None, outer: int | None = None,
            tp_rank: int = 0, tp_size: int = 1, dtype: torch.dtype = torch.float32,
            progress: bool | None = None) -> ConvertedPool:
    """Adapters in (slot ``i`` holds ``adapters[i]``), the pool buffers out.

    ``hidden``/``intermediate``: the model's ``H`` and full per-expert ``F`` (default:
    the first adapter's); each rank of ``tp_size`` holds ``F / tp_size``. ``max_rank``:
    the pool's ``R`` (default: the largest adapter rank). ``outer``: ``1`` or ``n``
    (default: ``1`` when every adapter's outer factors are shared, or the same for every
    expert: those collapse to shared outer, exactly, with a note). ``progress``:
    a bar on stderr (default: for inputs over 64 MiB).

    Raises what upstream raises on the way: torch's reshape error for flat factors
    that do not split into ``n`` (``ISL-E012``), ``ISL-E015`` for a per-expert adapter
    in a shared-outer pool, ``ISL-E016`` for an adapter of larger rank or of another
    ``H`` or ``F``; and the kit's ``ISL-K101``/``K102`` for a bad tensor-parallel split.
    """
    if not adapters:
        raise ValueError("convert needs at least one adapter")
    n = n_shared_experts
    per_adapter = [a.factors(n) for a in adapters]
    first = next(iter(per_adapter[0].values()))
    H = hidden if hidden is not None else int(first.gate_up_a.shape[-1])
    F_full = intermediate if intermediate is not None else int(first.down_a.shape[-1])
    check_tp(F_full, tp_size)
    sink = SharedSinkLoRA(n, H, F_full, device="meta")  # its slicing only: no weights are allocated
    per_adapter = [{m: _shard(sink, f, tp_rank, tp_size) for m, f in fs.items()} for fs in per_adapter]
    per_adapter, collapse_notes = collapse_pool_outer(per_adapter, [a.name for a in adapters], outer)  # ISL-W001
    if outer is None:
        outer = 1 if all(f.outer == 1 for fs in per_adapter for f in fs.values()) else n
    R = max_rank if max_rank is not None else max(f.rank for fs in per_adapter for f in fs.values())
    geometry = Geometry(n=n, hidden=H, intermediate=F_full // tp_size, rank=R, slots=len(adapters), outer=outer)
    modules = list(dict.fromkeys(m for fs in per_adapter for m in fs))
    size = sum(t.numel() * t.element_size() for a in adapters for t in a.weights.values())
    show = progress if progress is not None else size >= PROGRESS_BYTES
    layers: dict[str, Buffers] = {}
    with tqdm(total=len(modules) * len(adapters), disable=not show, desc="converting", unit="factor set") as bar:
        for m in modules:
            pool = LoRAPool.from_geometry(geometry, dtype=dtype)
            for s, (adapter, fs) in enumerate(zip(adapters, per_adapter)):
                if m in fs:
                    try:
                        pool.load(s, fs[m], name=adapter.name)
                    except (AssertionError, ValueError) as exc:
                        exc.add_note(f"while loading adapter {adapter.name!r} into slot {s}, module {m}")
                        raise
                bar.update()
            layers[m] = pool.buffers()
    slots = [SlotInfo(s, a.name, next(iter(fs.values())).rank, a.lora_alpha, a.scaling, a.sha256, a.source)
             for s, (a, fs) in enumerate(zip(adapters, per_adapter))]
    findings = [f for a in adapters for f in a.findings] + collapse_notes
    return ConvertedPool(geometry, layers, slots, tp_rank, tp_size, findings)


# ----------------------------------------------------------------------------
# The doctor
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
        return entry is not None and entry.by_upstream

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
    upstream = entry is not None and entry.by_upstream
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
