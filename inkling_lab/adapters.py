"""PEFT adapters on disk, read for the shared sink (docs/reference.md#adapters-on-disk).

A PEFT adapter is a folder with ``adapter_config.json`` (``r``, ``lora_alpha``,
``target_modules``, ...) and ``adapter_model.safetensors``. Its shared-sink factors
are plain 2D LoRA matrices named ``<module>.<proj>.lora_A.weight`` /
``lora_B.weight``, ``<module>`` ending in ``mlp.shared_experts`` (per-expert exports:
``<module>.<e>.<proj>...``) and ``<proj>`` one of ``gate_proj``, ``up_proj``,
``gate_up_proj``, ``down_proj`` (or ``w1``, ``w3``, ``w2``):

* gate A, up A, fused A ``[r, H]``; down B ``[H, r]`` (the outer factors);
* gate B, up B ``[n*F, r]``, fused B ``[n*2F, r]`` (experts stacked); down A
  ``[r, n*F]`` (experts side by side). Per-expert exports: ``[F, r]``, ``[r, F]``...

PEFT ``target_parameters`` exports of transformers' ``InklingSharedExperts`` (its 3D
``gate_proj``/``up_proj``/``down_proj``) name their factors
``<module>.shared_experts[.base_layer...].lora_A.weight``; they are read as the
per-expert factors they are (``ISL-N204``; ``is_target_parameters_export`` tells them
apart: sglang 0.5.23 skips such keys and serves the base sink, docs/reference.md#peft-features).

``load_adapter`` reads and checks a folder (safetensors only, never pickle): the
header first, then only the shared-sink tensors, one at a time (other modules'
tensors are named, never read); every bad input is refused with the file, the
tensor and what was expected (``ISL-K2xx``, ``ISL-K401``/``K402``).
Where the intent is unambiguous it repairs instead (a transposed factor, an up
without a gate, an outer factor missing its expert axis), and every repair is
reported in ``Adapter.findings``; ``repair=False`` refuses those too. Findings that
need no fix carry note codes: ``ISL-N201`` the adapter trains only part of the sink
(the other factors are zero), ``ISL-N202`` tensors for other modules are left out,
``ISL-N203`` a gate without an up gets a zero up (as upstream does).
``normalize_shared_sink`` is upstream's normalization, step for step, with
upstream's raw errors; ``Adapter.factors(n)`` assembles the result into one
``LoRAFactors`` per module, ready for ``LoRAPool.load``.
"""
from __future__ import annotations

import difflib
import errno
import hashlib
import json
import math
import os
import re
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as save_safetensors_bytes

from .atomic import atomic_write
from .catalog import CATALOG, Finding, error, finding, message
from .geometry import WORKING_DTYPES
from .pool import LoRAFactors

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

RENAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
"""docs/reference.md#adapters-on-disk step 2: the ``w``-names of the same three projections."""
PROJECTIONS = ("gate_proj", "up_proj", "gate_up_proj", "down_proj", *RENAMES)

_FACTOR_KEY = re.compile(
    r"^(?P<module>.*shared_experts)\.(?:(?P<expert>\d+)\.)?(?P<proj>[^.]+)\.lora_(?P<ab>[AB])\.weight$")

TRANSFORMERS_PARAMETERS = ("gate_proj", "up_proj", "down_proj")
"""transformers' ``InklingSharedExperts`` parameters, in the order its ``__init__``
registers them: ``gate_proj [n, F, H]``, ``up_proj [n, F, H]``, ``down_proj [n, H, F]``."""

_NESTED_KEY = re.compile(r"^(?P<module>.*shared_experts)(?P<nest>(?:\.base_layer)*)\.lora_(?P<ab>[AB])\.weight$")


@dataclass(frozen=True)
class FactorName:
    """One parsed factor key: ``<module>[.<expert>].<proj>.lora_<ab>.weight``."""

    module: str
    expert: int | None
    proj: str
    ab: str

    @classmethod
    def parse(cls, key: str) -> "FactorName | None":
        m = _FACTOR_KEY.match(key)
        if m is None:
            return None
        e = m["expert"]
        return cls(m["module"], None if e is None else int(e), m["proj"], m["ab"])

    @property
    def key(self) -> str:
        expert = "" if self.expert is None else f".{self.expert}"
        return f"{self.module}{expert}.{self.proj}.lora_{self.ab}.weight"

    def with_(self, **changes: Any) -> "FactorName":
        return FactorName(**{**self.__dict__, **changes})

    @property
    def canonical(self) -> str:
        """The projection under its ``gate_proj``/``up_proj``/``down_proj`` name."""
        return RENAMES.get(self.proj, self.proj)

    @property
    def rank_axis(self) -> int:
        """A is ``[r, in]``, B is ``[out, r]``."""
        return 0 if self.ab == "A" else 1

    @property
    def is_outer(self) -> bool:
        """Gate/up A and down B: shared by all experts unless named per expert."""
        return (self.ab == "A") != (self.canonical == "down_proj")

    def expected(self) -> str:
        """The 2D shape this factor should have, in the reference's symbols (n, H, F, r)."""
        flat = self.expert is None
        if self.canonical == "down_proj":
            return ("[r, n*F]" if flat else "[r, F]") if self.ab == "A" else "[H, r]"
        if self.ab == "A":
            return "[r, H]"
        rows = "2F" if self.canonical == "gate_up_proj" else "F"
        return f"[n*{rows}, r]" if flat else f"[{rows}, r]"


def _where(source: str, file: str) -> str:
    # The folder's name and the file: enough to find it, and no machine path in a
    # notebook's stored output. The full path travels as a note on the exception.
    return f"{Path(source).name or source}/{file}" if source else file


def _refuse(exc: Exception, folder: Path | None) -> Exception:
    if folder is not None:
        exc.add_note(f"adapter folder: {folder}")
    return exc


def _shape(t: torch.Tensor) -> list[int]:
    return [int(d) for d in t.shape]


