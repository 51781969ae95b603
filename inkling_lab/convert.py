"""From PEFT adapters to the four pool buffers: the multi-slot dense converter.

``convert`` is the multi-slot dense converter: adapters in, one slot each; per
shared-sink module the four 4D buffers out (``gate_up_a [S, O, 2R, H]``,
``gate_up_b [S, n, 2F, R]``, ``down_a [S, n, R, F]``, ``down_b [S, O, H, R]``), ready
for ``set_lora_info``. Ranks are padded to the largest (or ``max_rank``), B factors
carry the scaling, the outer layout is shared only when every adapter's is, and
tensor-parallel rank ``k`` of ``tp`` gets its slice of ``F``. The buffers keep the
adapters' dtype unless told otherwise; B is scaled in that dtype and then cast, as
sglang's loader does, so that the pool equals sglang's bit for bit.
``ConvertedPool.save`` writes one safetensors file with the geometry, the slots and
the source adapters' sha256 in its metadata, atomically, never over an input;
``convert_to_file`` does the same module by module without holding the pool (the
command line's path: memory about the adapters' shared-sink factors plus one module).

It converts, nothing else: what sglang 0.5.23 would do with the same adapters (their
config's rsLoRA or patterns, a per-expert layout it computes wrongly) is the doctor's to
say, ``inkling_lab.doctor.serving_findings``.
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import torch
from safetensors import SafetensorError
from tqdm.auto import tqdm

from .adapters import CONFIG_FILE, WEIGHTS_FILE, Adapter, FactorName, HeaderError, as_path, open_safetensors
from .atomic import atomic_writer, check_target
from .catalog import Finding, error, message
from .geometry import BUFFER_NAMES, Geometry, check_size
from .shard import check_rank, check_tp, shard_factors
from .pool import LoRAFactors, LoRAPool, check_finite, collapse_pool_outer
from .records import dtype_name

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
    inferred: list[str] = field(default_factory=list)
    """The sizes the converter was not given and read from the adapters, each with from what."""

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
            "dtype": dtype_name(self.dtype),
        }

    @property
    def dtype(self) -> torch.dtype:
        """The buffers' dtype."""
        return next(iter(self.layers.values()))[0].dtype

    def metadata(self) -> dict[str, str]:
        """``summary`` as safetensors metadata (strings; JSON where structured)."""
        return {"format": POOL_FORMAT, **{k: v if isinstance(v, str) else json.dumps(v)
                                          for k, v in self.summary().items()}}

    def tensors(self) -> dict[str, torch.Tensor]:
        """The buffers by file key ``<module>.<buffer>`` (``....shared_experts.gate_up_a``)."""
        return {f"{m}.{name}": t.contiguous() for m, bufs in self.layers.items()
                for name, t in zip(BUFFER_NAMES, bufs)}

    def save(self, path: str | os.PathLike[str], force: bool = False) -> Path:
        """Write the pool as one safetensors file with metadata, atomically, one buffer at
        a time (no second copy of the pool in memory).

        Refuses (``ISL-K213``) to write over an existing file unless ``force`` (also when
        another writer creates it meanwhile), and always refuses to write over one of
        the source adapters' files.
        """
        path = _check_output(path, [s.source for s in self.slots], force)
        return _write_pool(path, self, iter(self.layers.values()), force)

    def __repr__(self) -> str:
        g = self.geometry
        layout = "shared outer" if g.shared_outer else "per-expert outer"
        return (f"ConvertedPool(n={g.n}, H={g.hidden}, F={g.intermediate}, R={g.rank}, S={g.slots}, {layout}, "
                f"tp {self.tp_rank}/{self.tp_size}, {len(self.layers)} module(s), "
                f"slots={[s.adapter for s in self.slots]})")


