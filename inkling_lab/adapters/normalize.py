"""Upstream's normalization of shared-sink factors (docs/reference.md#adapters-on-disk), step for step, and
the gathering of one module's factors with their expert axis."""
from __future__ import annotations

import re
from typing import Mapping

import torch

from ..catalog import error
from .names import FactorName, RENAMES


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
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:  # upstream reshapes only for n > 0 (a sink)
        raise ValueError(f"normalize_shared_sink: n_shared_experts must be a whole number of at least 1 (the "
                         f"model's n_shared_experts; a model without shared experts has no sink), got {n!r}")
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


def normalize_qkv_proj(weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Upstream's ``LoRAAdapter.normalize_qkv_proj`` (lora.py), the first step of its
    ``_normalize_weights``, on one layer's weights: each name holding ``q_proj`` is stacked
    with its ``k_proj`` (zeros shaped like its ``v_proj`` when no name of the layer holds
    ``k_proj``) and ``v_proj`` along axis 0 into ``qkv_proj`` (a new key at the end; the
    three are dropped); a ``qkv_proj`` A is repeated three times along its rows. A missing
    partner is upstream's own ``KeyError``, a shape that does not stack torch's
    ``RuntimeError``. Names holding none of these pass through in their order."""
    out = dict(weights)
    names = list(out)
    present = {part for name in names for part in ("k_proj", "q_proj", "v_proj", "qkv_proj") if part in name}
    if not present:
        return out
    for name in names:
        if "q_proj" in name:
            k, v, qkv = (name.replace("q_proj", part) for part in ("k_proj", "v_proj", "qkv_proj"))
            k_weight = out[k] if "k_proj" in present else torch.zeros_like(out[v])
            out[qkv] = torch.cat((out[name], k_weight, out[v]), 0)
            out.pop(name)
            if "k_proj" in present:
                out.pop(k)
            out.pop(v)
        elif "qkv_proj" in name and "lora_A" in name:
            out[name] = out[name].repeat(3, 1)
    return out


def normalize_inkling_qkvr_proj(weights: Mapping[str, torch.Tensor], names: list[str], r: int
                                ) -> dict[str, torch.Tensor]:
    """Upstream's ``LoRAAdapter.normalize_inkling_qkvr_proj`` (lora.py), the second step of
    its ``_normalize_weights``: each of ``names`` (the layer's names as they were *before*
    ``normalize_qkv_proj``, as upstream passes them) holding ``wq_du`` whose ``wk_dv``,
    ``wv_dv`` and ``wr_du`` partners are all there is stacked with them, in that order, along
    its ``dim() - 2`` axis into ``qkvr`` (a new key at the end; the four dropped); then every
    ``qkvr`` A whose rank axis (``shape[-2]``) is the config's ``r`` is repeated four times
    along it. Torch's own errors (and ``IndexError`` for a 1D A) as upstream's."""
    out = dict(weights)
    for name in names:
        if "wq_du" not in name:
            continue
        k, v, rr, qkvr = (name.replace("wq_du", part) for part in ("wk_dv", "wv_dv", "wr_du", "qkvr"))
        if any(part not in out for part in (k, v, rr)):
            continue
        out[qkvr] = torch.cat((out[name], out[k], out[v], out[rr]), out[name].dim() - 2)
        for part in (name, k, v, rr):
            out.pop(part)
    for name in list(out):
        if "qkvr" not in name or "lora_A" not in name or out[name].shape[-2] != r:
            continue
        repeat = [1] * out[name].dim()
        repeat[-2] = 4
        out[name] = out[name].repeat(*repeat)
    return out


def normalize_layer(weights: Mapping[str, torch.Tensor], n_shared_experts: int, r: int) -> dict[str, torch.Tensor]:
    """Upstream's ``LoRAAdapter._normalize_weights`` for one layer of an Inkling adapter of
    rank ``r`` (the config's), as far as the kit models it: ``normalize_qkv_proj``,
    ``normalize_inkling_qkvr_proj``, then the shared sink's steps (``normalize_shared_sink``:
    its reshape, the ``w`` renames and the gate/up stacking, which upstream applies to every
    name of the layer). The steps in between that act on other names (Mamba's ``in_proj``,
    GDN's ``in_proj_qkvz``, MLA's ``fused_qkv_a_proj_with_mqa``) are not modelled: the caller
    keeps such names away."""
    names = list(weights)
    return normalize_shared_sink(normalize_inkling_qkvr_proj(normalize_qkv_proj(weights), names, r), n_shared_experts)
