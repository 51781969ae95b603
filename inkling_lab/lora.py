"""The shared sink with LoRA: ``set_lora_info``, derived operands, slot refresh and
tensor-parallel slicing (SPEC §3, §4, §7)."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .batch import SlotBatch
from .forward import run_forward
from .operands import SinkOperands
from .sink import SharedSink, gate_up_rows
from .validate import PoolLayout, validate_pool

INELIGIBLE = "InklingBatchDenseMLPWithLoRA is ineligible: "
PROBLEM_BACKEND = "multi-slot dense LoRA requires the Triton backend"
PROBLEM_WEIGHTS = "the shared sink does not use linearized BF16 weights"

_GATE_UP = ("gate_up_proj", "gate_up_proj_moe")
_DOWN = ("down_proj", "down_proj_moe")


@dataclass(frozen=True)
class LoRABackend:
    """The serving backend as the module sees it: its name and the batch's slot count."""

    name: str = "triton"
    max_loras_per_batch: int = 1


def derive_operands(gate_up_b: torch.Tensor, down_a: torch.Tensor, interleaved: bool
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The shared-outer operands (SPEC §4), built from the pool's inner factors.

    ``gate_up_b [S, n, 2F, R]`` -> ``w1_delta [S, n*2F, 2R]``: maps the ``2R`` shrink
    output onto the base ``y`` layout (gate B in the gate rows' first ``R`` columns,
    up B in the up rows' last ``R``). ``down_a [S, n, R, F]`` -> ``a_cat [S, R, n*F]``:
    down A of all experts side by side. Slots are those of ``gate_up_b``.
    """
    S, n, two_f, R = gate_up_b.shape
    F = two_f // 2
    halves = gate_up_b.reshape(S, n, 2, F, R)  # an odd 2F fails here, as upstream's does
    w1 = gate_up_b.new_zeros(S, n, two_f, 2 * R)
    gate_rows, up_rows = gate_up_rows(F, interleaved, gate_up_b.device)
    w1[:, :, gate_rows, :R] = halves[:, :, 0]
    w1[:, :, up_rows, R:] = halves[:, :, 1]
    a_cat = down_a.new_empty(S, R, n * down_a.shape[-1])
    for s in range(S):  # indexes down A by gate-up B's slots: fewer slots is an IndexError
        a_cat[s] = down_a[s].transpose(0, 1).reshape(R, -1)
    return w1.reshape(S, n * two_f, 2 * R), a_cat


class SharedSinkLoRA(SharedSink):
    """The shared sink with a multi-slot LoRA pool attached.

    ``set_lora_info(gate_up_a [S, O, 2R, H], gate_up_b [S, n, 2F, R], down_a [S, n, R, F],
    down_b [S, O, H, R])`` validates (upstream's errors), adopts the buffers and, for the
    shared outer layout, builds ``w1_delta [S, n*2F, 2R]`` and ``a_cat [S, R, n*F]`` once:
    later calls and slot refreshes copy into the same storage (CUDA graphs replay
    against it). ``forward(x, gammas, batch=..., backend=...)`` runs base plus LoRA.
    """

    def __init__(self, n_shared_experts: int, hidden_size: int, intermediate_size: int,
                 interleaved: bool = True, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, seed: int = 0) -> None:
        super().__init__(n_shared_experts, hidden_size, intermediate_size, interleaved, dtype, device, seed)
        self.backend: LoRABackend | None = None
        self.generation = "v1"
        self.lora_buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.layout: PoolLayout | None = None
        self.w1_delta: torch.Tensor | None = None
        self.a_cat: torch.Tensor | None = None

    # -- eligibility -------------------------------------------------------------------
    @property
    def linearized_bf16(self) -> bool:
        """Upstream's first wrapper linearizes only an interleaved bf16 sink."""
        return self.interleaved and self.dtype == torch.bfloat16

    def initialize_lora(self, backend: LoRABackend, generation: str = "v1") -> None:
        """Upstream's eligibility check for the multi-slot dense LoRA wrapper.

        ``generation="v1"`` (``InklingBatchDenseMLPWithLoRA``) needs Triton for more
        than one slot and an interleaved bf16 sink. ``"v2"`` (the dense engine) takes
        any base and words its pool validation as one message (``ISL-E006``).
        """
        if generation not in ("v1", "v2"):
            raise ValueError(f"generation must be 'v1' or 'v2', got {generation!r}")
        if generation == "v1":
            problems = []
            if backend.max_loras_per_batch > 1 and backend.name != "triton":
                problems.append(PROBLEM_BACKEND)
            if not self.linearized_bf16:
                problems.append(PROBLEM_WEIGHTS)
            if problems:
                raise ValueError(INELIGIBLE + "; ".join(problems))
        self.backend, self.generation = backend, generation

    # -- the pool ----------------------------------------------------------------------
    @property
    def shared_outer(self) -> bool:
        return self.layout is not None and self.layout.shared_outer

    def set_lora_info(self, gate_up_a: torch.Tensor, gate_up_b: torch.Tensor, down_a: torch.Tensor,
                      down_b: torch.Tensor) -> PoolLayout:
        """Validate and adopt the four pool buffers; build the shared-outer operands.

        Raises upstream's ``ValueError``s (SPEC §3), the raw torch error upstream gives
        for an odd 2F or too few down-A slots, and ``RuntimeError`` when a second
        shared-outer call would change the derived operands' shapes. Unlike upstream,
        a failed call leaves the module exactly as it was.
        """
        layout = validate_pool(gate_up_a, gate_up_b, down_a, down_b, n_shared_experts=self.n_shared_experts,
                               generation=self.generation)
        buffers = (gate_up_a, gate_up_b, down_a, down_b)
        if not layout.shared_outer:
            self.lora_buffers, self.layout = buffers, layout
            self.w1_delta = self.a_cat = None  # a later shared-outer call starts afresh
            return layout
        w1, a_cat = derive_operands(gate_up_b, down_a, self.interleaved)
        if self.w1_delta is not None and self.a_cat is not None:
            old = (tuple(self.w1_delta.shape), tuple(self.a_cat.shape))
            new = (tuple(w1.shape), tuple(a_cat.shape))
            if old != new:
                raise RuntimeError(
                    "Shared-sink LoRA pool shape changed after initialization: "
                    f"gate-up {old[0]} -> {new[0]}, down-A {old[1]} -> {new[1]}")
            with torch.no_grad():
                self.w1_delta.copy_(w1)
                self.a_cat.copy_(a_cat)
        else:
            self.w1_delta, self.a_cat = w1, a_cat
        self.lora_buffers, self.layout = buffers, layout
        return layout

    def on_lora_slots_updated(self, slot_ids) -> None:
        """Re-derive the operands of the given slots after the pool changed them in place.

        Shared outer: every id must be a slot (else ``IndexError`` listing every
        requested id, sorted). Per-expert pools, and a module with no pool yet, have
        nothing derived and accept any ids, as upstream does.
        """
        if not self.shared_outer or self.w1_delta is None or self.a_cat is None or self.lora_buffers is None:
            return
        ids = sorted({int(s) for s in slot_ids})
        S = self.w1_delta.shape[0]
        if any(not 0 <= s < S for s in ids):
            raise IndexError(f"Shared-sink LoRA slot out of range: {ids}")
        _, gb, da, _ = self.lora_buffers
        with torch.no_grad():
            for s in ids:
                w1, a_cat = derive_operands(gb[s:s + 1], da[s:s + 1], self.interleaved)
                self.w1_delta[s].copy_(w1[0])
                self.a_cat[s].copy_(a_cat[0])

    # -- tensor parallelism (SPEC §7) --------------------------------------------------
    def _check_tp(self, tp_rank: int, tp_size: int) -> None:
        if tp_size < 1 or not 0 <= tp_rank < tp_size:
            raise ValueError(
                f"tp_rank {tp_rank} is outside the tensor-parallel group of size {tp_size}: "
                f"use a rank in 0..{tp_size - 1}")

    @staticmethod
    def _kind(target_module: str) -> str:
        if target_module in _GATE_UP:
            return "gate_up"
        if target_module in _DOWN:
            return "down"
        raise ValueError(f"target_module must be one of {_GATE_UP + _DOWN} for the shared sink, "
                         f"got {target_module!r}")

    @staticmethod
    def _shard_bounds(features: int, tp_rank: int, tp_size: int, what: str) -> tuple[int, int]:
        if features % tp_size:
            raise ValueError(f"{what}: intermediate size {features} is not divisible by tp_size={tp_size}")
        width = features // tp_size
        return tp_rank * width, (tp_rank + 1) * width

    def slice_lora_a(self, weights: torch.Tensor, tp_rank: int, target_module: str, tp_size: int
                     ) -> torch.Tensor:
        """This rank's share of a LoRA A factor.

        gate/up A ``[.., 2r, H]`` is replicated. down A, flat ``[r, n*F]`` or per expert
        ``[.., n, r, F]``, is cut along F: flat input first becomes ``[n, r, F]``.
        """
        self._check_tp(tp_rank, tp_size)
        if self._kind(target_module) == "gate_up":
            return weights
        n = self.n_shared_experts
        if weights.dim() == 2:
            width = weights.shape[1]
            if width % n:
                raise ValueError(f"Shared-sink down LoRA-A width must be divisible by {n}, got {width}")
            weights = weights.reshape(weights.shape[0], n, width // n).transpose(0, 1)
        lo, hi = self._shard_bounds(weights.shape[-1], tp_rank, tp_size, "down LoRA-A")
        return weights[..., lo:hi].contiguous()

    def slice_lora_b(self, weights: torch.Tensor, tp_rank: int, target_module: str, tp_size: int
                     ) -> torch.Tensor:
        """This rank's share of a LoRA B factor.

        down B ``[.., H, r]`` is replicated. gate/up B, flat ``[n*2F, r]`` or per expert
        ``[.., n, 2F, r]``, keeps this rank's slice of the gate half and the same slice
        of the up half.
        """
        self._check_tp(tp_rank, tp_size)
        if self._kind(target_module) == "down":
            return weights
        n = self.n_shared_experts
        if weights.dim() == 2:
            height = weights.shape[0]
            if height % n:
                raise ValueError(f"Shared-sink gate/up LoRA-B height must be divisible by {n}, got {height}")
            weights = weights.reshape(n, height // n, weights.shape[1])
        F = weights.shape[-2] // 2
        lo, hi = self._shard_bounds(F, tp_rank, tp_size, "gate/up LoRA-B")
        return torch.cat([weights[..., lo:hi, :], weights[..., F + lo:F + hi, :]], dim=-2).contiguous()

    # -- forward -----------------------------------------------------------------------
    def operands(self) -> SinkOperands:
        """What a forward backend reads: the weights and their linearized views, the
        layout, the adopted pool buffers and derived operands (``None`` where absent).

        The record holds the module's own tensors (no copies): a slot refresh, which
        writes in place, shows through it; after ``set_lora_info`` ask for a new one.
        """
        w13_lin, w2_lin = self.linearized()
        return SinkOperands(w13=self.w13.detach(), w2=self.w2.detach(), w13_lin=w13_lin, w2_lin=w2_lin,
                            interleaved=self.interleaved, buffers=self.lora_buffers,
                            w1_delta=self.w1_delta, a_cat=self.a_cat)

    def operands_for(self, gate_up_a: torch.Tensor, gate_up_b: torch.Tensor, down_a: torch.Tensor,
                     down_b: torch.Tensor) -> SinkOperands:
        """The operands of this sink's weights with another pool, validated and derived
        as ``set_lora_info`` would, but adopted nowhere: the module is left as it is.

        For a forward over buffers the module should not keep (what sglang 0.5.23
        computes, a benchmark pool of another rank on the same weights).
        """
        layout = validate_pool(gate_up_a, gate_up_b, down_a, down_b, n_shared_experts=self.n_shared_experts,
                               generation=self.generation)
        w1, a_cat = derive_operands(gate_up_b, down_a, self.interleaved) if layout.shared_outer else (None, None)
        return replace(self.operands(), buffers=(gate_up_a, gate_up_b, down_a, down_b), w1_delta=w1, a_cat=a_cat)

    def forward(self, x: torch.Tensor, gammas: torch.Tensor, batch: SlotBatch | None = None,
                backend: str = "auto") -> torch.Tensor:
        """``x [T, H]`` (or ``[B, L, H]``), ``gammas [T, n]``, a ``SlotBatch`` naming each
        token's slot -> ``out`` like ``x``. No batch or no pool: the base sink."""
        return run_forward(self.operands(), x, gammas, batch, backend)