def _check_output(path: str | os.PathLike[str], sources: Sequence[str], force: bool) -> Path:
    """Refuse an output over an input adapter's file, and whatever ``atomic.check_target``
    refuses (an existing file without ``force``; a link, FIFO, socket, device or folder
    always; an empty path, a parent that is a file), early, before any work."""
    text = os.fspath(path)
    inputs = {(Path(s) / f).resolve() for s in sources if s for f in (CONFIG_FILE, WEIGHTS_FILE)}
    if text and Path(text).resolve() in inputs:
        exc = error("ISL-K213", file=Path(text).name, reason="it is one of the input adapters' files (inkling-lab "
                    "never writes over its inputs); choose another output path")
        exc.add_note(f"output path: {path}")
        raise exc
    return check_target(text, force=force)


_ST_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def stream_safetensors(path: Path, specs: Sequence[tuple[str, torch.dtype, Sequence[int]]],
                       chunks: Iterator[Mapping[str, torch.Tensor]], metadata: Mapping[str, str],
                       force: bool = False) -> Path:
    """Stream a safetensors file: the header (every tensor's dtype, shape and offsets,
    from ``specs``, in file order), then the tensors as ``chunks`` yields them (each a
    few tensors, in ``specs`` order), each checked against its spec. Holds one chunk
    at a time; written atomically (``exclusive`` unless ``force``)."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset = 0
    for key, dtype, shape in specs:
        if dtype not in _ST_DTYPES:
            raise ValueError(f"{key}: a safetensors file here holds {', '.join(dtype_name(d) for d in _ST_DTYPES)} "
                             f"tensors, not {dtype_name(dtype)}")
        size = math.prod(shape) * dtype.itemsize
        header[key] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # safetensors pads its header to 8 bytes
    order = iter(specs)
    with atomic_writer(path, exclusive=not force) as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for chunk in chunks:
            for key, t in chunk.items():
                want, dtype, shape = next(order)
                if key != want or t.dtype != dtype or list(t.shape) != list(shape):  # the header must not lie
                    raise RuntimeError(f"{path.name}: tensor {key} {dtype_name(t.dtype)} {list(t.shape)} is not "
                                       f"the header's {want} {dtype_name(dtype)} {list(shape)}")
                f.write(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().data)
    return path


def _write_pool(path: Path, pool: ConvertedPool, buffers: Iterator[Buffers], force: bool) -> Path:
    """The pool's file: each module's four buffers as ``buffers`` yields them."""
    dtype = pool.dtype
    if dtype not in _ST_DTYPES:
        raise ValueError(f"a pool file holds {', '.join(dtype_name(d) for d in _ST_DTYPES)} buffers, not "
                         f"{dtype_name(dtype)}: convert with one of those dtypes")
    specs = [(f"{m}.{name}", dtype, shape) for m in pool.layers for name, shape in pool.geometry.buffer_shapes().items()]
    chunks = ({f"{m}.{name}": t for name, t in zip(BUFFER_NAMES, bufs)} for m, bufs in zip(pool.layers, buffers))
    return stream_safetensors(path, specs, chunks, pool.metadata(), force)


def load_pool(path: str | os.PathLike[str]) -> ConvertedPool:
    """Read a file written by ``ConvertedPool.save`` (or ``convert_to_file``).

    Raises ``ValueError`` naming the file for anything else: no safetensors file, or
    one without the pool's metadata (``ISL-K403``).
    """
    path = as_path("load_pool: path", path)

    def refuse(why: str) -> ValueError:
        exc = ValueError(message("ISL-K403", file=path.name, why=why))
        exc.add_note(f"file: {path}")
        return exc

    try:
        with open_safetensors(path) as f:
            meta = f.metadata() or {}
            if meta.get("format") != POOL_FORMAT:
                raise refuse(f"its metadata has no format {POOL_FORMAT!r}")
            keys = set(f.keys())
            modules = json.loads(meta["modules"])
            names = [f"{m}.{name}" for m in modules for name in BUFFER_NAMES]
            missing = [k for k in names if k not in keys]
            if missing:
                raise refuse(f"its metadata lists tensor {missing[0]!r}, which it does not hold")
            tensors = {k: f.get_tensor(k) for k in names}
            geometry = Geometry(**json.loads(meta["geometry"]))
            tp = json.loads(meta["tensor_parallel"])
            slots = [SlotInfo(**s) for s in json.loads(meta["slots"])]
            tp_rank, tp_size = int(tp["rank"]), int(tp["size"])
    except FileNotFoundError:
        raise
    except (SafetensorError, OSError, HeaderError) as exc:
        raise refuse(f"not a readable safetensors file: {exc}") from None
    except (KeyError, TypeError, ValueError, RecursionError) as exc:
        if isinstance(exc, ValueError) and str(exc).startswith(path.name):
            raise
        raise refuse(f"its metadata is damaged: {type(exc).__name__}: {exc}") from None
    layers = {m: tuple(tensors[f"{m}.{name}"] for name in BUFFER_NAMES) for m in modules}
    return ConvertedPool(geometry, layers, slots, tp_rank, tp_size)


def _scaled(f: LoRAFactors, dtype: torch.dtype) -> LoRAFactors:
    """``f`` as sglang's loader writes it (``mem_pool.py``): B multiplied by the scaling
    in the adapter's stored dtype, then every factor cast to the pool's ``dtype``. The
    result carries scaling 1, so that the pool's own load multiplies by exactly 1."""
    s = f.scaling
    how = f"scaled by lora_alpha / r = {s:g} in the adapter's {dtype_name(f.gate_up_b.dtype)}, cast to {dtype_name(dtype)}"

    def made(key: str, t: torch.Tensor) -> torch.Tensor:  # an overflow is refused, naming the factor (ISL-K160)
        return check_finite(t, f"adapter {f.name!r}: {key}", how)

    return LoRAFactors(made("gate_up_a", f.gate_up_a.to(dtype)), made("gate_up_b", (f.gate_up_b * s).to(dtype)),
                       made("down_a", f.down_a.to(dtype)), made("down_b", (f.down_b * s).to(dtype)),
                       lora_alpha=float(f.rank), name=f.name)


