"""The cure: an adapter re-written as a PEFT folder that sglang 0.5.23 serves as trained (docs/reference.md#the-cure).

``export_for_sglang(adapter, output, n)`` reads any adapter the kit reads (flat,
fused, ``w``-named or per-expert named ``shared_experts`` factors; PEFT
``target_parameters`` exports; one-sided adapters; ``rank_pattern``,
``alpha_pattern``, rsLoRA) and writes ``output``, a PEFT folder
(``adapter_config.json`` + ``adapter_model.safetensors``) that sglang 0.5.23's own
loading path serves as exactly the adapter's math (docs/reference.md#the-cure):

* **scaling:** each projection's true PEFT scaling is folded into its lora_B, in
  float64, then cast once to the adapter's dtype; the config says ``r = lora_alpha``
  so that sglang's one ``lora_alpha / r`` (``lora.py``, ``LoRAAdapter.__init__``) is 1;
  no ``use_rslora``, ``alpha_pattern``, ``rank_pattern`` or ``target_parameters`` left
  for sglang to ignore;
* **outer layout:** per-expert outer factors become shared outer at rank ``n·r``: the
  shared gate/up A stacks the experts' A's ``[n·r, H]``, expert e's inner B holds its
  own B in columns ``e·r .. e·r+r-1`` and zeros elsewhere; the shared down B puts the
  experts' B's side by side ``[H, n·r]``, expert e's inner down A its own A in rows
  ``e·r ..``. Per-expert factors that are the same for every expert collapse to rank
  ``r`` instead (``upstream_defect.collapse_identical_outer``);
* **ranks:** one ``r`` for the file (the largest module's), every module zero-padded;
* **names:** the flat ``<module>.{gate_proj,up_proj,down_proj}.lora_{A,B}.weight`` and
  ``target_modules`` that ``get_normalized_target_modules`` maps to the sink's
  ``gate_up_proj`` and ``down_proj``. Every other module's LoRA pair (attention...)
  is kept under its name, its own scaling folded and zero-padded to the file's ``r``,
  where the kit's model of sglang's loading path takes it as written (upstream's
  normalization stacks a ``q_proj`` with its ``v_proj``; a weight no target module
  matches fails the buffer load): otherwise the plan refuses (``ISL-K508``), inventing
  no factors.

Then the proof, every time: the written folder is read back, module by module,
through the kit's model of sglang 0.5.23's loading path and forward
(``sglang_path.run_sglang``; each sink module with its layer's other modules, then the
other modules of the layers without one, since upstream normalizes a layer's weights
together; a run that raises or cannot tell fails the proof), for every tensor-parallel rank of ``tp`` (each rank's
slicing, ``shard.slice_lora_*``), and the sum over ranks of each rank's served LoRA
delta is compared, expert by expert, with PEFT's, computed by PEFT's own layers
(``module_reference``, ``peft_reference.peft_probes``), both applied to seeded random
probe inputs (``probes``): no dense ``[n*2F, H]`` delta is formed. Only a folder that
passes gets its name. A refusal (``ExportReport.written`` false, exit status 1) leaves
nothing behind.

Peak memory: the input is read one sink module at a time (``ExportInput``), three
times (plan, write, proof); one module's export is written at a time; the proof holds
one module's factors, as read back and as PEFT loads them, and its probes
(data/benchmarks/export_memory.json).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from tqdm.auto import tqdm

from safetensors import SafetensorError

from .adapters import (CONFIG_FILE, WEIGHTS_FILE, Adapter, FactorName, as_path, file_sha256, load_adapter, module_of,
                       open_safetensors)
from .adapters.files import sink_module_of, sink_modules
from .atomic import atomic_folder
from .catalog import message
from .catalog import Finding, finding
from .compare import reference
from .convert import PROGRESS_BYTES, adapters_dtype, stream_safetensors
from .errors import find_entry
from .geometry import check_size, check_tp
from .pool import LoRAFactors
from .peft_reference import Probes
from .records import FLOAT64_ROUNDING, relative_error
from .releases import Release, release
from .sglang_path import layer_id, run_sglang, server_target_modules
from .upstream_defect import collapse_identical_outer

SINK_TARGET_MODULES = ("gate_proj", "up_proj", "down_proj")
"""The export's sink targets: ``get_normalized_target_modules`` (utils.py) maps
``gate_proj``/``up_proj`` to ``gate_up_proj``, and ``init_lora_modules`` wraps the sink
when both ``gate_up_proj`` and ``down_proj`` are targets."""


TOLERANCES = {torch.float64: 1e-9, torch.float32: 1e-6}
"""The proof's relative error (largest difference over the largest value) per output
dtype; float16 and bfloat16 are held to two rounding steps instead (``_allowed``)."""

SERVER_FACTS = {
    "--max-lora-rank": "sglang/srt/lora/lora_manager.py: LoRAManager.init_lora_shapes (without the flag, the largest "
                       "r of the --lora-paths adapters; an adapter loaded later must fit it)",
    "--lora-target-modules": "sglang/srt/lora/lora_manager.py: LoRAManager.init_lora_shapes (a server that names its "
                             "target modules refuses an adapter whose normalized targets are not among them)",
    "--lora-backend": "sglang/srt/models/inkling_common/lora.py: InklingBatchDenseMLPWithLoRA.initialize_lora "
                      "(more than one adapter per batch needs the backend named triton); the default backend is "
                      "csgmv with --max-loras-per-batch 8 (sglang/srt/arg_groups/fields/lora.py: Lora)",
}
"""Where each server flag the report names comes from, in the 0.5.23 wheel."""

_LORA_PAIR = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")


PROBES = 8
"""How many random probe inputs the proof sends through each served and PEFT delta."""


def probes(n: int, hidden: int, intermediate: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The proof's seeded random inputs, float64: ``x [H, k]`` for gate/up, ``u [n, F, k]``
    (expert e's ``u[e]``) for down. A delta that differs anywhere moves ``Δ·x`` for almost
    every random ``x``, so comparing them on the probes catches what comparing dense
    deltas would, without forming ``[n*2F, H]``."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(hidden, PROBES, generator=gen, dtype=torch.float64),
            torch.randn(n, intermediate, PROBES, generator=gen, dtype=torch.float64))


def module_reference(adapter: Adapter, module: str, n: int, hidden: int, intermediate: int,
                     x: torch.Tensor, u: torch.Tensor) -> tuple[Probes, str]:
    """PEFT's delta of one sink module of ``adapter`` applied to the probes ``x``, ``u``
    (``Probes``: gate, up ``[n, F, k]``, down ``[n, H, k]``, float64), computed from the
    input alone, independently of the export, by PEFT itself where installed
    (``compare.reference``, ``peft_probes``), and who computed it.

    One module at a time: PEFT loads a folder holding only that module's tensors of the
    input file (config unchanged, so its patterns match as before), on stand-ins of no
    storage; ``adapter`` need hold only that module's factors (the kit's fallback reads them)."""
    import tempfile

    keys = [k for k in adapter.factor_keys if FactorName.parse(k).module == module]
    alone = dataclasses.replace(adapter, weights={k: adapter.weights[k] for k in keys}, findings=[], source="")
    source = Path(adapter.source) / WEIGHTS_FILE if adapter.source else None
    if source is None or not source.is_file():
        ref = reference(alone, alone, n, hidden, intermediate, probes=(x, u))
        return ref.deltas[module], ref.label
    from safetensors.torch import save_file

    with open_safetensors(source) as f:
        keys = [k for k in f.keys() if sink_module_of(k) == module]
    with tempfile.TemporaryDirectory(prefix="inkling-export-reference-") as tmp:
        folder = Path(tmp) / (Path(adapter.source).name or "adapter")
        folder.mkdir()
        save_file(_read(source, keys), str(folder / WEIGHTS_FILE))
        (folder / CONFIG_FILE).write_text(json.dumps(adapter.config), encoding="utf-8")
        ref = reference(folder, alone, n, hidden, intermediate, probes=(x, u))
        return ref.deltas[module], ref.label


class ExportInput:
    """The input adapter, one shared-sink module at a time (``module``): a folder is read
    again for each module (``load_adapter(folder, module=...)``: only that module's
    factors in memory, checked as the kit checks them); an ``Adapter`` held in memory is
    cut into its modules. ``head`` carries the config, the other modules' names and the
    findings (the first module's factors); ``modules`` every sink module, in file order."""

    def __init__(self, adapter: Adapter | str | os.PathLike[str]) -> None:
        if isinstance(adapter, Adapter):
            self.held: Adapter | None = adapter
            self.head, self.modules = adapter, adapter.modules
            return
        self.held = None
        try:
            self.modules = sink_modules(adapter)
        except (OSError, ValueError, RuntimeError, SafetensorError):
            self.modules = []  # unreadable: load_adapter's own refusal says why, next
        self.head = load_adapter(adapter, module=self.modules[0] if self.modules else None)

    @property
    def source(self) -> str:
        return self.head.source

    @property
    def sha256(self) -> str:
        """The input file's sha256 (read once, in chunks, for a folder)."""
        if self.held is not None or not self.head.source:
            return self.head.sha256
        return file_sha256(Path(self.head.source) / WEIGHTS_FILE)

    def module(self, module: str) -> Adapter:
        """The adapter holding ``module``'s factors alone (its findings included)."""
        if self.held is not None:
            a = self.held
            return dataclasses.replace(a, weights={k: a.weights[k] for k in a.factor_keys
                                                   if FactorName.parse(k).module == module}, findings=list(a.findings))
        if module == self.modules[0]:
            return self.head
        return load_adapter(self.head.source, module=module)


# -- the report ---------------------------------------------------------------------------

@dataclass
class ProofRow:
    """One comparison of the proof: what sglang serves from the export against PEFT's
    delta, for one ``module`` and ``part`` (``gate``/``up``/``down`` of ``expert``, or an
    other module's LoRA delta)."""

    module: str
    part: str
    expert: int | None
    max_rel: float
    close: bool
    steps: float | None = None
    """bf16/fp16: the largest difference in rounding steps of the dtype (at most 2)."""

    def __str__(self) -> str:
        where = f"{self.module} {self.part}" + ("" if self.expert is None else f" expert {self.expert}")
        steps = "" if self.steps is None else f", {self.steps:.3g} rounding step(s)"
        return f"{where}: served {'==' if self.close else '!='} peft (greatest relative difference " \
               f"{self.max_rel:.3g}{steps})"


@dataclass
class ExportReport:
    """What ``export_for_sglang`` did: ``written`` (the folder ``output`` exists and is
    proven), the export's ``rank`` and why (``rank_reason``), the server's flags, the TP
    sizes it can be served at, the proof (``proof``, ``max_rel_error``, ``allowed``) and
    every finding; on a refusal ``error`` and ``code`` (and nothing was written)."""

    adapter: str
    output: str
    n: int
    hidden: int | None = None
    intermediate: int | None = None
    tp: int = 1
    written: bool = False
    rank: int = 0
    rank_reason: str = ""
    dtype: str = ""
    modules: list[str] = field(default_factory=list)
    other_modules: list[str] = field(default_factory=list)
    target_modules: list[str] = field(default_factory=list)
    server_flags: list[str] = field(default_factory=list)
    tp_sizes: list[int] = field(default_factory=list)
    hidden_act: str = ""
    hidden_act_from: str = ""
    """The model's activation and where the export learnt it (``model_activation``)."""
    proof: list[ProofRow] = field(default_factory=list)
    allowed: str = ""
    reference: str = ""
    findings: list[Finding] = field(default_factory=list)
    error: str = ""
    code: str | None = None
    exception: BaseException | None = field(default=None, repr=False)
    release: Release = field(default_factory=release)
    """The sglang release the export is proven against (``--sglang``; default 0.5.23)."""

    @property
    def exit_status(self) -> int:
        return 0 if self.written else 1

    @property
    def max_rel_error(self) -> float | None:
        """The proof's figure: the largest relative difference of any served delta to PEFT's."""
        return max((r.max_rel for r in self.proof), default=None)

    def raise_if_refused(self) -> None:
        """Raise the refusal (for scripts and the catalog's snippets); nothing when written."""
        if self.exception is not None:
            raise self.exception

    def __str__(self) -> str:
        if not self.written:
            lines = [f"{self.release.label}, export {self.adapter} -> {self.output}: refused, nothing written",
                     f"  {self.error}".replace("\n", "\n  ")]
            if self.code:
                lines.append(f"  more: inkling-lab explain {self.code}")
        else:
            lines = [f"{self.release.label}, export {self.adapter} -> {self.output}: written, r={self.rank} "
                     f"({self.rank_reason}), "
                     f"{self.dtype}, {len(self.modules)} shared-sink module(s)"
                     + (f" and {len(self.other_modules)} other module(s)" if self.other_modules else ""),
                     f"  target_modules: {self.target_modules}",
                     f"  the model's activation: {self.hidden_act} ({self.hidden_act_from}), the SiLU sglang's "
                     f"sink computes"]
        if self.proof:
            ranks = f", every rank of --tp {self.tp} summed" if self.tp > 1 else ""
            lines.append(f"proof: the export read back through {self.release.label}'s loading path (the kit's model"
                         f"{ranks}) against PEFT's delta computed by {self.reference}, each expert, on {PROBES} "
                         f"random inputs, float64 ({self.allowed}):")
            bad = [r for r in self.proof if not r.close]
            worst = max(self.proof, key=lambda r: r.max_rel)
            if bad:
                lines += [f"  {r}" for r in bad]
            elif worst.max_rel <= FLOAT64_ROUNDING:
                # Which comparison is largest at rounding level is the CPU's choice: none is named.
                lines.append(f"  every module and expert matches to float64 rounding ({len(self.proof)} comparisons, "
                             f"each within {FLOAT64_ROUNDING:.2g})")
            else:
                lines += [f"  {worst}", f"  every module and expert matches ({len(self.proof)} comparisons)"]
        if self.written:
            lines.append(f"serve it with {self.release.label}: " + " ".join(self.server_flags))
            lines += [f"  {flag}: {SERVER_FACTS[flag]}" for flag in SERVER_FACTS]
            lines.append(f"tensor parallelism: one file for every --tp-size; proven at --tp-size {self.tp}"
                         + (" (every rank read back, the ranks' deltas summed)" if self.tp > 1 else "")
                         + f"; the sink's F={self.intermediate} splits at --tp-size "
                         f"{', '.join(map(str, self.tp_sizes))}")
        lines += [str(f) for f in self.findings]
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def to_dict(self) -> dict[str, Any]:
        """The report for machines (``--json``)."""
        return {"sglang": self.release.version, "adapter": self.adapter, "output": self.output,
                "written": self.written, "rank": self.rank,
                "rank_reason": self.rank_reason, "dtype": self.dtype, "server_flags": self.server_flags,
                "server_facts": SERVER_FACTS, "target_modules": self.target_modules, "tp": self.tp,
                "tp_sizes": self.tp_sizes, "hidden_act": self.hidden_act, "hidden_act_from": self.hidden_act_from,
                "sink": {"n_shared_experts": self.n, "hidden": self.hidden,
                                                    "intermediate": self.intermediate},
                "modules": self.modules, "other_modules": self.other_modules,
                "max_rel_error": self.max_rel_error, "allowed": self.allowed, "reference": self.reference,
                "proof": [dataclasses.asdict(r) for r in self.proof], "error": self.error, "code": self.code,
                "findings": [dataclasses.asdict(f) for f in self.findings]}


# -- the layout ------------------------------------------------------------------------------

def shared_outer(f: LoRAFactors) -> tuple[LoRAFactors, str]:
    """``f`` (``[O, 2r, H]``, ``[n, 2F, r]``, ``[n, r, F]``, ``[O, H, r]``) in the shared-outer
    layout, exactly, and how: ``"shared"`` (it was), ``"collapsed"`` (every expert's outer
    factors are the same: rank ``r``) or ``"stacked"`` (rank ``n·r``, docs/reference.md#the-cure's blocks)."""
    ga, gb, da, db = f.gate_up_a, f.gate_up_b, f.down_a, f.down_b
    if f.outer == 1:
        return f, "shared"
    one_ga, one_db, collapsed = collapse_identical_outer(ga, db)
    if collapsed:
        return dataclasses.replace(f, gate_up_a=one_ga, down_b=one_db), "collapsed"
    n, r, H, F = f.n, f.rank, ga.shape[-1], gb.shape[-2] // 2
    gate_a = ga[:, :r].reshape(n * r, H)  # expert e's A in rows e*r .. e*r+r-1
    up_a = ga[:, r:].reshape(n * r, H)
    inner_b = gb.new_zeros(n, 2 * F, n * r)
    inner_a = da.new_zeros(n, n * r, F)
    for e in range(n):
        inner_b[e, :, e * r:(e + 1) * r] = gb[e]  # its own columns; zeros meet the other experts' A's
        inner_a[e, e * r:(e + 1) * r] = da[e]
    down_b = db.permute(1, 0, 2).reshape(1, db.shape[1], n * r)  # [B_0 ... B_{n-1}]
    stacked = LoRAFactors(torch.cat([gate_a, up_a])[None], inner_b, inner_a, down_b,
                          lora_alpha=f.scaling * n * r, name=f.name)
    return stacked, "stacked"


def _pad(t: torch.Tensor, axis: int, to: int) -> torch.Tensor:
    """Zero rows of A (``axis`` 0) or columns of B (``axis`` 1) up to rank ``to``: exact."""
    if t.shape[axis] == to:
        return t
    shape = list(t.shape)
    shape[axis] = to - t.shape[axis]
    return torch.cat([t, t.new_zeros(shape)], dim=axis)


def _folded(module: str, f: LoRAFactors) -> LoRAFactors:
    """The scaling folded into both B's, in float64: the result carries scaling 1."""
    s = f.scaling
    return LoRAFactors(f.gate_up_a, f.gate_up_b * s, f.down_a, f.down_b * s, lora_alpha=float(f.rank), name=module)


def flat_factors(f: LoRAFactors, rank: int) -> dict[str, torch.Tensor]:
    """Shared-outer factors (scaling 1) as PEFT's flat 2D matrices at ``rank`` (docs/reference.md#adapters-on-disk):
    ``gate_proj``/``up_proj`` A ``[R, H]`` and B ``[n*F, R]``, ``down_proj`` A ``[R, n*F]``
    and B ``[H, R]``; what upstream's normalization turns back into ``f``, zero-padded."""
    ga, gb, da, db = f.gate_up_a[0], f.gate_up_b, f.down_a, f.down_b[0]
    n, r, F = f.n, f.rank, gb.shape[-2] // 2
    return {"gate_proj.lora_A": _pad(ga[:r], 0, rank), "up_proj.lora_A": _pad(ga[r:], 0, rank),
            "gate_proj.lora_B": _pad(gb[:, :F].reshape(n * F, r), 1, rank),
            "up_proj.lora_B": _pad(gb[:, F:].reshape(n * F, r), 1, rank),
            "down_proj.lora_A": _pad(da.permute(1, 0, 2).reshape(r, n * F), 0, rank),
            "down_proj.lora_B": _pad(db, 1, rank)}


@dataclass
class _Module:
    """One shared-sink module of the plan: its exact float64 factors, shared outer and
    scaling folded (built again when written), their rank and how the layout came."""

    name: str
    rank: int
    how: str


@dataclass
class _Other:
    """One other module's LoRA pair, read from the input file when written."""

    module: str
    key_a: str
    key_b: str
    rank: int
    shape_a: list[int]
    shape_b: list[int]
    dtype_a: torch.dtype
    dtype_b: torch.dtype
    scaling: float


class _Export:
    """The plan of one export (a first pass that keeps no factors), then its tensors,
    one module at a time."""

    def __init__(self, source: ExportInput, n: int, hidden: int | None, intermediate: int | None, tp: int,
                 sglang: Release | None = None) -> None:
        self.input, self.adapter, self.n, self.tp, self.release = source, source.head, n, tp, release(sglang)
        self.where = f"{Path(self.adapter.source).name or self.adapter.name}/{WEIGHTS_FILE}"
        self.findings: list[Finding] = []
        _refuse_saved_modules(self.adapter, source.modules)
        self.dtype = adapters_dtype([self.adapter])
        self.sink: list[_Module] = []
        for m in source.modules:  # the plan: every module read and checked once, none kept
            f, how = self.module_factors(m)
            for k, t in flat_factors(f, f.rank).items():  # a fold the dtype cannot hold: refused before writing
                _cast(t, self.dtype, f"{m}.{k}.weight", self.where)
            self.sink.append(_Module(m, f.rank, how))
            self.hidden, self.intermediate = int(f.gate_up_a.shape[-1]), int(f.down_a.shape[-1])
        for given, have, what in ((hidden, self.hidden, "hidden"), (intermediate, self.intermediate, "intermediate")):
            if given is not None and given != have:
                raise ValueError(message("ISL-K506", file=self.where, what=what, given=given, have=have))
        check_tp(self.intermediate, tp, "the shared sink's intermediate size")
        self.others = self._other_pairs()
        self.rank = max([m.rank for m in self.sink] + [o.rank for o in self.others])
        self._refuse_unloadable_others()
        self.findings += self._layout_notes()

    def module_factors(self, module: str) -> tuple[LoRAFactors, str]:
        """One module's factors in float64 (PEFT's per-projection scalings on the inner
        factors, exact), the scaling folded into B, in the shared-outer layout."""
        a = self.input.module(module)
        exact = dataclasses.replace(a, weights={k: t.double() for k, t in a.weights.items()}, findings=[])
        f = exact.module_factors(module, self.n)
        for note in [*a.findings, *exact.findings]:
            if note not in self.findings and note not in self.adapter.findings:
                self.findings.append(note)
        f, how = shared_outer(f)
        return _folded(module, f), how

    def _other_pairs(self) -> list[_Other]:
        keys = self.adapter.other_keys
        if not keys:
            return []
        peft = self.adapter.peft
        with open_safetensors(Path(self.adapter.source) / WEIGHTS_FILE) as f:
            pairs: dict[str, dict[str, str]] = {}
            for key in keys:
                m = _LORA_PAIR.match(key)
                if m is None:
                    raise ValueError(message(
                        "ISL-K502", file=self.where, key=repr(key),
                        why="only lora_A.weight / lora_B.weight pairs have a scaling to fold and a rank to pad "
                            "(an embedding's lora_embedding_A/B, a saved module or a bias is none of these)"))
                pairs.setdefault(m["module"], {})[m["ab"]] = key
            out = []
            for module, pair in pairs.items():
                if set(pair) != {"A", "B"}:
                    have = next(iter(pair.values()))
                    raise ValueError(message("ISL-K502", file=self.where, key=repr(have),
                                             why="it has no partner (every LoRA factor needs its A and its B)"))
                sa, sb = (list(f.get_slice(pair[ab]).get_shape()) for ab in "AB")
                dtypes = [_ST_TORCH[f.get_slice(pair[ab]).get_dtype()] for ab in "AB"]
                if len(sa) != 2 or len(sb) != 2 or sa[0] != sb[1]:
                    raise ValueError(message("ISL-K502", file=self.where, key=repr(pair["A"]),
                                             why=f"lora_A {sa} and lora_B {sb} are no [r, in] and [out, r] pair"))
                out.append(_Other(module, pair["A"], pair["B"], sa[0], sa, sb, *dtypes,
                                  peft.scaling_of(module_of(pair["A"]))))
        return out

    def _refuse_unloadable_others(self) -> None:
        """The other modules as the export would write them (tensors of no storage, at the
        file's ``r``, under the export's config) down the kit's model of sglang's loading path
        (``run_sglang``, which mirrors upstream's ``_normalize_weights``, Inkling's ``get_hidden_dim``
        and the buffer load's name checks): where it raises (a ``q_proj`` without its ``v_proj``:
        ``normalize_qkv_proj``'s ``KeyError``; a target module Inkling has no LoRA for, ``q_proj``,
        ``o_proj``, ``wq_du``: ``ISL-E038``; a weight no target module matches: ``ISL-E036``) or cannot tell, the
        export refuses (``ISL-K508``) before writing. It invents no factors: a zero ``v_proj``
        would be exact in the delta, but its output size is the model's, which the adapter does
        not carry, and the kit does not model the attention buffers' shape checks."""
        if not self.others:
            return
        weights = {}
        for o in self.others:
            weights[o.key_a] = torch.empty(self.rank, o.shape_a[1], dtype=o.dtype_a, device="meta")
            weights[o.key_b] = torch.empty(o.shape_b[0], self.rank, dtype=o.dtype_b, device="meta")
        path = run_sglang(Path(self.where).parent, self.n, self.hidden, self.intermediate, max_rank=self.rank,
                          state=_Readback(self.config(), weights), sglang=self.release)
        why = _not_served(path)
        if not why:
            return
        failing = layer_id(why)  # the first layer id the reason names is the weight sglang fails on
        names = sorted(o.module.removeprefix("base_model.model.") for o in self.others
                       if failing is None or layer_id(o.module + ".") == failing)
        modules = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        # partners would not help: a server targeting q_proj/v_proj does not start (ISL-E038)
        raise ValueError(message(
            "ISL-K508", file=self.where, modules=modules, release=self.release.version, why=why,
            fix="train only modules sglang's Inkling model has LoRA for (besides the sink: qkvr and wo_ud, not "
                "q_proj, k_proj, v_proj, o_proj or wq_du: ISL-E038), under names its target modules match"))

    def _layout_notes(self) -> list[Finding]:
        notes = []
        for m in self.sink:
            if m.how == "stacked":
                r = m.rank // self.n
                notes.append(finding("ISL-N501", m.name, module=m.name, n=self.n, r=r, rank=m.rank))
        return notes

    @property
    def rank_reason(self) -> str:
        hows = {m.how for m in self.sink}
        parts = []
        if "stacked" in hows:
            parts.append(f"per-expert outer factors stacked to n·r = {self.n}·{self.rank // self.n}")
        if "collapsed" in hows:
            parts.append("identical per-expert outer factors collapsed")
        ranks = sorted({m.rank for m in self.sink} | {o.rank for o in self.others})
        if len(ranks) > 1:
            parts.append(f"the largest module rank of {ranks}, the others zero-padded")
        return "; ".join(parts) or "the adapter's own rank"

    def target_modules(self) -> list[str]:
        """The sink's three targets and every other module's last name part."""
        others = sorted({o.module.rsplit(".", 1)[-1] for o in self.others} - set(SINK_TARGET_MODULES))
        return [*SINK_TARGET_MODULES, *others]

    def config(self) -> dict[str, Any]:
        """What sglang reads plainly: r, lora_alpha = r (scaling 1), the targets; PEFT's
        bookkeeping fields kept (they change no math)."""
        kept = {k: self.adapter.config[k] for k in ("base_model_name_or_path", "task_type", "revision")
                if self.adapter.config.get(k) is not None}
        return {**kept, "peft_type": "LORA", "r": self.rank, "lora_alpha": self.rank,
                "target_modules": self.target_modules(), "bias": "none", "use_rslora": False, "use_dora": False}

    def specs(self) -> list[tuple[str, torch.dtype, list[int]]]:
        """Every tensor of the file, in order: its key, dtype and shape (the header)."""
        n, H, F, R = self.n, self.hidden, self.intermediate, self.rank
        sink = {"gate_proj.lora_A": [R, H], "up_proj.lora_A": [R, H], "gate_proj.lora_B": [n * F, R],
                "up_proj.lora_B": [n * F, R], "down_proj.lora_A": [R, n * F], "down_proj.lora_B": [H, R]}
        out = [(f"{m.name}.{k}.weight", self.dtype, s) for m in self.sink for k, s in sink.items()]
        out += [spec for o in self.others
                for spec in ((o.key_a, o.dtype_a, [R, o.shape_a[1]]), (o.key_b, o.dtype_b, [o.shape_b[0], R]))]
        return out

    def tensors(self, progress: bool | None) -> Iterator[dict[str, torch.Tensor]]:
        """The file's tensors, one module at a time, in ``specs`` order."""
        size = sum(math.prod(s) * d.itemsize for _, d, s in self.specs())
        show = progress if progress is not None else size >= PROGRESS_BYTES
        with tqdm(total=len(self.sink) + len(self.others), disable=not show, desc="exporting", unit="module") as bar:
            for m in self.sink:
                f, _ = self.module_factors(m.name)
                yield {f"{m.name}.{k}.weight": _cast(t, self.dtype, f"{m.name}.{k}.weight", self.where)
                       for k, t in flat_factors(f, self.rank).items()}
                bar.update()
            if not self.others:
                return
            for o in self.others:
                pair = _read(Path(self.adapter.source) / WEIGHTS_FILE, (o.key_a, o.key_b))
                a, b = pair[o.key_a], pair[o.key_b]
                for key, t in ((o.key_a, a), (o.key_b, b)):
                    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                        bad = int((~torch.isfinite(t)).sum())
                        raise ValueError(message("ISL-K302", file=self.where, key=repr(key), k=bad,
                                                 numel=t.numel()))
                yield {o.key_a: _pad(a, 0, self.rank),
                       o.key_b: _cast(_pad(b.double() * o.scaling, 1, self.rank), o.dtype_b, o.key_b, self.where)}
                bar.update()


def _read(path: Path, keys: Sequence[str]) -> dict[str, torch.Tensor]:
    """``keys`` of a safetensors file, the file opened for them alone: its mapping (whose
    touched pages count as resident) is closed before the next read, so reading a large
    file piece by piece never holds more than the piece."""
    with open_safetensors(path) as f:
        return {k: f.get_tensor(k) for k in keys}


_ST_TORCH = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def _cast(t: torch.Tensor, dtype: torch.dtype, key: str, where: str) -> torch.Tensor:
    """The one cast of a folded float64 factor; a value the dtype cannot hold is refused."""
    out = t.to(dtype)
    if t.is_floating_point() and not bool(torch.isfinite(out).all()):
        count = int((~torch.isfinite(out)).sum())
        raise ValueError(message("ISL-K501", file=where, key=repr(key), dtype=str(dtype).removeprefix("torch."),
                                 count=count, limit=f"{torch.finfo(dtype).max:.6g}"))
    return out.contiguous()


def _covers(saved: str, module: str) -> bool:
    """PEFT's modules_to_save rule: a module whose name, or a parent's, ends with the entry."""
    parts = module.removeprefix("base_model.model.").split(".")
    prefixes = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(p == saved or p.endswith("." + saved) for p in prefixes)


def _refuse_saved_modules(adapter: Adapter, modules: Sequence[str] | None = None) -> None:
    """``modules_to_save``: full trained copies, which no LoRA folder serves (sglang 0.5.23
    does not read the field); the sink's own copy named first (of ``modules``, default
    the adapter's)."""
    saved = list(adapter.peft.modules_to_save)
    if not saved:
        return
    covering = next(((m, [s for s in saved if _covers(s, m)]) for m in (modules or adapter.modules)
                     if any(_covers(s, m) for s in saved)), None)
    what = (f"the shared sink {covering[0].removeprefix('base_model.model.')}" if covering else
            "modules outside the sink")
    raise ValueError(message("ISL-K504", file=f"{Path(adapter.source).name}/{CONFIG_FILE}", modules=saved, what=what))


# -- the proof ---------------------------------------------------------------------------------

def _allowed(dtype: torch.dtype) -> str:
    if dtype in TOLERANCES:
        return f"{str(dtype).removeprefix('torch.')} export: relative error up to {TOLERANCES[dtype]:g}"
    return f"{str(dtype).removeprefix('torch.')} export: within two rounding steps of the dtype"


@dataclass(frozen=True)
class _Readback:
    """One module's tensors and the written config, as ``run_sglang`` reads an adapter held in memory."""

    config: dict[str, Any]
    weights: dict[str, torch.Tensor]


def _not_served(path: Any) -> str:
    """Why a run of the kit's model of sglang does not serve what it read as trained (``""``: it does):
    it raises, cannot tell (``unknown``: the proof fails closed), leaves the sink unwrapped,
    skips weights or serves something else (``causes``)."""
    if path.raised is not None:  # the type after the text: the catalog reads the line as the export's refusal
        kind, _, text = path.raised.text.partition(": ")
        return f"{text or kind} ({kind if text else 'raised'} in {path.raised.upstream})"
    if path.unknown or not path.wrapped or path.skip_warning or path.causes:
        return "; ".join([path.unknown] * bool(path.unknown) + list(path.causes)
                         + [path.skip_warning] * bool(path.skip_warning) or ["the sink is not wrapped"])
    return ""


def _served(folder: Path, n: int, hidden: int, intermediate: int, max_rank: int, readback: _Readback,
            sglang: Release, tp: int = 1, tp_rank: int = 0) -> Any:
    """The kit's model of release ``sglang``'s loading path, on one module read back from
    ``folder``, for tensor-parallel rank ``tp_rank`` of ``tp`` (every call into the kit's
    model of sglang goes through here)."""
    return run_sglang(folder, n, hidden, intermediate, tp, max_rank=max_rank, name=folder.name, state=readback,
                      sglang=sglang, tp_rank=tp_rank)


def sink_sizes(adapter: Adapter, n: int) -> tuple[int, int]:
    """The adapter's ``H`` and per-expert ``F``, from its first module's factors."""
    module = adapter.modules[0]
    keys = [k for k in adapter.factor_keys if FactorName.parse(k).module == module]
    f = dataclasses.replace(adapter, weights={k: adapter.weights[k] for k in keys}, findings=[]).module_factors(module, n)
    return int(f.gate_up_a.shape[-1]), int(f.down_a.shape[-1])


def served_probes(f: LoRAFactors, x: torch.Tensor, u: torch.Tensor, absolute: bool = False) -> Probes:
    """What one rank's slot computes from the probes, float64 (``[O, 2R, H]``, ``[n, 2F', R]``,
    ``[n, R, F']``, ``[O, H, R]``; ``u`` the rank's ``[n, F', k]``): gate, up ``B (A x)``
    ``[n, F', k]``, down ``B (A u)`` ``[n, H, k]``; with ``absolute``, the same of ``|B|``,
    ``|A|``, ``|x|`` (what one rounding of the factors can move, the 16-bit bound)."""
    ga, gb, da, db = (t.double().abs() if absolute else t.double() for t in f.tensors().values())
    x, u = (x.abs(), u.abs()) if absolute else (x, u)
    n, R, F = gb.shape[0], ga.shape[-2] // 2, gb.shape[-2] // 2
    ga, db = ga.expand(n, -1, -1), db.expand(n, -1, -1)
    return gb[:, :F] @ (ga[:, :R] @ x), gb[:, F:] @ (ga[:, R:] @ x), db @ (da @ u)


@dataclass
class Proof:
    """``verify_export``'s result: the rows, and the first reason it fails (``""``: it holds)."""

    rows: list[ProofRow]
    allowed: str
    failure: str = ""
    release: Release = field(default_factory=release)
    reference: str = ""
    """Who computed PEFT's delta (``ReferenceDeltas.label``): PEFT itself, or the kit and why."""
    tp: int = 1
    """The tensor-parallel size proven: every rank read back, their served deltas summed."""

    @property
    def ok(self) -> bool:
        return not self.failure and all(r.close for r in self.rows)

    def check(self) -> None:
        """Raise the proof's refusal (``ISL-K503``) when it fails."""
        if self.ok:
            return
        bad = next((r for r in self.rows if not r.close), None)
        what = self.failure or f"{bad.module} {bad.part}" + ("" if bad.expert is None else f" expert {bad.expert}") \
            + (f" at --tp {self.tp}" if self.tp > 1 else "") + f" (relative error {bad.max_rel:.3g}; {self.allowed})"
        raise ValueError(message("ISL-K503", sglang=self.release.version, what=what))


def _compare(module: str, part: str, expert: int | None, served: torch.Tensor, peft: torch.Tensor,
             bound: torch.Tensor | None, dtype: torch.dtype) -> ProofRow:
    """Served against PEFT's delta (on the probes): relative error for float64/float32; for
    a 16-bit dtype, every element within two rounding steps of ``bound`` (``|B'| |A'| |x|``:
    what one rounding of B can move)."""
    rel = relative_error(served, peft)
    if dtype in TOLERANCES:
        return ProofRow(module, part, expert, rel, rel <= TOLERANCES[dtype])
    step = torch.finfo(dtype).eps * bound
    diff = (served - peft).abs()
    steps = float((diff / step.clamp_min(torch.finfo(torch.float64).tiny)).max()) if diff.numel() else 0.0
    steps = 0.0 if not bool((diff > 0).any()) else steps
    return ProofRow(module, part, expert, rel, steps <= 2.0, steps)


def verify_export(folder: str | os.PathLike[str], adapter: Adapter | str | os.PathLike[str] | ExportInput, n: int,
                  *, hidden: int | None = None, intermediate: int | None = None, sglang: str | Release | None = None,
                  tp: int = 1) -> Proof:
    """Read ``folder`` (an export of ``adapter``) back through the kit's model of sglang
    release ``sglang``'s (default 0.5.23) loading path and forward, one module at a time,
    for every tensor-parallel rank of ``tp`` (each rank's slicing, ``shard.slice_lora_*``),
    and compare the sum over ranks of each rank's served LoRA delta with PEFT's delta of
    ``adapter`` (``module_reference``), expert by expert, on seeded random probe inputs
    (``probes``): nothing of a module's dense ``[n*2F, H]`` size is formed. Every other
    module's delta is compared with PEFT's ``scaling * B @ A`` the same way. ``adapter``:
    the input (a folder, read one module at a time, or an ``Adapter``). Each module is read
    back with its layer's other tensors (upstream normalizes a layer's weights together), the
    layers without a sink module on their own; a run that raises, skips weights or cannot
    tell (``unknown``) fails the proof (``_not_served``). Never raises on
    a bad folder: ``Proof.failure`` says where sglang would stop or serve something else."""
    folder = Path(folder)
    source = adapter if isinstance(adapter, ExportInput) else ExportInput(adapter)
    H, F = (hidden, intermediate) if hidden and intermediate else sink_sizes(source.module(source.modules[0]), n)
    config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    rank = int(config["r"])
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    rows: list[ProofRow] = []
    dtype = adapters_dtype([source.head])
    proof = Proof(rows, _allowed(dtype), release=release(sglang), tp=tp)
    label = proof.release.label
    if files != [WEIGHTS_FILE]:  # sglang reads every *.safetensors of the folder (safetensors_weights_iterator)
        proof.failure = f"the folder holds {files}; sglang would read every one"
        return proof
    x, u = probes(n, H, F)
    width = check_tp(F, tp, "the shared sink's intermediate size")
    with open_safetensors(folder / WEIGHTS_FILE) as f:
        keys = list(f.keys())
    by_module: dict[str, list[str]] = {}
    others: dict[int | None, list[str]] = {}  # every other tensor, by layer (None: no layer id)
    for k in keys:
        fn = FactorName.parse(k)
        if fn is not None:
            by_module.setdefault(fn.module, []).append(k)
        else:
            others.setdefault(layer_id(k), []).append(k)
    missing = [m for m in source.modules if m not in by_module]
    if missing:
        proof.failure = f"{missing[0]} is not in the export"
        return proof
    for module in source.modules:
        try:
            want, proof.reference = module_reference(source.module(module), module, n, H, F, x, u)
        except (ValueError, RuntimeError, OSError) as exc:
            proof.failure = f"PEFT's delta of {module} cannot be computed: {type(exc).__name__}: {exc}"
            return proof
        # with its layer's other modules: upstream normalizes a layer's weights together (a q_proj needs its v_proj)
        readback = _Readback(config, _read(folder / WEIGHTS_FILE, by_module[module] + others.pop(
            layer_id(module + "."), [])))
        got = [torch.zeros_like(w) for w in want]  # the sum over ranks of what each serves
        bounds = [torch.zeros_like(w) for w in want]
        for tp_rank in range(tp):
            path = _served(folder, n, H, F, rank, readback, proof.release, tp, tp_rank)
            at = f" (tensor-parallel rank {tp_rank} of {tp})" if tp > 1 else ""
            why = _not_served(path)
            if why:
                proof.failure = f"{label} does not serve {module}{at} as trained: {why}"
                return proof
            cols = slice(tp_rank * width, (tp_rank + 1) * width)  # the rank's features of every expert
            served = path.served[module]  # what sglang computes: the slot's factors as this rank loaded them
            for total, part in ((got, served_probes(served, x, u[:, cols])),
                                (bounds, served_probes(served, x, u[:, cols], absolute=True))):
                total[0][:, cols] += part[0]  # gate and up: the rank's own features
                total[1][:, cols] += part[1]
                total[2] += part[2]  # down: the all-reduce's sum of partial outputs
        for part, s_, w_, b_ in zip(("gate", "up", "down"), got, want, bounds):
            for e in range(n):
                rows.append(_compare(module, part, e, s_[e], w_[e], b_[e], dtype))
    for layer, names in others.items():  # the layers without a sink module: their tensors down the same path
        why = _not_served(_served(folder, n, H, F, rank, _Readback(config, _read(folder / WEIGHTS_FILE, names)),
                                  proof.release))
        if why:
            proof.failure = f"{label} does not serve {names[0]} as trained: {why}"
            return proof
    _prove_others(folder / WEIGHTS_FILE, keys, config, source.head, rows)
    return proof


def _prove_others(written: Path, keys: Sequence[str], config: dict[str, Any], adapter: Adapter,
                  rows: list[ProofRow]) -> None:
    """Every other module: sglang's one ``lora_alpha / r`` of the export times ``B' @ A'``
    against the input's PEFT ``scaling * B @ A``, on seeded random inputs (a delta of
    any size, never formed densely)."""
    if not adapter.other_keys:
        return
    served_scaling = config["lora_alpha"] / config["r"]  # lora.py: LoRAAdapter.__init__
    peft = adapter.peft
    gen = torch.Generator().manual_seed(0)
    source = Path(adapter.source) / WEIGHTS_FILE
    for key in adapter.other_keys:
        m = _LORA_PAIR.match(key)
        if m is None or m["ab"] != "A":
            continue
        key_b = f"{m['module']}.lora_B.weight"
        if key not in keys or key_b not in keys:
            rows.append(ProofRow(m["module"], "missing from the export", None, math.inf, False))
            continue
        given, out = _read(source, (key, key_b)), _read(written, (key, key_b))  # one pair at a time
        a_in, b_in = given[key].double(), given[key_b].double()
        a_out, b_out = out[key].double(), out[key_b].double()
        if a_out.shape[0] != config["r"] or b_out.shape[1] != config["r"]:
            rows.append(ProofRow(m["module"], f"rank {a_out.shape[0]} is not the file's r", None, math.inf, False))
            continue
        x = torch.randn(a_in.shape[1], PROBES, generator=gen, dtype=torch.float64)
        want = peft.scaling_of(module_of(key)) * (b_in @ (a_in @ x))
        got = served_scaling * (b_out @ (a_out @ x))
        bound = b_out.abs() @ (a_out.abs() @ x.abs())
        rows.append(_compare(m["module"], "LoRA delta", None, got, want, bound, given[key_b].dtype))


# -- the export -------------------------------------------------------------------------------

def _check_output(output: Path, source: str, force: bool) -> None:
    """Never over an input: not the adapter's folder, not a folder that holds it, not inside it."""
    if not source:
        return
    out, src = output.resolve(), Path(source).resolve()
    relation = ("the folder of" if out == src else "a folder that holds" if out in src.parents
                else "inside" if src in out.parents else "")
    if relation:
        exc = FileExistsError(message("ISL-K505", output=output.name, relation=relation, adapter=src.name))
        exc.add_note(f"output path: {output}")
        raise exc


def tp_sizes(intermediate: int, largest: int = 64) -> list[int]:
    """The tensor-parallel sizes up to ``largest`` that split the sink's ``F`` (``check_tp``)."""
    return [t for t in range(1, min(intermediate, largest) + 1) if intermediate % t == 0]


def server_flags(output: str | os.PathLike[str], rank: int, target_modules: Sequence[str], tp: int = 1) -> list[str]:
    """What an sglang 0.5.23 server needs to serve the export (``SERVER_FACTS`` cites each)."""
    flags = [f"--lora-paths {Path(output).name}={output}", f"--max-lora-rank {rank}",
             "--lora-target-modules " + " ".join(sorted(server_target_modules(target_modules))),
             "--lora-backend triton"]
    return flags + ([f"--tp-size {tp}"] if tp > 1 else [])


def export_for_sglang(adapter: Adapter | str | os.PathLike[str], output: str | os.PathLike[str],
                      n_shared_experts: int, *, hidden: int | None = None, intermediate: int | None = None,
                      tp: int = 1, force: bool = False, progress: bool | None = None,
                      sglang: str | Release | None = None, hidden_act: str | None = None,
                      config: str | os.PathLike[str] | None = None) -> ExportReport:
    """Write ``output``, a PEFT folder sglang 0.5.23 serves as exactly ``adapter``'s math,
    proven on the way out; or refuse, writing nothing. Never raises on a bad adapter:
    the report says (``written``, ``error``, ``code``; ``raise_if_refused()`` raises it).

    ``adapter``: a folder, or an ``Adapter`` read from one (other modules' tensors are
    read from its file). ``hidden``/``intermediate``: the model's ``H`` and full
    per-expert ``F`` (default the adapter's; a mismatch is refused). ``tp``: the server's
    tensor-parallel size, checked to split ``F``. ``force``: replace an existing
    ``output``. ``progress``: a bar on stderr (default: for exports over 64 MiB).
    ``sglang``: the release the export is proven against (default 0.5.23; an unknown one
    is a ``ValueError`` listing the known ones); the report's first line names it.
    ``hidden_act``/``config``: the model's activation, or its ``config.json`` (or folder);
    default a ``config.json`` in the adapter folder or of its local base model
    (``transformers_interop.model_activation``, the report says where); another than
    SiLU is refused (``ISL-K507``: sglang's sink computes SiLU only).
    """
    output = as_path("export_for_sglang: output", output)
    for what, value in (("n_shared_experts", n_shared_experts), ("tp", tp)):  # the plan reshapes by them
        check_size(f"export_for_sglang: {what}", value, 1)
    name = adapter.name if isinstance(adapter, Adapter) else as_path("export_for_sglang: adapter", adapter).name
    report = ExportReport(name, str(output), n_shared_experts, hidden, intermediate, tp, release=release(sglang))
    try:
        read = ExportInput(adapter)
        _check_output(output, read.source, force)
        from .transformers_interop import model_activation

        report.hidden_act, report.hidden_act_from = model_activation(read.source or None, config, hidden_act)
        if report.hidden_act != "silu":
            raise ValueError(message("ISL-K507", activation=report.hidden_act, where=report.hidden_act_from,
                                     release=report.release.version))
        plan = _Export(read, n_shared_experts, hidden, intermediate, tp, report.release)
        report.hidden, report.intermediate = plan.hidden, plan.intermediate
        report.rank, report.rank_reason = plan.rank, plan.rank_reason
        report.dtype = str(plan.dtype).removeprefix("torch.")
        report.modules = [m.name for m in plan.sink]
        report.other_modules = [o.module for o in plan.others]
        report.target_modules = plan.target_modules()
        with atomic_folder(output, force=force) as tmp:
            (tmp / CONFIG_FILE).write_text(json.dumps(plan.config(), indent=2) + "\n", encoding="utf-8")
            stream_safetensors(tmp / WEIGHTS_FILE, plan.specs(), plan.tensors(progress),
                               {"format": "pt", "inkling_lab_export_of": read.sha256})
            proof = verify_export(tmp, read, n_shared_experts, hidden=plan.hidden, intermediate=plan.intermediate,
                                  sglang=report.release, tp=tp)
            report.proof, report.allowed, report.reference = proof.rows, proof.allowed, proof.reference
            proof.check()
        report.findings = [*read.head.findings, *plan.findings]
        report.server_flags = server_flags(output, plan.rank, report.target_modules, tp)
        report.tp_sizes = tp_sizes(plan.intermediate)
        report.written = True
    except (OSError, ValueError, RuntimeError, AssertionError, KeyError) as exc:
        report.exception = exc
        report.error = f"{type(exc).__name__}: {exc}"
        entry = find_entry(exc)
        report.code = entry.code if entry is not None else None
    return report


def cure(adapter: Adapter | None, error: BaseException | None, folder: str | os.PathLike[str] = "ADAPTER",
         n: int | None = None, *, tp: int = 1, activation: tuple[str, str] = ("silu", ""),
         config: str | os.PathLike[str] | None = None, sglang: str | Release | None = None) -> str:
    """The doctor's line about the cure, for an adapter sglang would not serve as trained:
    ``export`` writes one it serves as trained (and the command), or why it cannot be
    cured: the kit refuses the adapter, the model's ``activation`` (name, where learnt)
    is not SiLU (``ISL-K507``), or the export's own plan refuses it (saved modules,
    tensors it cannot carry, a ``tp`` that does not split F, a fold that overflows):
    the plan the export would run, without writing anything."""
    if adapter is None:
        text = str(error).split(": ", 1)[-1] if error is not None else "the kit cannot read it"
        return f"inkling-lab export: cannot be cured because the kit refuses the adapter: {text}"
    act, where = activation
    if act != "silu":
        return (f"inkling-lab export: cannot be cured because the model computes {act}(gate) * up ({where}) and "
                f"sglang {release(sglang).version}'s shared sink computes SiLU only (ISL-K507)")
    if n is not None:
        try:
            _Export(ExportInput(adapter), n, None, None, tp, release(sglang))
        except (OSError, ValueError, RuntimeError, KeyError) as exc:
            entry = find_entry(exc)
            code = f" ({entry.code})" if entry is not None else ""
            return f"inkling-lab export: cannot be cured because {str(exc).split(': ', 1)[-1]}{code}"
    name = Path(folder).name or "ADAPTER"
    told = f" --hidden-act {act}" if where == "--hidden-act" else f" --config {config}" if config is not None else ""
    flags = (f" --tp {tp}" if tp > 1 else "") + told  # how the export learns the same activation
    return (f"`inkling-lab export` writes an adapter sglang serves as trained: inkling-lab export {name} "
            f"-o {name}_for_sglang -n {n if n is not None else 'N'}{flags}")
