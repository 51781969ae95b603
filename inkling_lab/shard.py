"""Tensor-parallel slicing of the shared sink (docs/reference.md#tensor-parallelism): pure functions on tensors.

With ``tp`` ranks each rank holds ``F/tp`` of every expert's intermediate features.
``slice_lora_a``/``slice_lora_b`` are upstream's ``slice_moe_lora_a_weights`` and
``slice_moe_lora_b_weights`` (sglang 0.5.23, ``srt/models/inkling_common/lora.py``,
shared by both wrapper generations) without a module: the same shapes, dtypes, values
and errors for a tensor or a per-expert dict ``{expert_id: tensor}``, plus one refusal
upstream lacks (a ``tp_rank`` outside the group, ``ISL-K101``). ``shard_w13``,
``shard_w2`` and ``shard_pool`` cut the base weights and the four pool buffers the
same way, so every shard of a rank comes from one cut.

Upstream cuts at multiples of its module's ``F/tp``, whatever the factor holds. Give
the module's full per-expert ``F`` as ``intermediate_size`` to cut exactly there; by
default ``F`` is read off the factor (the same cut whenever the factor fits the
module). A ``tp`` that does not split ``F`` is refused (``ISL-K102``: upstream cannot
build such a module).
"""
from __future__ import annotations

from typing import Callable, Union

import torch

from .catalog import CATALOG
from .geometry import check_tp  # re-exported: the cuts' one divisibility check
from .pool import LoRAFactors

Factor = Union[torch.Tensor, dict[int, torch.Tensor]]

GATE_UP = "gate_up_proj_moe"
DOWN = "down_proj_moe"
TARGET_MODULES = {"gate_up_proj": GATE_UP, GATE_UP: GATE_UP, "down_proj": DOWN, DOWN: DOWN}
"""The names the kit accepts for ``target_module`` and upstream's name for each (the
plain projection names are the kit's shorthand)."""

# Upstream's words (sglang 0.5.23), then the kit's own refusals.
MSG_DOWN_A_WIDTH = CATALOG["ISL-E010"].message  # {n} {width}
MSG_GATE_UP_B_HEIGHT = CATALOG["ISL-E011"].message  # {n} {height}
MSG_TP_RANK = CATALOG["ISL-K101"].message  # {tp_rank} {tp_size} {last}
MSG_TARGET = "target_module must be one of {names} for the shared sink, got {target_module}"


def target_module_name(target_module: str) -> str:
    """Upstream's name (``gate_up_proj_moe`` or ``down_proj_moe``) for a kit name.

    Upstream treats every name but the one it tests for as the other factor; the kit
    refuses a name that is neither.
    """
    try:
        return TARGET_MODULES[target_module]
    except (KeyError, TypeError):
        raise ValueError(MSG_TARGET.format(names=tuple(TARGET_MODULES), target_module=repr(target_module))) from None


def check_rank(tp_rank: int, tp_size: int) -> None:
    """Refuse a ``tp_rank`` outside ``0..tp_size-1`` (``ISL-K101``): upstream would cut
    an empty or misplaced slice and serve a silently wrong delta."""
    if not 0 <= tp_rank < tp_size:
        raise ValueError(MSG_TP_RANK.format(tp_rank=tp_rank, tp_size=tp_size, last=tp_size - 1))


def rank_features(intermediate: int, tp_rank: int, tp_size: int) -> torch.Tensor:
    """``[F/tp]``: the intermediate feature numbers (of every expert) ``tp_rank`` holds."""
    check_rank(tp_rank, tp_size)
    width = check_tp(intermediate, tp_size)
    return torch.arange(tp_rank * width, (tp_rank + 1) * width)


# -- the two cuts: every shard of a rank is one of these -------------------------------
def cut_features(weights: torch.Tensor, tp_rank: int, tp_size: int, what: str = "down LoRA-A",
                 intermediate_size: int | None = None) -> torch.Tensor:
    """``[..., F] -> [..., F/tp]``: the rank's block of the last axis (down A, ``w2``);
    ``F`` is ``intermediate_size`` if given, else the last axis."""
    F = weights.shape[-1] if intermediate_size is None else intermediate_size
    width = check_tp(F, tp_size, what)
    start = tp_rank * width
    return weights[..., start:start + width].contiguous()


