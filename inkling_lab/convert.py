"""From PEFT adapters to the four pool buffers: the multi-slot dense converter.

``convert`` is the multi-slot dense converter: adapters in, one slot each; per
shared-sink module the four 4D buffers out (``gate_up_a [S, O, 2R, H]``,
``gate_up_b [S, n, 2F, R]``, ``down_a [S, n, R, F]``, ``down_b [S, O, H, R]``), ready
for ``set_lora_info``. Ranks are padded to the largest (or ``max_rank``), B factors
carry the scaling, the outer layout is shared only when every adapter's is, and
tensor-parallel rank ``k`` of ``tp`` gets its slice of ``F``. ``ConvertedPool.save``
writes one safetensors file with the geometry, the slots and the source adapters'
sha256 in its metadata, atomically, never over an input.

The doctor, which says what sglang would do with an adapter, is ``inkling_lab.doctor``.
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

from .adapters import CONFIG_FILE, WEIGHTS_FILE, Adapter
from .atomic import atomic_write
from .geometry import BUFFER_NAMES, Geometry
from .lora import SharedSinkLoRA
from .parallel import check_tp
from .pool import LoRAFactors, LoRAPool
from .upstream_defect import collapse_pool_outer
from .validate import Finding

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