def adapters_dtype(adapters: Sequence[Adapter]) -> torch.dtype:
    """The dtype that holds every adapter's shared-sink factors exactly (the widest)."""
    dtype = None
    for a in adapters:
        for k in a.factor_keys:
            t = a.weights[k].dtype
            dtype = t if dtype is None else torch.promote_types(dtype, t)
    return dtype or torch.float32


MODEL_CONFIG = "config.json"
_STATED = {"n": "n_shared_experts", "hidden": "hidden_size", "intermediate": "moe_intermediate_size"}
"""What a model config states, by transformers' ``InklingTextConfig`` field names."""


def stated_sizes(adapter: Adapter) -> dict[str, int]:
    """``{"n": ..., "hidden": ..., "intermediate": ...}`` as far as a model ``config.json``
    in the adapter's folder states them (some exports ship the base model's config;
    Inkling's text config may sit under ``text_config``); ``{}`` without one."""
    path = Path(adapter.source) / MODEL_CONFIG if adapter.source else None
    try:
        config = json.loads(path.read_text()) if path is not None and path.is_file() else {}
    except (OSError, ValueError):
        return {}  # not a model config the kit can read: it states nothing
    config = config.get("text_config", config) if isinstance(config, dict) else {}
    stated = {k: config.get(key) for k, key in _STATED.items()} if isinstance(config, dict) else {}
    return {k: v for k, v in stated.items() if isinstance(v, int) and not isinstance(v, bool)}