@dataclass
class Adapter:
    """One PEFT LoRA adapter: its config and its tensors, checked.

    ``weights`` holds the shared-sink factors by key, 2D ``[r, in]`` (A) or ``[out, r]``
    (B), already repaired (a ``target_parameters`` export re-named per expert); the
    tensors of other modules are only named (``other_keys``). ``findings``
    lists every repair and note, each with its code and fix.
    """

    name: str
    r: int
    lora_alpha: float
    target_modules: Any
    weights: dict[str, torch.Tensor] = field(repr=False)
    config: dict[str, Any] = field(default_factory=dict, repr=False)
    source: str = ""
    sha256: str = field(default="", repr=False)
    repair: bool = field(default=True, repr=False)
    findings: list[Finding] = field(default_factory=list, repr=False)
    target_parameter_keys: list[str] = field(default_factory=list, repr=False)
    """The file's keys of a PEFT ``target_parameters`` export (sglang skips them), read
    into ``weights`` as per-expert factors; empty for ``target_modules`` exports."""
    other_keys: list[str] = field(default_factory=list, repr=False)
    """The file's tensors for other modules (attention, routed experts...): named, never
    loaded, left out of the pool (``ISL-N202``)."""
    guess: bool = field(default=False, repr=False)
    saved_shapes: dict[str, list[int]] = field(default_factory=dict, repr=False)
    """Every tensor's shape in the weights file as saved (before any repair), read with
    its header by ``load_adapter``; empty for an adapter made in memory."""

    @property
    def peft(self) -> PeftConfig:
        """The PEFT config fields that decide the adapter's math (``r`` and ``lora_alpha``
        as this adapter holds them)."""
        return read_peft_config({**self.config, "r": self.r, "lora_alpha": self.lora_alpha,
                                 "target_modules": self.target_modules}, CONFIG_FILE)

    @property
    def scaling(self) -> float:
        """PEFT's ``lora_alpha / r`` (``lora_alpha / sqrt(r)`` with ``use_rslora``)."""
        return self.lora_alpha / (math.sqrt(self.r) if self.config.get("use_rslora") else self.r)

    def peft_name(self, fn: FactorName) -> str:
        """The name PEFT matched ``rank_pattern``/``alpha_pattern`` keys against for this
        factor (``LoraModel._create_and_replace``'s ``current_key``): its module's name
        (``model.layers.0.mlp.shared_experts.gate_proj``), or for a factor read from a
        ``target_parameters`` export the parameter's (``...shared_experts.gate_proj``,
        never the kit's per-expert ``...shared_experts.0.gate_proj``)."""
        if any(_NESTED_KEY.match(k)["module"] == fn.module for k in self.target_parameter_keys):
            return f"{module_of(fn.module)}.{fn.proj}"
        return module_of(fn.key)

    @property
    def factor_keys(self) -> list[str]:
        return [k for k in self.weights if FactorName.parse(k) is not None]

    @property
    def modules(self) -> list[str]:
        """The shared-sink modules (one per layer) this adapter trains, in file order."""
        return list(dict.fromkeys(FactorName.parse(k).module for k in self.factor_keys))

    @classmethod
    def from_state(cls, config: Mapping[str, Any], weights: Mapping[str, torch.Tensor], name: str = "",
                   source: str = "", sha256: str = "", repair: bool = True, guess: bool = False,
                   saved_shapes: Mapping[str, list[int]] | None = None) -> "Adapter":
        """Check a config and its tensors (what ``load_adapter`` does after reading).

        Raises ``ISL-K202``/``K301`` (config), ``K303``..``K305`` (what a pool cannot
        hold), ``ISL-K205``..``K209``, ``K214``, ``K302``, ``K307`` (tensors); repairs or,
        with ``repair=False``, refuses transposed factors (``ISL-K206``). Repairs that
        guess (``K309`` a folded down A, ``K310`` a rank read from the factors) need
        ``guess=True`` and say what they assumed. ``saved_shapes``: every tensor's shape
        as the file holds it (``load_adapter`` passes its header's).
        """
        where_cfg, where_w = _where(source, CONFIG_FILE), _where(source, WEIGHTS_FILE)
        peft = read_peft_config(config, where_cfg)
        _refuse_unrepresentable(peft, where_cfg)
        weights, exported, notes = _split_target_parameters(peft, config.get("target_parameters"), weights,
                                                             where_w)
        others, factors = [], {}
        for key, t in weights.items():
            fn = FactorName.parse(key)
            if fn is None or fn.proj not in PROJECTIONS:
                if "shared_experts" in key:
                    raise _unknown_name(where_w, key, fn)
                others.append(key)
            else:
                factors[key] = (fn, t)
        adapter = cls(name or Path(source).name, peft.r, peft.lora_alpha, peft.target_modules,
                      {k: t for k, (_, t) in factors.items()}, dict(config), source, sha256, repair, notes,
                      target_parameter_keys=exported, other_keys=others, guess=guess,
                      saved_shapes=dict(saved_shapes or {}))
        # A factor reads as transposed only when others confirm the config's r: if none
        # has rank r, the config (or the whole export) is wrong, and nothing is repaired.
        _check_dtypes(factors, where_w)
        ranks = sorted({int(t.shape[fn.rank_axis]) for fn, t in factors.values() if t.dim() == 2 and t.numel()})
        _check_duplicates([fn for fn, _ in factors.values()], where_w)
        _check_one_gate_up_form([fn for fn, _ in factors.values()], where_w)
        adapter._infer_rank(factors, ranks, where_cfg)
        wrong_rank = []  # every factor of the wrong rank is reported, in one error
        for key, (fn, t) in factors.items():
            try:
                adapter.weights[key] = adapter._checked(fn, t, where_w, ranks, factors)
            except ValueError as exc:
                if "its rank axis" not in str(exc):
                    raise
                wrong_rank.append(str(exc))
                continue
            _check_finite(key, adapter.weights[key], where_w)
        if wrong_rank:
            exc = ValueError(wrong_rank[0])
            for other in wrong_rank[1:]:
                exc.add_note(f"also: {other.split(': ', 1)[-1]}")
            raise exc
        if not adapter.factor_keys:
            raise error("ISL-K208", file=where_w, projections=", ".join(PROJECTIONS), count=len(others))
        _check_pairs(adapter.factor_keys, where_w)
        _check_one_shape(adapter.weights, adapter.factor_keys, where_w)
        if others:
            adapter.findings.append(finding("ISL-N202", where_w, fix="none needed: serve them with their own LoRA "
                                            "modules", count=len(others)))
        return adapter

    def _checked(self, fn: FactorName, t: torch.Tensor, where: str, ranks: list[int],
                 factors: Mapping[str, tuple[FactorName, torch.Tensor]] = {}) -> torch.Tensor:
        if t.numel() == 0 and fn.canonical == "up_proj":
            return t  # a zero-size placeholder (docs/reference.md#adapters-on-disk: an absent up)
        if t.dim() != 2:
            raise error("ISL-K205", file=where, key=repr(fn.key), ndim=t.dim(), shape=_shape(t),
                        expected=fn.expected(), advice="export the plain PEFT factor, one per module (per expert: "
                        f"'{fn.module}.<e>.{fn.proj}...')")
        axis, r = fn.rank_axis, self.peft.rank_of(self.peft_name(fn))
        said = f"r={r}" + (" (rank_pattern)" if r != self.r else "")
        if t.shape[axis] == r:
            return t
        transposed = t.shape[1 - axis] == r and r in ranks and self._fits_transposed(fn, t, factors)
        if transposed and self.repair:
            self.findings.append(Finding(
                "ISL-K206", fn.key, f"{fn.key} is stored transposed {_shape(t)}; read as {_shape(t.T)} "
                f"{fn.expected()} ({said})",
                f"none needed: the converter transposes it; re-export it as {fn.expected()} to silence this",
                consequence="sglang 0.5.23 reads it as stored (the doctor's verdict says what that gives)"))
            return t.T.contiguous()
        folded = None if transposed else self._unfold_down_a(fn, t, r, where, factors)
        if folded is not None:
            return folded
        raise error(
            "ISL-K206", file=where, key=repr(fn.key), shape=_shape(t), axis=axis, size=t.shape[axis], r=said[2:],
            advice=f"lora_{fn.ab} is {fn.expected()}"
            + (" (it is transposed: load with repair=True to transpose it)" if transposed
               else f"; no factor has rank {r} (their rank axes are {ranks}): fix r in {CONFIG_FILE} "
               "(--repair reads it from the factors when they all agree)" if r not in ranks
               else f": re-export this factor with rank {r}, or give its module its own rank in rank_pattern"))

    def _fits_transposed(self, fn: FactorName, t: torch.Tensor,
                         factors: Mapping[str, tuple[FactorName, torch.Tensor]]) -> bool:
        """Read transposed, would ``t``'s other axis agree with the factors of its role
        that have their rank where it belongs (``H`` for the outer factors, the same
        projection's features for the inner ones)? No such factor: no evidence against."""
        def role(f: FactorName) -> Any:
            return "H" if f.is_outer else (f.canonical, f.ab, f.expert is None)

        def size(f: FactorName, shape: Sequence[int]) -> int:
            return int(shape[1] if f.ab == "A" else shape[0])

        seen = {size(g, u.shape) for g, u in factors.values()
                if g is not fn and role(g) == role(fn) and u.dim() == 2 and u.numel()
                and u.shape[g.rank_axis] == self.peft.rank_of(self.peft_name(g))}
        return not seen or size(fn, t.T.shape) in seen

    def _infer_rank(self, factors: Mapping[str, tuple[FactorName, torch.Tensor]], ranks: list[int],
                    where: str) -> None:
        """A guess (``ISL-K310``, only with ``guess``): no factor has the config's rank and
        they all share one other rank: read ``r`` from the factors."""
        if not self.guess or self.peft.rank_pattern or len(ranks) != 1 or ranks[0] == self.r:
            return
        if any(t.dim() == 2 and t.numel() and t.shape[fn.rank_axis] != ranks[0] for fn, t in factors.values()):
            return
        self.findings.append(Finding(
            "ISL-K310", where, f"{where} says r={self.r} but every factor has rank {ranks[0]}: assumed "
            f"r={ranks[0]} and lora_alpha={self.lora_alpha:g} as written (scaling "
            f"{self.lora_alpha:g}/{ranks[0]}{'' if not self.peft.use_rslora else ' under sqrt'})",
            f"set \"r\": {ranks[0]} in {CONFIG_FILE} if that is what it was trained with (--repair assumed it)"))
        self.r = ranks[0]

    def _unfold_down_a(self, fn: FactorName, t: torch.Tensor, r: int, where: str,
                       factors: Mapping[str, tuple[FactorName, torch.Tensor]]) -> torch.Tensor | None:
        """A flat down A saved ``[n*r, F]`` (the expert axis folded into the rows) instead
        of ``[r, n*F]``: refused (``ISL-K309``) with the reshape that fixes it, applied
        only with ``guess`` (it assumes expert-major rows). Recognised only when the
        module's gate/up B confirms ``n*F`` (``[n*F, r]``, fused ``[n*2F, r]``)."""
        rows, cols = t.shape
        if fn.canonical != "down_proj" or fn.ab != "A" or fn.expert is not None or rows % r or rows == r:
            return None
        n = rows // r
        features = {int(b.shape[0]) // (2 if g.canonical == "gate_up_proj" else 1) for g, b in factors.values()
                    if g.module == fn.module and g.expert is None and g.ab == "B" and g.canonical != "down_proj"
                    and b.dim() == 2}
        if features != {n * cols}:
            return None
        fix = f"A.reshape({n}, {r}, {cols}).permute(1, 0, 2).reshape({r}, {n * cols})"
        if not self.guess:
            raise error("ISL-K309", file=where, key=repr(fn.key), shape=_shape(t), r=r, n=n, flat=[r, n * cols],
                        reshape=fix)
        self.findings.append(Finding(
            "ISL-K309", fn.key, f"{fn.key} is {_shape(t)} = [n*r, F]: its expert axis is folded into the rows; "
            f"read as {fix} -> [{r}, {n * cols}] (assumed: expert e holds rows {r}e..{r}e+{r - 1})",
            f"re-save it as {fix} to silence this (--repair assumed the row order)",
            consequence="sglang 0.5.23 reshapes it as stored (the doctor's verdict says what that gives)"))
        return t.reshape(n, r, cols).permute(1, 0, 2).reshape(r, n * cols).contiguous()

    def normalized(self, n_shared_experts: int, module: str | None = None) -> dict[str, torch.Tensor]:
        """The shared-sink factors (of one ``module``, default all) after upstream's
        normalization (docs/reference.md#adapters-on-disk); gate and up at their own
        ranks (``rank_pattern``) zero-padded to the larger first, which is exact (zero
        rows of A meet zero columns of B) and which upstream's stacking needs."""
        keys = [k for k in self.factor_keys if module is None or FactorName.parse(k).module == module]
        return normalize_shared_sink(_one_gate_up_rank({k: self.weights[k] for k in keys}), n_shared_experts)

    def factors(self, n_shared_experts: int) -> dict[str, LoRAFactors]:
        """One ``LoRAFactors`` per module: ``gate_up_a [O, 2r, H]``, ``gate_up_b [n, 2F, r]``,
        ``down_a [n, r, F]``, ``down_b [O, H, r]``, ``O`` 1 or ``n``.

        Raises upstream's raw reshape ``RuntimeError`` for flat factors that do not
        split into ``n`` experts, ``ISL-K210`` for per-expert factors that do not
        cover the experts; repairs (or refuses, ``ISL-K211``/``K212``) an up without
        a gate and mixed outer layouts.
        """
        return {m: self.module_factors(m, n_shared_experts) for m in self.modules}

    def module_factors(self, module: str, n_shared_experts: int) -> LoRAFactors:
        """``factors(n)[module]``, computing only that module (the converter goes module
        by module, so that it holds one module's normalized factors at a time)."""
        normalized = self.normalized(n_shared_experts, module)
        for key in self.factor_keys:
            fn = FactorName.parse(key)
            if fn.module == module and fn.canonical == "gate_proj" and fn.ab == "A":
                up = self.weights.get(fn.with_(proj={"gate_proj": "up_proj", "w1": "w3"}[fn.proj]).key)
                if up is None or not up.numel():
                    self._note(finding("ISL-N203", key, fix="none needed: upstream does the same", key=key))
        return self._assemble(normalized, module, n_shared_experts)

    def _note(self, finding: Finding) -> None:
        # factors() may run more than once (one pool per geometry): report each thing once.
        if finding not in self.findings:
            self.findings.append(finding)

    def _assemble(self, normalized: dict[str, torch.Tensor], module: str, n: int) -> LoRAFactors:
        where = _where(self.source, WEIGHTS_FILE)
        self._stack_lone_up(normalized, module)
        parts = {(proj, ab): _gather(normalized, module, proj, ab, n, where)
                 for proj in ("gate_up_proj", "down_proj") for ab in "AB"}
        ga, gb = parts["gate_up_proj", "A"], parts["gate_up_proj", "B"]
        da, db = parts["down_proj", "A"], parts["down_proj", "B"]
        dtype = next(t.dtype for t in parts.values() if t is not None)
        r = ga.shape[-2] // 2 if ga is not None else da.shape[-2]  # the module's own rank (rank_pattern)
        if ga is None or da is None:
            missing = "gate/up" if ga is None else "down"
            self._note(finding("ISL-N201", module, fix="none needed: a zero factor adds no delta", module=module,
                               missing=missing))
            if ga is None:  # zeros in the other outer factor's layout
                H, F = db.shape[-2], da.shape[-1]
                ga, gb = torch.zeros(db.shape[0], 2 * r, H, dtype=dtype), torch.zeros(n, 2 * F, r, dtype=dtype)
            else:
                H, F = ga.shape[-1], gb.shape[-2] // 2
                da, db = torch.zeros(n, r, F, dtype=dtype), torch.zeros(ga.shape[0], H, r, dtype=dtype)
        ga, gb, da, db = _one_rank(ga, gb, da, db)
        ga, db = self._one_outer_layout(module, ga, db, where)
        gb, da = self._peft_scalings(module, n, gb, da)
        return LoRAFactors(ga, gb, da, db, lora_alpha=self.scaling * da.shape[-2], name=self.name)

    def projection_scalings(self, module: str, n: int) -> dict[str, list[float]]:
        """PEFT's scaling of each projection (``gate``, ``up``, ``down``) of each of the
        ``n`` experts of one sink module: ``alpha_pattern``, ``rank_pattern`` and
        ``use_rslora`` applied to the module names the factors were saved under."""
        peft, out = self.peft, {}
        for part, projs in (("gate", ("gate_proj", "w1", "gate_up_proj")), ("up", ("up_proj", "w3", "gate_up_proj")),
                            ("down", ("down_proj", "w2"))):
            names: dict[int | None, str] = {}
            for key in self.factor_keys:
                fn = FactorName.parse(key)
                if fn.module == module and fn.proj in projs:
                    names.setdefault(fn.expert, self.peft_name(fn))
            out[part] = [peft.scaling_of(names[e]) if e in names else
                         peft.scaling_of(names[None]) if None in names else self.scaling for e in range(n)]
        return out

    def _peft_scalings(self, module: str, n: int, gb: torch.Tensor, da: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """The pool folds one scaling into B; per-module alphas and ranks give each
        projection (and expert) its own. Their ratio to the adapter's scaling goes onto
        the inner factors, which are per expert: gate/up B rows and down A."""
        s = self.projection_scalings(module, n)
        if all(v == self.scaling for vs in s.values() for v in vs):
            return gb, da
        F = gb.shape[-2] // 2
        ratio = lambda part: torch.tensor([v / self.scaling for v in s[part]], dtype=torch.float64)  # noqa: E731
        gb = gb.clone()
        gb[:, :F] = (gb[:, :F].double() * ratio("gate")[:, None, None]).to(gb.dtype)
        gb[:, F:] = (gb[:, F:].double() * ratio("up")[:, None, None]).to(gb.dtype)
        da = (da.double() * ratio("down")[:, None, None]).to(da.dtype)
        return gb, da

    def _stack_lone_up(self, normalized: dict[str, torch.Tensor], module: str) -> None:
        """An up without a gate: upstream leaves it unstacked, so sglang never applies
        it. The intent is plain (train up only): stack it with a zero gate."""
        for key in [k for k in normalized if k.startswith(module)]:
            fn = FactorName.parse(key)
            if fn is None or fn.module != module or fn.proj != "up_proj":
                continue
            if not self.repair:
                raise error("ISL-K211", file=_where(self.source, WEIGHTS_FILE), module=module,
                            advice="export gate_proj too (zeros if only up was trained), or load with repair=True")
            up = normalized.pop(key)
            normalized[fn.with_(proj="gate_up_proj").key] = torch.cat([torch.zeros_like(up), up], dim=-2)
            self._note(Finding(
                "ISL-K211", module, f"{module}: up_proj has no gate_proj; stacked with a zero gate",
                "none needed: the converter stacks it; export gate_proj too to silence this",
                consequence="sglang leaves it unstacked and silently serves the base model for up"))

    def _one_outer_layout(self, module: str, ga: torch.Tensor, db: torch.Tensor, where: str
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        if ga.shape[0] == db.shape[0]:
            return ga, db
        shared, per = ("gate-up A", "down B") if ga.shape[0] == 1 else ("down B", "gate-up A")
        if not self.repair:
            raise error("ISL-K212", file=where, module=module, per_expert=per, shared=shared,
                        advice=f"name {shared} per expert too, or load with repair=True to give every expert the "
                        "shared one")
        n = max(ga.shape[0], db.shape[0])
        self._note(Finding(
            "ISL-K212", module, f"{module}: {per} is per expert but {shared} is shared; the shared one now "
            f"serves each of the {n} experts (exact)", f"none needed: the converter expands {shared}; "
            f"name it per expert to silence this"))
        return ga.expand(n, -1, -1).contiguous(), db.expand(n, -1, -1).contiguous()


def _targeted(module: str, targets: Any) -> list[str]:
    """The parameters of ``module`` that a ``target_parameters`` list names, in
    ``TRANSFORMERS_PARAMETERS`` order. PEFT matches a parameter whose full name equals
    an entry or ends in ``.`` + the entry (``tuners_utils.py``, ``_inject_parameters``)."""
    if not isinstance(targets, (list, tuple)):
        return []
    names = [t for t in targets if isinstance(t, str)]
    return [p for p in TRANSFORMERS_PARAMETERS
            if any(f"{module}.{p}" == t or f"{module}.{p}".endswith(f".{t}") for t in names)]


def peft_target_parameter_keys(keys: Iterable[str]) -> list[str]:
    """The keys of a PEFT ``target_parameters`` export of the shared sink, among ``keys``.

    Such an export wraps transformers' 3D expert parameters (``InklingSharedExperts``
    ``gate_proj``/``up_proj``/``down_proj``) in nested ``ParamWrapper``s, so its factors
    are named ``<module>.shared_experts[.base_layer...].lora_A.weight``: no projection in
    the name. sglang 0.5.23 matches none of them to a target module and skips them
    (docs/reference.md#peft-features). Works on names only: pass ``safe_open(...).keys()`` or ``adapter.weights``.
    """
    return [k for k in keys if _NESTED_KEY.match(k)]


def is_target_parameters_export(adapter: "Adapter | Iterable[str]") -> bool:
    """True when ``adapter`` (an ``Adapter``, or the key names of a weights file) holds
    its shared-sink factors as a PEFT ``target_parameters`` export (sglang skips them)."""
    if isinstance(adapter, Adapter):
        return bool(adapter.target_parameter_keys)
    return bool(peft_target_parameter_keys(adapter))


def _split_target_parameters(peft: "PeftConfig", targets: Any, weights: Mapping[str, torch.Tensor], where: str
                             ) -> tuple[dict[str, torch.Tensor], list[str], list[Finding]]:
    """A PEFT ``target_parameters`` export, re-named as per-expert factors.

    PEFT wraps one ``ParamWrapper`` per targeted parameter around the module, in the
    order the module registers its parameters (gate, up, down: the first is innermost),
    whatever the order of the config's list (``peft/tuners/tuners_utils.py``,
    ``_inject_parameters``: it walks ``module.named_parameters()``; only a module that
    already carries torch parametrizations is nested in sorted name order, which no
    plain transformers model does); the outermost wrapper's factors carry no
    ``base_layer``, each wrapper inside adds one. A wrapper of a 3D parameter ``[n, out,
    in]`` (``peft/tuners/lora/layer.py``, ``ParamWrapper.update_layer`` and
    ``get_delta_weight``) stores ``lora_A [n*r, in]`` grouped by expert (expert ``e`` is
    rows ``e*r .. e*r+r-1``) and ``lora_B [out, n*r]`` strided by expert (expert ``e``
    is columns ``e, e+n, e+2n, ...``). Each expert's pair becomes
    ``<module>.<e>.<proj>.lora_A.weight [r, in]`` / ``lora_B.weight [out, r]``: the
    per-expert outer layout. ``r`` is each parameter's own rank (``peft.rank_of`` of
    ``<module>.<proj>``, the name PEFT matches ``rank_pattern`` against). Returns the new
    weights, the file keys read this way, and one ``ISL-N204`` note per module.
    """
    groups: dict[str, dict[int, dict[str, str]]] = {}
    for key in peft_target_parameter_keys(weights):
        m = _NESTED_KEY.match(key)
        groups.setdefault(m["module"], {}).setdefault(m["nest"].count(".base_layer"), {})[m["ab"]] = key
    if not groups:
        return dict(weights), [], []
    out = {k: t for k, t in weights.items() if not _NESTED_KEY.match(k)}
    notes = []
    for module, by_depth in groups.items():
        classic = [k for k in out if (fn := FactorName.parse(k)) is not None and fn.module == module]
        if classic:  # two readings of one module: which one was trained is not in the file (one would be dropped)
            raise ValueError(message("ISL-K233", file=where, module=module, nested=len(by_depth), key=classic[0],
                                     count=len(classic)))
        params = _targeted(module, targets)
        per_expert: dict[FactorName, torch.Tensor] = {}
        ranks: dict[str, int] = {}
        if len(params) != len(by_depth) or sorted(by_depth) != list(range(len(params))):
            raise ValueError(message(
                "ISL-K401", file=where, module=module, pairs=len(by_depth),
                depths=", ".join(f"{d} x base_layer" for d in sorted(by_depth)), targets=repr(targets),
                named=len(params), parameters=list(TRANSFORMERS_PARAMETERS)))
        for proj, depth in zip(params, range(len(params) - 1, -1, -1)):  # gate, up, down; innermost first
            pair = by_depth[depth]
            if set(pair) != {"A", "B"}:
                have = next(iter(pair.values()))
                other = have.replace(".lora_A.", ".lora_B.") if "A" in pair else have.replace(".lora_B.", ".lora_A.")
                raise error("ISL-K209", file=where, key=repr(have), other=repr(other))
            a, b = weights[pair["A"]], weights[pair["B"]]
            r = ranks[proj] = peft.rank_of(f"{module_of(module)}.{proj}")
            said = f"{r} (rank_pattern)" if r != peft.r else repr(r)
            rows = int(a.shape[0]) if a.dim() == 2 else -1
            if (a.dim() != 2 or b.dim() != 2 or not isinstance(r, int) or isinstance(r, bool) or r < 1
                    or rows % r or not rows or b.shape[1] != rows):
                raise ValueError(message("ISL-K402", file=where, module=module, proj=proj, shape_a=_shape(a),
                                         shape_b=_shape(b), r=said))
            n = rows // r
            for e in range(n):
                per_expert[FactorName(module, e, proj, "A")] = a[e * r:(e + 1) * r]
                per_expert[FactorName(module, e, proj, "B")] = b[:, e::n]
        # expert by expert, gate before up before down
        order = {p: i for i, p in enumerate(TRANSFORMERS_PARAMETERS)}
        out.update((fn.key, t) for fn, t in sorted(per_expert.items(), key=lambda i: (i[0].expert, order[i[0].proj],
                                                                                      i[0].ab)))
        note = CATALOG["ISL-N204"]
        notes.append(Finding("ISL-N204", module, note.format(module=module, parameters=", ".join(params), n=n, r=(
            str(r) if len(set(ranks.values())) == 1 else ", ".join(f"{k} {v}" for k, v in ranks.items()))),
                             note.remedy, consequence=note.upstream))
    return out, [k for k in weights if _NESTED_KEY.match(k)], notes


BASE_CHANGING_INITS = ("pissa", "olora", "corda", "loftq")
"""``init_lora_weights`` values with which PEFT changes the base weights too (the saved
adapter then means "this delta on that residual base") unless the adapter was converted
to plain LoRA when saved."""


def _pattern_key(patterns: Mapping[str, Any], module: str) -> str | None:
    # PEFT's own rule (peft.utils.other.get_pattern_key): the first key that matches the
    # module name's end, at a dot boundary.
    for key in patterns:
        if re.match(rf"(.*\.)?({key})$", module):
            return key
    return None


@dataclass(frozen=True)
class PeftConfig:
    """The fields of a PEFT ``LoraConfig`` that decide what an adapter computes.

    ``rank_of``/``alpha_of``/``scaling_of`` take a module name
    (``...mlp.shared_experts.gate_proj``) and apply ``rank_pattern`` and
    ``alpha_pattern`` by PEFT's matching rule; ``scaling_of`` is PEFT's
    ``alpha / r`` (``alpha / sqrt(r)`` with ``use_rslora``) for that module.
    """

    r: int
    lora_alpha: float
    target_modules: Any = None
    use_rslora: bool = False
    alpha_pattern: Mapping[str, float] = field(default_factory=dict)
    rank_pattern: Mapping[str, int] = field(default_factory=dict)
    use_dora: bool = False
    lora_bias: bool = False
    init_lora_weights: Any = True
    peft_type: str = "LORA"
    modules_to_save: tuple[str, ...] = ()
    fan_in_fan_out: bool = False

    def rank_of(self, module: str) -> int:
        key = _pattern_key(self.rank_pattern, module)
        return int(self.rank_pattern[key]) if key is not None else self.r

    def alpha_of(self, module: str) -> float:
        key = _pattern_key(self.alpha_pattern, module)
        return float(self.alpha_pattern[key]) if key is not None else self.lora_alpha

    def scaling_of(self, module: str) -> float:
        r = self.rank_of(module)
        return self.alpha_of(module) / (math.sqrt(r) if self.use_rslora else r)

    @property
    def base_changing_init(self) -> str | None:
        """``pissa``, ``olora``, ``corda`` or ``loftq`` (``pissa_niter_4`` reads as pissa), else None."""
        init = self.init_lora_weights
        if isinstance(init, str):
            return next((k for k in BASE_CHANGING_INITS if init.lower().startswith(k)), None)
        return None


def module_of(key: str) -> str:
    """The module name PEFT matches patterns against: the factor key without PEFT's
    ``base_model.model.`` prefix and its ``.lora_A.weight`` ending."""
    name = key.removeprefix("base_model.model.")
    return re.sub(r"\.lora_[AB]\.weight$", "", name)


def read_peft_config(config: Mapping[str, Any], where: str = CONFIG_FILE) -> PeftConfig:
    """Read and check a PEFT adapter config (``adapter_config.json`` as a dict).

    Raises ``ISL-K202`` for a malformed field and ``ISL-K301`` for a ``lora_alpha``
    (or ``alpha_pattern`` value) that is not a finite number (JSON's ``NaN``,
    ``Infinity``, or ``1e400``, which reads as infinity).
    """
    def bad(detail: str) -> ValueError:
        return ValueError(f"{where}: malformed adapter config: {detail}")

    def number(value: Any, what: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad(f'{what} must be a number, got {value!r}')
        if not math.isfinite(value):
            raise error("ISL-K301", file=where, field=what, value=repr(value))
        return float(value)

    def rank(value: Any, what: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad(f'{what} must be a positive integer, got {value!r}')
        return value

    def mapping(value: Any, what: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise bad(f"{what} must be an object (module pattern -> value), got {value!r}")
        return dict(value)

    if not isinstance(config, Mapping):
        raise bad(f"expected a JSON object, got {type(config).__name__}")
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise bad(f"peft_type is {config['peft_type']!r}; only LoRA adapters have shared-sink factors")
    if config.get("r") is None:
        raise bad('no "r" (the LoRA rank), e.g. "r": 8')
    r = rank(config["r"], '"r"')
    alpha = number(config.get("lora_alpha", 8), '"lora_alpha"')  # PEFT's default
    ranks = {k: rank(v, f'rank_pattern[{k!r}]') for k, v in mapping(config.get("rank_pattern"), "rank_pattern").items()}
    alphas = {k: number(v, f'alpha_pattern[{k!r}]')
              for k, v in mapping(config.get("alpha_pattern"), "alpha_pattern").items()}
    saved = config.get("modules_to_save") or ()
    return PeftConfig(
        r=r, lora_alpha=alpha, target_modules=config.get("target_modules"),
        use_rslora=bool(config.get("use_rslora")), alpha_pattern=alphas, rank_pattern=ranks,
        use_dora=bool(config.get("use_dora")), lora_bias=bool(config.get("lora_bias")),
        init_lora_weights=config.get("init_lora_weights", True), peft_type=peft_type,
        modules_to_save=(saved,) if isinstance(saved, str) else tuple(saved),
        fan_in_fan_out=bool(config.get("fan_in_fan_out")))


def _read_config(config: Mapping[str, Any], where: str) -> tuple[int, float, Any]:
    peft = read_peft_config(config, where)
    return peft.r, peft.lora_alpha, peft.target_modules


def _refuse_unrepresentable(peft: PeftConfig, where: str) -> None:
    """What a LoRA pool cannot hold, refused with the reason and the way out."""
    if peft.use_dora:
        raise error("ISL-K303", file=where)
    if peft.lora_bias:
        raise error("ISL-K304", file=where)
    init = peft.base_changing_init
    if init is not None:
        raise error("ISL-K305", file=where, init=repr(peft.init_lora_weights), method=init, way_out=(
            "serve it on the LoftQ-quantized base it was made with, or merge it" if init == "loftq" else
            "convert it to plain LoRA when saving (PEFT save_pretrained(..., "
            "path_initial_model_for_weight_conversion=<the initial adapter>)) and use that folder"))


def _unknown_name(where: str, key: str, fn: FactorName | None) -> ValueError:
    known = ", ".join(PROJECTIONS)
    hint = ""
    if fn is not None:
        close = difflib.get_close_matches(fn.proj, PROJECTIONS, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
    return error("ISL-K207", file=where, key=repr(key), projections=known, hint=hint)


def _check_pairs(keys: list[str], where: str) -> None:
    present = set(keys)
    for key in keys:
        fn = FactorName.parse(key)
        other = fn.with_(ab="B" if fn.ab == "A" else "A").key
        if other not in present:
            raise error("ISL-K209", file=where, key=repr(key), other=repr(other))


def _one_rank(ga: torch.Tensor, gb: torch.Tensor, da: torch.Tensor, db: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gate/up and down of one module at different ranks (``rank_pattern``): both
    zero-padded to the larger, which is exact (zero rows of A meet zero columns of B)."""
    r_gu, r_d = ga.shape[-2] // 2, da.shape[-2]
    R = max(r_gu, r_d)
    if r_gu == r_d:
        return ga, gb, da, db

    def pad(t: torch.Tensor, axis: int, to: int) -> torch.Tensor:
        shape = list(t.shape)
        shape[axis] = to - t.shape[axis]
        return torch.cat([t, t.new_zeros(shape)], dim=axis)

    ga = torch.cat([pad(ga[..., :r_gu, :], -2, R), pad(ga[..., r_gu:, :], -2, R)], dim=-2)
    return ga, pad(gb, -1, R), pad(da, -2, R), pad(db, -1, R)


def _one_gate_up_rank(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Gate and up factors of one module (and expert) at different ranks: the smaller
    zero-padded along its rank axis to the larger."""
    rank = {}
    for key, t in weights.items():
        fn = FactorName.parse(key)
        if fn.canonical in ("gate_proj", "up_proj") and t.dim() == 2 and t.numel():
            pair = (fn.module, fn.expert)
            rank[pair] = max(rank.get(pair, 0), int(t.shape[fn.rank_axis]))
    out = {}
    for key, t in weights.items():
        fn = FactorName.parse(key)
        want = rank.get((fn.module, fn.expert)) if fn.canonical in ("gate_proj", "up_proj") else None
        if want is not None and t.dim() == 2 and t.numel() and t.shape[fn.rank_axis] < want:
            shape = list(t.shape)
            shape[fn.rank_axis] = want - t.shape[fn.rank_axis]
            t = torch.cat([t, t.new_zeros(shape)], dim=fn.rank_axis)
        out[key] = t
    return out


def _check_duplicates(names: list[FactorName], where: str) -> None:
    """Two keys for one factor (``w1`` and ``gate_proj`` of one module, experts ``.0.``
    and ``.00.``): refused, never one silently dropped (``ISL-K307``)."""
    seen: dict[tuple[str, int | None, str, str], FactorName] = {}
    for fn in names:
        first = seen.setdefault((fn.module, fn.expert, fn.canonical, fn.ab), fn)
        if first is not fn:
            raise error("ISL-K307", file=where, key=repr(first.key), other=repr(fn.key), factor=f"{fn.canonical}.lora_"
                        f"{fn.ab}" + (f" of expert {fn.expert}" if fn.expert is not None else ""))


def _check_dtypes(factors: Mapping[str, tuple[FactorName, torch.Tensor]], where: str) -> None:
    """Every factor a working float dtype (``ISL-K230``), one dtype per module (``ISL-K231``):
    never a truncated integer, a float8 that no arithmetic takes, or a silent rounding."""
    by_module: dict[str, dict[str, torch.dtype]] = {}
    for key, (fn, t) in factors.items():
        if t.dtype not in WORKING_DTYPES:
            raise ValueError(message("ISL-K230", file=where, key=key, dtype=str(t.dtype).removeprefix("torch.")))
        by_module.setdefault(fn.module, {})[key] = t.dtype
    for module, dtypes in by_module.items():
        if len(set(dtypes.values())) > 1:
            listed = ", ".join(f"{k.rsplit('shared_experts.', 1)[-1]} {str(d).removeprefix('torch.')}"
                               for k, d in dtypes.items())
            raise ValueError(message("ISL-K231", file=where, module=module, dtypes=listed))


def _check_one_gate_up_form(names: list[FactorName], where: str) -> None:
    """A fused ``gate_up_proj`` next to a split ``gate_proj``/``up_proj`` of one module (and
    expert): upstream's result depends on the keys' order, so the kit refuses (``ISL-K312``)."""
    forms: dict[tuple[str, int | None], dict[bool, list[str]]] = {}
    for fn in names:
        if fn.canonical in ("gate_proj", "up_proj", "gate_up_proj"):
            forms.setdefault((fn.module, fn.expert), {}).setdefault(fn.canonical == "gate_up_proj", []).append(fn.key)
    for (module, expert), by in forms.items():
        if len(by) == 2:
            raise ValueError(message("ISL-K312", file=where, module=module + ("" if expert is None else f".{expert}"),
                                     fused=", ".join(sorted(by[True])), split=", ".join(sorted(by[False]))))


def _check_finite(key: str, t: torch.Tensor, where: str) -> None:
    if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise error("ISL-K302", file=where, key=repr(key), k=bad, numel=t.numel())


def _check_one_shape(weights: Mapping[str, torch.Tensor], keys: list[str], where: str) -> None:
    """Gate and up (stacked together) and every expert's copy of a factor (stacked
    across experts) must have one shape; else torch's raw cat/stack error would follow."""
    first: dict[tuple[str, str, str, bool], str] = {}
    for key in keys:
        fn = FactorName.parse(key)
        if not weights[key].numel():
            continue
        family = "gate_proj" if fn.canonical == "up_proj" else fn.canonical
        seen = first.setdefault((fn.module, fn.ab, family, fn.expert is None), key)
        # the rank axes were checked against each factor's own rank (rank_pattern may give gate and up
        # their own): the other axis must agree
        other = 1 - fn.rank_axis
        if weights[key].dim() != weights[seen].dim() or weights[key].shape[other] != weights[seen].shape[other]:
            raise error("ISL-K214", file=where, key=repr(key), shape=_shape(weights[key]), other=repr(seen),
                        other_shape=_shape(weights[seen]))


def _gather(normalized: dict[str, torch.Tensor], module: str, proj: str, ab: str, n: int, where: str
            ) -> torch.Tensor | None:
    """One factor of one module with its expert axis: the shared tensor, or the
    per-expert ones stacked (``[n, ...]``)."""
    name = FactorName(module, None, proj, ab)
    shared = normalized.get(name.key)
    per = {}
    for key, t in normalized.items():
        fn = FactorName.parse(key)
        if fn is not None and fn.expert is not None and fn.with_(expert=None) == name:
            per[fn.expert] = t
    if not per:
        return shared
    label = f"{module}.<e>.{proj}.lora_{ab}"
    if shared is not None:
        raise error("ISL-K210", file=where, factor=label, problem=f"both per expert (experts {sorted(per)}) and "
                    f"as one shared {name.key!r}: keep one of the two")
    if sorted(per) != list(range(n)):
        raise error("ISL-K210", file=where, factor=label, problem=f"for experts {sorted(per)} but the sink has "
                    f"n={n} shared experts (it needs experts 0..{n - 1})")
    return torch.stack([per[e] for e in range(n)])


_DOWN_PARTS = (".w2.", ".down_proj.")
_GATE_UP_PARTS = (".w1.", ".w3.", ".gate_proj.", ".up_proj.", ".gate_up_proj.")


def _reshape_role(key: str) -> str | None:
    """Which reshape of step 1 a tensor of this name gets, by upstream's own test of the
    name (docs/reference.md#adapters-on-disk): ``"down"``, ``"gate_up"``, or ``None`` (not
    under ``shared_experts.``, named per expert, or no sink projection: a ``router``, a
    ``gate`` weight... stays exactly as it is)."""
    if "shared_experts." not in key or re.search(r"shared_experts\.\d+\.", key):
        return None
    if any(part in key for part in _DOWN_PARTS):
        return "down"
    return "gate_up" if any(part in key for part in _GATE_UP_PARTS) else None


def normalize_shared_sink(weights: Mapping[str, torch.Tensor], n_shared_experts: int) -> dict[str, torch.Tensor]:
    """Upstream's normalization of shared-sink factors (docs/reference.md#adapters-on-disk), in its three steps.

    1. Reshape: flat down A ``[r, n*F] -> [n, r, F]``; flat gate, up or fused B
       ``[n*X, r] -> [n, X, r]``; gate, up or fused A ``[r, H] -> [1, r, H]`` and down B
       ``[H, r] -> [1, H, r]``. Per-expert named factors stay as they are, and so does
       every other name under ``shared_experts.`` (``_reshape_role``). A width
       or height that does not split into ``n`` raises torch's own reshape
       ``RuntimeError``, as upstream does (``ISL-E012``).
    2. Rename ``w1``/``w3``/``w2`` to ``gate_proj``/``up_proj``/``down_proj`` (a renamed
       key moves to the end of the dict, or replaces the key of its new name in place).
    3. Stack gate and up into ``gate_up_proj`` (A along the rank axis, B along the
       feature axis); a gate without an up (or with a zero-size one) gets a zero up; an
       up without a gate stays ``up_proj``; a fused A is repeated along its rank axis.
       The names are walked in the order step 2 left them, and each step acts on the
       dict as it stands, as upstream's does: with a fused and a split gate/up of one
       prefix the result depends on that order (``inkling-lab selfcheck`` compares this
       with a wheel's code on such cases).

    Keys that are no shared-sink factor pass through untouched.
    """
    n = n_shared_experts
    out = dict(weights)
    for key, t in out.items():  # 1. reshape in place: the keys and their order stay
        role = _reshape_role(key)
        if role is not None and t.dim() == 2:  # at rank 0 too, silently
            if role == "down" and "lora_A" in key:  # down A: experts side by side
                out[key] = t.reshape(t.shape[0], n, t.shape[1] // n).transpose(0, 1)
            elif role == "gate_up" and "lora_A" not in key:  # gate, up or fused B: experts stacked
                out[key] = t.reshape(n, t.shape[0] // n, t.shape[1])
            else:
                out[key] = t.unsqueeze(0)
    # 2. rename as upstream does, by replacing the name part (pop, then insert): a renamed key
    # moves to the end, or takes the place of the key of that name, whose tensor it replaces
    renames = {}
    for key in out:
        old = next((part for part in (".w1.", ".w3.", ".w2.") if part in key), None)
        if old is not None:
            renames[key] = key.replace(old, f".{RENAMES[old.strip('.')]}.")
    for old, new in renames.items():
        out[new] = out.pop(old)
    for key in list(out):  # 3. stack, walking the names as they stand after step 2 (upstream's order)
        if "gate_proj" in key:  # any name that holds it, a bias too, as upstream tests the name
            up, fused = key.replace("gate_proj", "up_proj"), key.replace("gate_proj", "gate_up_proj")
            if up not in out or out[up].numel() == 0:
                out[up] = torch.zeros_like(out[key])
            out[fused] = torch.cat([out[key], out[up]], dim=out[key].dim() - 2)
            del out[key], out[up]
        elif "gate_up_proj" in key and "lora_A" in key:  # one fused A serves both halves
            repeat = [1] * out[key].dim()
            repeat[out[key].dim() - 2] = 2
            out[key] = out[key].repeat(*repeat)
    return out


# ----------------------------------------------------------------------------
# Reading and writing folders
# ----------------------------------------------------------------------------

def _adapter_folder(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    return p.parent if p.name in (CONFIG_FILE, WEIGHTS_FILE) else p


def load_adapter(path: str | os.PathLike[str], repair: bool = True, guess: bool = False) -> Adapter:
    """Read a PEFT adapter folder (or its config or weights file) into an ``Adapter``.

    Safetensors only: a pickle checkpoint (``adapter_model.bin``) is refused, never
    opened. Errors name the file and tensor: ``ISL-K201`` no config, ``K202``
    malformed config, ``K203`` no weights file, ``K204`` corrupt weights, ``K205``
    a factor not 2D, ``K206`` a factor of another rank, ``K207`` a name that is no
    shared-sink projection, ``K208`` no shared-sink factor, ``K209`` an A without
    its B, ``K214`` gate and up (or two experts' copies) of different shapes. The
    sha256 of the weights file identifies the adapter in converted pools.
    """
    folder = _adapter_folder(path)
    source = str(folder)
    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    for path in (config_path, weights_path):  # a FIFO, a device or a folder under either name: said so, never opened
        try:
            check_regular(path)
        except ValueError as exc:
            raise _refuse(exc, folder) from None
    if not config_path.is_file():
        named = sorted(c.parent.name for c in folder.glob(f"*/{CONFIG_FILE}")) if folder.is_dir() else []
        if named:  # PEFT saves adapters other than "default" in subfolders named after them
            raise _refuse(error("ISL-K311", file=_where(source, CONFIG_FILE), names=", ".join(named),
                                folder=f"{folder.name}/{named[0]}"), folder)
        why = "" if folder.is_dir() else " (the folder does not exist)"
        raise _refuse(error("ISL-K201", folder=Path(source).name or source, why=why), folder)
    try:
        raw = read_regular(config_path)
    except ValueError as exc:  # no regular file after all (swapped meanwhile), or far past any config's size
        raise _refuse(exc, folder) from None
    try:
        config = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _refuse(error("ISL-K202", folder=Path(source).name or source, problem=f"not valid JSON ({exc})"),
                      folder) from None
    except RecursionError:
        raise _refuse(error("ISL-K202", folder=Path(source).name or source, problem="not valid JSON (nested too "
                            "deeply to read: a PEFT config is a flat object)"), folder) from None
    if not weights_path.is_file():
        pickled = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
        hint = (f" (found {', '.join(sorted(pickled))}: pickle checkpoints are never loaded, because "
                "unpickling runs code; re-save it with safetensors.torch.save_file)") if pickled else ""
        raise _refuse(error("ISL-K203", folder=Path(source).name or source, found=hint), folder)
    size = weights_path.stat().st_size
    try:
        # The header is parsed and checked against the file's size before any tensor
        # is read; then only the shared-sink factors are read, one tensor at a time.
        # Sorted, as safe_open lists them: normalization reports the first factor that
        # does not split.
        with open_safetensors(weights_path) as f:
            keys = sorted(f.keys())
            shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
            weights = {k: f.get_tensor(k) for k in keys if _is_sink_key(k)}
    except (SafetensorError, ValueError, RuntimeError, OSError) as exc:
        raise _refuse(error("ISL-K204", folder=Path(source).name or source, size=size, reason=exc), folder) from None
    others = {k: _NOT_LOADED for k in keys if k not in weights}
    try:
        return Adapter.from_state(config, {**weights, **others}, source=source, sha256=file_sha256(weights_path),
                                  repair=repair, guess=guess, saved_shapes=shapes)
    except ValueError as exc:
        raise _refuse(exc, folder)


_NOT_LOADED = torch.empty(0, device="meta")
"""Stands for a tensor of another module: ``from_state`` only names those."""


HEADER_LIMIT = 100_000_000
"""safetensors' own limit on a header's declared size (bytes)."""
TEXT_LIMIT = 64 * 2 ** 20
"""The most bytes of a JSON file (a config, an index) the kit reads: real ones are kilobytes."""


def _kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "not a regular file")


def _not_regular(path: str | os.PathLike[str], kind: str) -> ValueError:
    return ValueError(message("ISL-K232", file=Path(path).name or os.fspath(path), kind=kind))


def check_regular(path: str | os.PathLike[str]) -> None:
    """Refuse ``path`` (``ISL-K232``) when it exists (symlinks followed) but is no regular
    file: a FIFO, a device, a socket or a directory. An absent path passes: the caller
    says that in its own words."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return
    if not stat.S_ISREG(mode):
        raise _not_regular(path, _kind(mode))


def open_regular(path: str | os.PathLike[str]) -> int:
    """A read-only file descriptor of ``path`` (symlinks followed), only if it is a regular
    file (else ``ISL-K232``). Opened non-blocking and checked on the descriptor itself, so
    that neither a FIFO nor a name swapped for one after a check can block the read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # what open() says for a socket
            raise _not_regular(path, "a socket") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_regular(path, _kind(mode))
    os.set_blocking(fd, True)
    return fd


def read_regular(path: str | os.PathLike[str], limit: int = TEXT_LIMIT) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (``ISL-K232`` for anything else
    but a regular file; ``ValueError`` naming the file past the limit)."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise ValueError(f"{Path(path).name}: {size} bytes, more than the {limit} a JSON file of this kind can "
                             "need: is it the right file?")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit + 1)[:limit]
    finally:
        os.close(fd)


class HeaderError(ValueError):
    """A safetensors header that cannot describe its file (``check_safetensors_header``)."""


def check_safetensors_header(fd: int, name: str) -> None:
    """Refuse a file whose safetensors header cannot be right, before anything is mapped or
    allocated: its 8-byte length past the file (or past safetensors' 100 MB), a header that
    is no JSON object, tensor data offsets past the file, or data that does not fill it."""
    size = os.fstat(fd).st_size
    if size < 8:
        raise HeaderError(f"{name}: {size} bytes, shorter than the 8-byte header length")
    declared = int.from_bytes(os.pread(fd, 8, 0), "little")
    if declared > min(size - 8, HEADER_LIMIT):
        raise HeaderError(f"{name}: its header declares {declared} bytes, but the file holds {size - 8} after the "
                         f"length (and safetensors reads at most {HEADER_LIMIT})")
    try:
        header = json.loads(os.pread(fd, declared, 8))
    except (ValueError, RecursionError) as exc:
        raise HeaderError(f"{name}: its header is not JSON ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise HeaderError(f"{name}: its header is not a JSON object")
    data, end = size - 8 - declared, 0
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) and 0 <= o <= data for o in offsets)):
            raise HeaderError(f"{name}: tensor {key!r} has data offsets {offsets!r} outside the file's {data} bytes "
                             "of tensor data")
        end = max(end, offsets[1])
    if end != data:
        raise HeaderError(f"{name}: its header describes {end} bytes of tensor data but the file holds {data}")


@contextmanager
def open_safetensors(path: str | os.PathLike[str]) -> Iterator[Any]:
    """``safe_open(path)`` (lazy, per tensor), for a regular file only (``ISL-K232``: a FIFO
    would block forever) whose header checks out against its size first
    (``check_safetensors_header``: nothing is mapped for a damaged or huge sparse file).
    The file is opened once, by Python, and handed over as ``/proc/self/fd/N`` where
    Linux has it: the file checked is the file read, and a path that is not UTF-8 (a
    Linux file name may be any bytes; safetensors takes only UTF-8 paths) works too."""
    name = os.fspath(path)
    fd = open_regular(name)
    try:
        check_safetensors_header(fd, Path(name).name)
        handle = f"/proc/self/fd/{fd}" if os.path.exists(f"/proc/self/fd/{fd}") else name
        with safe_open(handle, framework="pt") as f:
            yield f
    finally:
        os.close(fd)


def _is_sink_key(key: str) -> bool:
    return "shared_experts" in key


def file_sha256(path: str | os.PathLike[str], chunk: int = 2 ** 24) -> str:
    """The sha256 of a file, read in 16 MiB chunks (bounded memory for any size)."""
    h = hashlib.sha256()
    with os.fdopen(open_regular(path), "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def save_adapter(adapter: Adapter, folder: str | os.PathLike[str], *, target_parameters: bool = False) -> Path:
    """Write ``adapter`` as a PEFT folder (config and safetensors, each atomically): its
    shared-sink factors under the kit's names (a ``target_parameters`` export is
    written per expert); other modules' tensors are not part of an ``Adapter``.

    ``target_parameters=True``: as PEFT's ``target_parameters`` export of transformers'
    ``InklingSharedExperts`` instead, for an adapter whose factors are named per expert
    as ``gate_proj``/``up_proj``/``down_proj`` (what PEFT itself writes for such a model,
    without needing PEFT: ``load_adapter`` reads it back to the same factors).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": "LORA", **adapter.config, "r": adapter.r, "lora_alpha": adapter.lora_alpha,
              "target_modules": adapter.target_modules}
    tensors = {k: v.contiguous() for k, v in adapter.weights.items()}
    if target_parameters:
        tensors, targets = _as_target_parameters(adapter)
        config.update(target_modules=[], target_parameters=targets)
    atomic_write(folder / WEIGHTS_FILE, save_safetensors_bytes(tensors))
    atomic_write(folder / CONFIG_FILE, (json.dumps(config, indent=2, sort_keys=True) + "\n").encode())
    return folder


def _as_target_parameters(adapter: Adapter) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Per-expert factors in ``ParamWrapper``'s layout (the inverse of reading one):
    ``lora_A [n*r, in]`` expert blocks stacked, ``lora_B [out, n*r]`` expert columns
    interleaved, one ``base_layer`` more per wrapper inside (gate innermost)."""
    by_module: dict[str, dict[str, dict[str, dict[int, torch.Tensor]]]] = {}
    for key in adapter.factor_keys:
        fn = FactorName.parse(key)
        if fn.expert is None or fn.proj not in TRANSFORMERS_PARAMETERS:
            raise ValueError(f"{key!r}: a target_parameters export holds per-expert gate_proj, up_proj and "
                             "down_proj factors; this adapter's are named otherwise (synthetic_adapter(..., "
                             "per_expert=True) makes such an adapter)")
        by_module.setdefault(fn.module, {}).setdefault(fn.proj, {}).setdefault(fn.ab, {})[fn.expert] = \
            adapter.weights[key]
    tensors, targets = {}, []
    for module, projs in by_module.items():
        present = [p for p in TRANSFORMERS_PARAMETERS if p in projs]
        for depth, proj in enumerate(reversed(present)):  # the last parameter is the outermost wrapper
            a, b = projs[proj]["A"], projs[proj]["B"]
            experts = sorted(a)
            name = module + ".base_layer" * depth
            tensors[f"{name}.lora_A.weight"] = torch.cat([a[e] for e in experts]).contiguous()
            tensors[f"{name}.lora_B.weight"] = torch.stack([b[e] for e in experts], dim=-1).flatten(1).contiguous()
        targets += [f"mlp.shared_experts.{p}" for p in present if f"mlp.shared_experts.{p}" not in targets]
    return tensors, targets


NAMINGS = {
    "gate_up": ("gate_proj", "up_proj", "down_proj"),
    "fused": ("gate_up_proj", None, "down_proj"),
    "w": ("w1", "w3", "w2"),
}
"""The three ways to name the sink's projections (docs/reference.md#adapters-on-disk): gate and up apart,
fused, or ``w1``/``w3``/``w2``."""


def synthetic_adapter(n: int, hidden: int, intermediate: int, rank: int, *, naming: str = "gate_up",
                      per_expert: bool = False, lora_alpha: float | None = None, layers: tuple[int, ...] = (0,),
                      seed: int = 0, dtype: torch.dtype = torch.float32, name: str = "") -> Adapter:
    """A seeded PEFT adapter for an ``n``-expert sink of ``H=hidden``, ``F=intermediate``.

    ``naming``: ``"gate_up"``, ``"fused"`` or ``"w"`` (``NAMINGS``). ``per_expert``:
    every factor named per expert (``shared_experts.<e>.<proj>``, the per-expert
    outer layout) instead of flat (shared outer). B is not zero (unlike at PEFT's
    init), so that the delta is visible.
    """
    if naming not in NAMINGS:
        raise ValueError(f"naming must be one of {sorted(NAMINGS)}, got {naming!r}")
    gen = torch.Generator().manual_seed(seed)
    gate, up, down = NAMINGS[naming]
    fused = up is None

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=gen) / max(shape[-1], 1) ** 0.5).to(dtype)

    experts = range(n) if per_expert else [None]
    k = 1 if per_expert else n  # experts inside one flat inner factor
    weights: dict[str, torch.Tensor] = {}
    for layer in layers:
        module = f"base_model.model.model.layers.{layer}.mlp.shared_experts"
        for e in experts:
            def put(proj: str, a: torch.Tensor, b: torch.Tensor) -> None:
                weights[FactorName(module, e, proj, "A").key] = a
                weights[FactorName(module, e, proj, "B").key] = b

            rows = 2 * intermediate if fused else intermediate
            put(gate, rnd(rank, hidden), rnd(k * rows, rank))
            if not fused:
                put(up, rnd(rank, hidden), rnd(k * intermediate, rank))
            put(down, rnd(rank, k * intermediate), rnd(hidden, rank))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "inkling-toy",
              "r": rank, "lora_alpha": float(2 * rank if lora_alpha is None else lora_alpha),
              "lora_dropout": 0.0, "bias": "none", "use_rslora": False,
              "target_modules": [p for p in (gate, up, down) if p is not None]}
    return Adapter.from_state(config, weights, name=name or f"{naming}{'_per_expert' if per_expert else ''}")
