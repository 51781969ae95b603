"""PEFT ``target_parameters`` exports of transformers' ``InklingSharedExperts``: read as the per-expert
factors they are (``ISL-N204``), and written back."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch

from ..catalog import CATALOG, Finding, error, finding, message
from .names import FactorName, TRANSFORMERS_PARAMETERS, _NESTED_KEY, _shape, module_of
from .config import PeftConfig


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
    the name. sglang 0.5.23 matches none of them to a target module: its buffer load warns, then fails on them
    (docs/reference.md#peft-features). Works on names only: pass ``safe_open(...).keys()`` or ``adapter.weights``.
    """
    return [k for k in keys if _NESTED_KEY.match(k)]


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
        notes.append(finding("ISL-N204", module, consequence=CATALOG["ISL-N204"].upstream, module=module,
                             parameters=", ".join(params), n=n, r=str(r) if len(set(ranks.values())) == 1
                             else ", ".join(f"{k} {v}" for k, v in ranks.items())))
    return out, [k for k in weights if _NESTED_KEY.match(k)], notes


def _as_target_parameters(weights: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """An adapter's per-expert factors (``weights``: its shared-sink factors by key) in
    ``ParamWrapper``'s layout (the inverse of reading one):
    ``lora_A [n*r, in]`` expert blocks stacked, ``lora_B [out, n*r]`` expert columns
    interleaved, one ``base_layer`` more per wrapper inside (gate innermost)."""
    by_module: dict[str, dict[str, dict[str, dict[int, torch.Tensor]]]] = {}
    for key in weights:
        fn = FactorName.parse(key)
        if fn is None:
            continue
        if fn.expert is None or fn.proj not in TRANSFORMERS_PARAMETERS:
            raise ValueError(f"{key!r}: a target_parameters export holds per-expert gate_proj, up_proj and "
                             "down_proj factors; this adapter's are named otherwise (synthetic_adapter(..., "
                             "per_expert=True) makes such an adapter)")
        by_module.setdefault(fn.module, {}).setdefault(fn.proj, {}).setdefault(fn.ab, {})[fn.expert] = weights[key]
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