def _sizes(adapters: Sequence[Adapter], n: int, hidden: int | None, intermediate: int | None,
           own: dict[str, int]) -> tuple[int, int, list[str]]:
    """``(H, F, inferred)``: the sizes given, else those a model config beside the first
    adapter states, else the first adapter's own (``own``), each inference said with
    from what. Refuses (``ValueError``) a size that contradicts a model config beside
    an adapter: ``-n 3`` for an adapter whose config says 2 shared experts."""
    first = adapters[0]
    for adapter in adapters:
        stated = stated_sizes(adapter)
        for name, value in (("n", n), ("hidden", hidden), ("intermediate", intermediate)):
            if value is not None and name in stated and stated[name] != value:
                flag = {"n": "-n", "hidden": "--hidden", "intermediate": "--intermediate"}[name]
                raise ValueError(f"{adapter.name}/{MODEL_CONFIG}: the model this adapter was made for has "
                                 f"{_STATED[name]}={stated[name]}, but the conversion was asked for {flag} {value}; "
                                 f"pass {flag} {stated[name]} (or convert it for the model it belongs to)")
    stated, inferred = stated_sizes(first), []
    where = f"{first.name}/{MODEL_CONFIG}"
    H, F = hidden, intermediate
    if H is None:
        H = stated.get("hidden", own["hidden"])
        inferred.append(f"H = {H}, from {where} (hidden_size)" if "hidden" in stated else
                        f"H = {H}, from the gate-up A of adapter {first.name!r} ({H} columns); pass --hidden to state it")
    if F is None:
        F = stated.get("intermediate", own["intermediate"])
        if "intermediate" in stated:
            inferred.append(f"F = {F}, from {where} (moe_intermediate_size)")
        elif any((fn := FactorName.parse(k)) is not None and fn.expert is None and fn.canonical == "down_proj"
                 for k in first.factor_keys):
            inferred.append(f"F = {F}, from the flat down A of adapter {first.name!r}: its {n * F} columns split over the "
                            f"n = {n} experts you gave (a flat PEFT factor holds n*F only, so another n gives another "
                            "F); pass --intermediate to state the model's")
        else:
            inferred.append(f"F = {F}, from the per-expert down A of adapter {first.name!r} ({F} columns each)")
    if own["hidden"] != H and "hidden" in stated and hidden is None:
        raise ValueError(f"{where} states hidden_size={H}, but the factors of adapter {first.name!r} have H={own['hidden']}: "
                         "the adapter does not belong to that model")
    if own["intermediate"] != F and "intermediate" in stated and intermediate is None:
        raise ValueError(f"{where} states moe_intermediate_size={F}, but the factors of adapter {first.name!r} split over "
                         f"n = {n} give F={own['intermediate']}: the adapter does not belong to that model (or n is "
                         "not its model's)")
    return H, F, inferred


def _adapter_list(adapters: Iterable[Adapter]) -> list[Adapter]:
    """``adapters`` as a list (a one-shot iterable is read once), each an ``Adapter``, else
    ``TypeError`` naming what was given."""
    if isinstance(adapters, (Adapter, str, bytes, os.PathLike)) or not isinstance(adapters, Iterable):
        raise TypeError("convert: adapters must be a list of Adapters (load_adapter(folder)), one per slot, got "
                        + type(adapters).__name__)
    adapters = list(adapters)
    if not all(isinstance(a, Adapter) for a in adapters):
        raise TypeError("convert: adapters must be a list of Adapters (load_adapter(folder)), one per slot, got "
                        + repr([type(a).__name__ for a in adapters]))
    return adapters