def cut_gate_up(weights: torch.Tensor, tp_rank: int, tp_size: int, what: str = "gate/up LoRA-B",
                intermediate_size: int | None = None) -> torch.Tensor:
    """``[2F, ...] -> [2F/tp, ...]``, rows in ``[gate ‖ up]`` order: the rank's block of
    the gate half, then the same block of the up half (upstream's per-expert cut). The
    up half starts at row ``2F // 2`` of the factor; the block width is
    ``intermediate_size / tp`` if given, else ``(2F // 2) / tp``."""
    half = weights.shape[0] // 2
    width = check_tp(half if intermediate_size is None else intermediate_size, tp_size, what)
    start = tp_rank * width
    gate, up = weights[start:start + width], weights[half + start:half + start + width]
    return torch.cat([gate, up], dim=0).contiguous()


# -- upstream's slicing of adapter factors ------------------------------------------------
def split_down_a(weights: torch.Tensor, n_shared_experts: int) -> torch.Tensor:
    """A flat down A ``[r, n*F]`` (experts side by side) -> ``[n, r, F]``."""
    rank, width = weights.shape
    if width % n_shared_experts:
        raise ValueError(MSG_DOWN_A_WIDTH.format(n=n_shared_experts, width=width))
    return weights.view(rank, n_shared_experts, width // n_shared_experts).transpose(0, 1).contiguous()


def split_gate_up_b(weights: torch.Tensor, n_shared_experts: int) -> torch.Tensor:
    """A flat gate/up B ``[n*2F, r]`` (experts stacked) -> ``[n, 2F, r]`` (a view)."""
    height, rank = weights.shape
    if height % n_shared_experts:
        raise ValueError(MSG_GATE_UP_B_HEIGHT.format(n=n_shared_experts, height=height))
    return weights.view(n_shared_experts, height // n_shared_experts, rank)


def _with_expert_axis(weights: Factor, tp_rank: int, target_module: str, tp_size: int, n_shared_experts: int,
                      cut_module: str, split: Callable[[torch.Tensor, int], torch.Tensor]) -> tuple[Factor, bool]:
    """Both slicers' first step: check the rank, give a 2D factor its expert axis (the
    factor this slicer cuts is ``split`` into ``n`` experts, the other one gets a leading
    axis of 1), and say whether this rank cuts it (``cut_module`` at ``tp_size > 1``)."""
    check_rank(tp_rank, tp_size)
    module = target_module_name(target_module)
    if isinstance(weights, torch.Tensor) and weights.dim() == 2:
        weights = split(weights, n_shared_experts) if module == cut_module else weights.unsqueeze(0)
    return weights, tp_size > 1 and module == cut_module


def slice_lora_a(weights: Factor, tp_rank: int, target_module: str, tp_size: int,
                 n_shared_experts: int, intermediate_size: int | None = None) -> Factor:
    """Rank ``tp_rank``'s share of a LoRA A factor (upstream's ``slice_moe_lora_a_weights``).

    A 2D tensor first gets its expert axis: gate/up A ``[r, H] -> [1, r, H]``, down A
    ``[r, n*F] -> [n, r, F]`` (``ISL-E010`` when ``n*F`` does not split). Gate/up A, and
    everything at ``tp_size=1``, is then returned as it stands (a 3D tensor or a dict
    is the very object given). Down A is cut along its last axis to ``[..., F/tp]``;
    a dict is cut expert by expert and stays a dict. ``intermediate_size``: the
    module's full per-expert ``F`` (default: the factor's).
    """
    weights, cuts = _with_expert_axis(weights, tp_rank, target_module, tp_size, n_shared_experts,
                                      DOWN, split_down_a)
    if not cuts:
        return weights
    if isinstance(weights, dict):
        return {expert: cut_features(w, tp_rank, tp_size, intermediate_size=intermediate_size)
                for expert, w in weights.items()}
    return cut_features(weights, tp_rank, tp_size, intermediate_size=intermediate_size)


def slice_lora_b(weights: Factor, tp_rank: int, target_module: str, tp_size: int,
                 n_shared_experts: int, intermediate_size: int | None = None) -> Factor:
    """Rank ``tp_rank``'s share of a LoRA B factor (upstream's ``slice_moe_lora_b_weights``).

    A 2D tensor first gets its expert axis: down B ``[H, r] -> [1, H, r]``, gate/up B
    ``[n*2F, r] -> [n, 2F, r]`` (``ISL-E011`` when ``n*2F`` does not split). Down B, and
    everything at ``tp_size=1``, is then returned as it stands. Gate/up B keeps the
    rank's rows of its gate half and the same rows of its up half: a dict expert by
    expert (it stays a dict), a 3D tensor expert by expert, stacked again, and any
    other tensor along its first axis, as upstream cuts it. ``intermediate_size``: the
    module's full per-expert ``F`` (default: each expert's rows // 2).
    """
    weights, cuts = _with_expert_axis(weights, tp_rank, target_module, tp_size, n_shared_experts,
                                      GATE_UP, split_gate_up_b)
    if not cuts:
        return weights

    def cut(w: torch.Tensor) -> torch.Tensor:
        return cut_gate_up(w, tp_rank, tp_size, intermediate_size=intermediate_size)

    if isinstance(weights, dict):
        return {expert: cut(w) for expert, w in weights.items()}
    if weights.dim() == 3:  # no experts: torch.stack's own error, as upstream's
        return torch.stack([cut(w) for w in weights])
    return cut(weights)


# -- the base weights and the pool ------------------------------------------------------------
def shard_w13(w13: torch.Tensor, tp_rank: int, tp_size: int, interleaved: bool) -> torch.Tensor:
    """``w13 [n, 2F, H] -> [n, 2F/tp, H]``: the gate and up rows of the rank's features,
    kept in the sink's layout. Interleaved, those rows are one block of gate/up pairs;
    contiguous (``[gate ‖ up]``), two blocks, cut exactly like gate/up B."""
    check_rank(tp_rank, tp_size)
    if interleaved:
        width = 2 * check_tp(w13.shape[1] // 2, tp_size, "w13")
        return w13[:, tp_rank * width:(tp_rank + 1) * width].contiguous()
    return cut_gate_up(w13.transpose(0, 1), tp_rank, tp_size, "w13").transpose(0, 1).contiguous()


def shard_w2(w2: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """``w2 [n, H, F] -> [n, H, F/tp]``: cut along F, like down A."""
    check_rank(tp_rank, tp_size)
    return cut_features(w2, tp_rank, tp_size, "w2")


def shard_pool(gate_up_a: torch.Tensor, gate_up_b: torch.Tensor, down_a: torch.Tensor, down_b: torch.Tensor,
               tp_rank: int, tp_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rank's share of the four pool buffers.

    Gate-up A ``[S, O, 2R, H]`` and down B ``[S, O, H, R]`` are replicated (returned as
    given), gate-up B ``[S, n, 2F, R] -> [S, n, 2F/tp, R]`` keeps the rank's slice of
    each half, down A ``[S, n, R, F] -> [S, n, R, F/tp]`` is cut along F (at ``tp=1``
    it may share storage with the input: copy before writing). Upstream slices adapter
    factors before they are loaded; this is the same cut of loaded buffers.
    """
    check_rank(tp_rank, tp_size)
    rows_first = gate_up_b.permute(2, 0, 1, 3)  # the 2F rows to the front, where cut_gate_up cuts
    gate_up_b = cut_gate_up(rows_first, tp_rank, tp_size).permute(1, 2, 0, 3).contiguous()
    return gate_up_a, gate_up_b, cut_features(down_a, tp_rank, tp_size), down_b


def shard_factors(f: LoRAFactors, tp_rank: int, tp_size: int, n: int) -> LoRAFactors:
    """Tensor-parallel rank ``tp_rank``'s share (docs/reference.md#tensor-parallelism), upstream's slicing: down A
    cut along F, gate/up B to this rank's slice of each half, outer replicated."""
    return LoRAFactors(
        slice_lora_a(f.gate_up_a, tp_rank, "gate_up_proj", tp_size, n),
        slice_lora_b(f.gate_up_b, tp_rank, "gate_up_proj", tp_size, n),
        slice_lora_a(f.down_a, tp_rank, "down_proj", tp_size, n),
        slice_lora_b(f.down_b, tp_rank, "down_proj", tp_size, n),
        lora_alpha=f.lora_alpha, name=f.name)
