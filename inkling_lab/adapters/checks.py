"""The checks of an adapter's factors before normalization, each refusal from its catalog entry."""
from __future__ import annotations

import difflib
from typing import Mapping

import torch

from ..catalog import error, message
from ..geometry import WORKING_DTYPES
from .names import FactorName, PROJECTIONS, _shape


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