class _Conversion:
    """The plan of one conversion (geometry, modules, slots, outer layout), made in a
    first pass over the modules that keeps no factors; ``buffers(module)`` then builds
    one module's four buffers at a time."""

    def __init__(self, adapters: Sequence[Adapter], n: int, hidden: int | None, intermediate: int | None,
                 max_rank: int | None, outer: int | None, tp_rank: int, tp_size: int,
                 dtype: torch.dtype | None, factors: Sequence[Mapping[str, LoRAFactors]] | None = None) -> None:
        if not adapters:
            raise ValueError("convert needs at least one adapter")
        check_size("convert: n_shared_experts", n, 1)  # before the factors are reshaped by it
        if factors is not None and len(factors) != len(adapters):
            raise ValueError(f"convert got {len(factors)} adapters' factors for {len(adapters)} adapters")
        self.adapters, self.n, self.tp_rank, self.tp_size = list(adapters), n, tp_rank, tp_size
        self.given = list(factors) if factors is not None else None
        self.names = [a.name for a in adapters]
        self.dtype = dtype or adapters_dtype(adapters)
        self.modules = list(dict.fromkeys(m for a in adapters for m in a.modules))
        first = self._normalized(0, adapters[0].modules[0])
        own = {"hidden": int(first.gate_up_a.shape[-1]), "intermediate": int(first.down_a.shape[-1]),
               "max_rank": first.rank}
        about = (f"; adapter {adapters[0].name!r} has H={own['hidden']}, F={own['intermediate']} (its first "
                 f"module, before tensor parallelism), r={own['max_rank']}")
        for name, value in (("hidden", hidden), ("intermediate", intermediate), ("max_rank", max_rank)):
            if value is not None:  # a typo (--hidden 10**12) is refused with the adapter's sizes, before any allocation
                check_size(f"convert: {name}", value, 0 if name == "max_rank" else 1, about)
        H, F_full, self.inferred = _sizes(adapters, n, hidden, intermediate, own)
        check_tp(F_full, tp_size)
        check_rank(tp_rank, tp_size)
        ranks, shared, self.first_ranks = [], True, {}
        for m in self.modules:
            fs = self._factors(m, collapse_to=None)
            for i, f in enumerate(fs):
                if f is not None:
                    ranks.append(f.rank)
                    self.first_ranks.setdefault(i, f.rank)
                    shared &= f.outer == 1
        self.outer = outer if outer is not None else (1 if shared else n)
        R = max_rank if max_rank is not None else max(ranks)
        self.geometry = Geometry(n=n, hidden=H, intermediate=F_full // tp_size, max_rank=R, slots=len(adapters),
                                 outer=self.outer, about=about)  # a pool past the kit's bound: ISL-K164
        self.findings: list[Finding] = []

    def _normalized(self, i: int, module: str) -> LoRAFactors:
        """Adapter ``i``'s normalized factors of ``module``: the caller's, else normalized
        now (one module at a time, so that only one module's are held)."""
        return self.given[i][module] if self.given is not None else self.adapters[i].module_factors(module, self.n)

    def _factors(self, module: str, collapse_to: int | None) -> list[LoRAFactors | None]:
        """Each adapter's sharded factors of ``module`` (``None`` where it has none), with
        identical per-expert outer factors collapsed as ``pool.collapse_pool_outer`` decides."""
        fs = [shard_factors(self._normalized(i, module), self.tp_rank, self.tp_size, self.n)
              if module in a.modules else None for i, a in enumerate(self.adapters)]
        present = [i for i, f in enumerate(fs) if f is not None]
        collapsed, notes = collapse_pool_outer([{module: fs[i]} for i in present], [self.names[i] for i in present],
                                               collapse_to)
        for i, c in zip(present, collapsed):
            fs[i] = c[module]
        if collapse_to is not None:
            self.findings += notes
        return fs

    def buffers(self, module: str) -> Buffers:
        factors = [f if f is None else _scaled(f, self.dtype) for f in self._factors(module, collapse_to=self.outer)]
        # First into a pool on the meta device: upstream's shape errors (an H or F that is
        # not the adapter's, ISL-E016) come out before a byte is allocated, so a mistyped
        # --hidden 1000000000000 is refused at once instead of asking for terabytes.
        for device in ("meta", None):
            pool = LoRAPool.from_geometry(self.geometry, dtype=self.dtype, device=device)
            for s, f in enumerate(factors):
                if f is None:
                    continue
                try:
                    pool.load(s, f, name=self.names[s])
                except (AssertionError, ValueError) as exc:
                    exc.add_note(f"while loading adapter {self.names[s]!r} into slot {s}, module {module}")
                    raise
        return pool.buffers()

    def pool(self, layers: dict[str, Buffers]) -> ConvertedPool:
        slots = [SlotInfo(s, a.name, self.first_ranks.get(s, 0), a.lora_alpha, a.scaling, a.sha256, a.source)
                 for s, a in enumerate(self.adapters)]
        findings = [f for a in self.adapters for f in a.findings] + self.findings
        return ConvertedPool(self.geometry, layers, slots, self.tp_rank, self.tp_size, findings, self.inferred)

    def progress(self, progress: bool | None, total: int) -> tqdm:
        size = sum(t.numel() * t.element_size() for a in self.adapters for t in a.weights.values())
        show = progress if progress is not None else size >= PROGRESS_BYTES
        return tqdm(total=total, disable=not show, desc="converting", unit="module")


