"""``Adapter``: one PEFT LoRA adapter, its config and its shared-sink factors, checked, repaired where the
intent is plain, normalized into one ``LoRAFactors`` per module."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import torch

from ..catalog import Finding, error, finding, repair_note
from ..pool import LoRAFactors
from .names import CONFIG_FILE, FactorName, PROJECTIONS, WEIGHTS_FILE, _NESTED_KEY, _shape, _where, module_of
from .config import PeftConfig, _refuse_unrepresentable, read_peft_config
from .checks import (_check_dtypes, _check_duplicates, _check_finite, _check_one_gate_up_form, _check_one_shape,
                     _check_pairs, _unknown_name)
from .normalize import _gather, _one_gate_up_rank, _one_rank, normalize_shared_sink
from .target_parameters import _split_target_parameters, peft_target_parameter_keys


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
    """The file's keys of a PEFT ``target_parameters`` export (sglang matches no target module to them), read
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
        if t.numel() == 0:  # any other empty factor: torch's cat or stack would fail later, naming nothing
            raise error("ISL-K234", file=where, key=fn.key, shape=_shape(t), expected=fn.expected())
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
            self.findings.append(repair_note("ISL-K206", fn.key, key=fn.key, shape=_shape(t), transposed=_shape(t.T),
                                             expected=fn.expected(), said=said))
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
        self.findings.append(repair_note("ISL-K310", where, file=where, r=self.r, k=ranks[0],
                                         alpha=f"{self.lora_alpha:g}", config=CONFIG_FILE,
                                         rslora=" under sqrt" if self.peft.use_rslora else ""))
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
        self.findings.append(repair_note("ISL-K309", fn.key, key=fn.key, shape=_shape(t), reshape=fix,
                                         flat=[r, n * cols], r=r, last=r - 1))
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
            self._note(repair_note("ISL-K211", module, module=module))

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
        self._note(repair_note("ISL-K212", module, module=module, per_expert=per, shared=shared, n=n))
        return ga.expand(n, -1, -1).contiguous(), db.expand(n, -1, -1).contiguous()


def is_target_parameters_export(adapter: "Adapter | Iterable[str]") -> bool:
    """True when ``adapter`` (an ``Adapter``, or the key names of a weights file) holds
    its shared-sink factors as a PEFT ``target_parameters`` export (sglang matches no target module to them)."""
    if isinstance(adapter, Adapter):
        return bool(adapter.target_parameter_keys)
    return bool(peft_target_parameter_keys(adapter))