def convert(adapters: Sequence[Adapter], n_shared_experts: int, *, hidden: int | None = None,
            intermediate: int | None = None, max_rank: int | None = None, outer: int | None = None,
            tp_rank: int = 0, tp_size: int = 1, dtype: torch.dtype | None = None,
            progress: bool | None = None, factors: Sequence[Mapping[str, LoRAFactors]] | None = None
            ) -> ConvertedPool:
    """Adapters in (slot ``i`` holds ``adapters[i]``), the pool buffers out.

    ``hidden``/``intermediate``: the model's ``H`` and full per-expert ``F`` (default:
    the first adapter's); each rank of ``tp_size`` holds ``F / tp_size``. ``max_rank``:
    the pool's ``R`` (default: the largest adapter rank). ``outer``: ``1`` or ``n``
    (default: ``1`` when every adapter's outer factors are shared, or the same for every
    expert: those collapse to shared outer, exactly, with a note). ``dtype``: the
    buffers' dtype, default the adapters' own (lossless); B is scaled in the adapters'
    dtype and then cast, as sglang does, so that the pool holds what sglang's would, bit
    for bit. ``progress``: a bar on stderr (default: for inputs over 64 MiB). ``factors``:
    each adapter's normalized factors by module (``adapter.factors(n)``) where the
    caller holds them already: then nothing is normalized again.

    Raises what upstream raises on the way: torch's reshape error for flat factors
    that do not split into ``n`` (``ISL-E012``), ``ISL-E015`` for a per-expert adapter
    in a shared-outer pool, ``ISL-E016`` for an adapter of larger rank or of another
    ``H`` or ``F``; and the kit's ``ISL-K101``/``K102`` for a bad tensor-parallel split.
    """
    plan = _Conversion(_adapter_list(adapters), n_shared_experts, hidden, intermediate, max_rank, outer, tp_rank,
                       tp_size, dtype, factors)
    layers: dict[str, Buffers] = {}
    with plan.progress(progress, len(plan.modules)) as bar:
        for m in plan.modules:
            layers[m] = plan.buffers(m)
            bar.update()
    return plan.pool(layers)


def convert_to_file(adapters: Sequence[Adapter], path: str | os.PathLike[str], n_shared_experts: int, *,
                    force: bool = False, hidden: int | None = None, intermediate: int | None = None,
                    max_rank: int | None = None, outer: int | None = None, tp_rank: int = 0, tp_size: int = 1,
                    dtype: torch.dtype | None = None, progress: bool | None = None) -> ConvertedPool:
    """``convert(...).save(path, force)`` without holding the pool: each module's buffers
    are built, written and dropped in turn, so that peak memory is the adapters'
    shared-sink factors plus one module's buffers. Returns the pool's description, its
    ``layers`` as meta tensors (shapes and dtype; the data is in the file: ``load_pool``).
    """
    adapters = _adapter_list(adapters)
    target = _check_output(path, [a.source for a in adapters], force)  # before any work
    plan = _Conversion(adapters, n_shared_experts, hidden, intermediate, max_rank, outer, tp_rank, tp_size, dtype)
    meta = {m: tuple(torch.empty(shape, dtype=plan.dtype, device="meta") for shape in
                     plan.geometry.buffer_shapes().values()) for m in plan.modules}
    described = plan.pool(meta)

    def built() -> Iterator[Buffers]:
        with plan.progress(progress, len(plan.modules)) as bar:
            for m in plan.modules:
                yield plan.buffers(m)
                bar.update()

    _write_pool(target, described, built(), force)
    described.findings += plan.findings  # the collapses, noted while the buffers were built
    return described
