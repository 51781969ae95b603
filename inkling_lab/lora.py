"""The shared sink with LoRA: ``initialize_lora``, ``set_lora_info``, derived operands and
slot refresh, as either upstream wrapper generation does them (docs/reference.md#validation-order, #the-forward); its
tensor-parallel slicing is ``shard.py``'s (§7)."""
from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import torch

from . import shard
from .batch import SlotBatch
from .forward import StaticIO, check_out, run_forward, static_io
from .merged import check_keep, kept_merge, remerge
from .operands import KeptMerge, SinkOperands
from .shard import Factor
from .catalog import error
from .sink import SharedSink
from .validate import (MSG_INELIGIBLE, MSG_POOL_SHAPE, MSG_SLOT_RANGE, MSG_V2_INTERLEAVED, MSG_V2_NO_ENGINE,
                       MSG_V2_NOT_BF16, MSG_V2_POOL_SHAPE, PROBLEM_BACKEND, PROBLEM_WEIGHTS, V2_CLASS,
                       PoolLayout, check_generation, validate_pool)


@dataclass(frozen=True)
class LoRABackend:
    """The serving backend as the module sees it: its name and the batch's slot count.

    Only ``triton_v2`` carries the dense engine (upstream: a ``runner``) that the
    second wrapper generation needs.
    """

    name: str = "triton"
    max_loras_per_batch: int = 1

    @property
    def dense_engine(self) -> bool:
        return self.name == "triton_v2"


def _write_slots(w1_delta: torch.Tensor, a_cat: torch.Tensor, gate_up_b: torch.Tensor, down_a: torch.Tensor,
                 slot_ids: Iterable[int], interleaved: bool) -> None:
    """Copy the given slots of the pool into ``w1_delta [S, n*2F, 2R]`` and ``a_cat [S, R, n*F]``.

    Upstream's refresh, step by step (its failures are upstream's): ``w1_delta`` viewed
    as gate/up halves of ``[S, n, F, 2, 2R]`` (interleaved; ``[S, n, 2, F, 2R]`` for the
    contiguous base), which an odd 2F fails unless it is empty; ``a_cat`` as
    ``[S, R, n, F]``; then per slot: zero, gate B into the gate rows' first ``R``
    columns, up B into the up rows' last ``R``, down A with its expert and rank axes
    swapped. Every size is named in the views: ``-1`` is ambiguous for an empty tensor.
    """
    S, n, two_f, R = gate_up_b.shape
    F = two_f // 2
    if interleaved:
        rows = w1_delta.view(S, n, F, 2, 2 * R)
        gate, up = rows[:, :, :, 0], rows[:, :, :, 1]
    else:
        rows = w1_delta.view(S, n, 2, F, 2 * R)
        gate, up = rows[:, :, 0], rows[:, :, 1]
    cat = a_cat.view(S, R, n, down_a.shape[3])
    with torch.no_grad():
        for s in slot_ids:
            rows[s].zero_()
            gate[s, :, :, :R].copy_(gate_up_b[s, :, :F])
            up[s, :, :, R:].copy_(gate_up_b[s, :, F:])
            cat[s].copy_(down_a[s].permute(1, 0, 2))  # down A with fewer slots: torch's IndexError


def derive_operands(gate_up_b: torch.Tensor, down_a: torch.Tensor, interleaved: bool
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The shared-outer operands (docs/reference.md#the-forward), built from the pool's inner factors.

    ``gate_up_b [S, n, 2F, R]`` -> ``w1_delta [S, n*2F, 2R]``: maps the ``2R`` shrink
    output onto the base ``y`` layout (gate B in the gate rows' first ``R`` columns,
    up B in the up rows' last ``R``). ``down_a [S, n, R, F]`` -> ``a_cat [S, R, n*F]``:
    down A of all experts side by side. Allocated like upstream's (from the shapes of
    gate-up B and down A, in their dtypes and devices), then every slot written; slots
    are those of ``gate_up_b``.
    """
    S, n, two_f, R = gate_up_b.shape
    w1_delta = gate_up_b.new_empty(S, n * two_f, 2 * R)
    a_cat = down_a.new_empty(S, R, n * down_a.shape[3])
    _write_slots(w1_delta, a_cat, gate_up_b, down_a, range(S), interleaved)
    return w1_delta, a_cat


def _slot_list(slot_ids: Iterable[int] | None) -> list[int] | None:
    """``slot_ids`` as a list of ints, read exactly once (any iterable, a tensor of
    integers included); ``None`` stays ``None``. A bool, float, string or anything
    that is no integer is refused (``TypeError`` naming it), never read as a slot."""
    if slot_ids is None:
        return None
    if isinstance(slot_ids, torch.Tensor):
        slot_ids = slot_ids.flatten().tolist()  # floats and bools stay what they are, and are refused
    if isinstance(slot_ids, (str, bytes)) or not isinstance(slot_ids, Iterable):
        raise TypeError(f"on_lora_slots_updated: slot_ids must be an iterable of slot ids (or None for every "
                        f"slot), got {slot_ids!r}")
    ids = list(slot_ids)
    for s in ids:
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise TypeError(f"on_lora_slots_updated: slot_ids must hold integers, got {s!r} "
                            f"({type(s).__name__}) in {ids!r}")
    return [int(s) for s in ids]


def _into(stored: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """Adopt ``new``, or copy it into ``stored`` (same shape) so the address stays fixed."""
    if stored is None:
        return new
    with torch.no_grad():
        stored.copy_(new)
    return stored


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
                 device: torch.device | str | None = None, seed: int = 0, *, activation: str = "silu") -> None:
        super().__init__(n_shared_experts, hidden_size, intermediate_size, interleaved, dtype, device, seed,
                         activation=activation)
        self.backend: LoRABackend | None = None
        self.generation = "v1"
        self.lora_buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.layout: PoolLayout | None = None
        self.w1_delta: torch.Tensor | None = None
        self.a_cat: torch.Tensor | None = None
        self.down_cat: torch.Tensor | None = None  # the second generation's derived operand
        self.kept: KeptMerge | None = None  # keep_merged's copies
        self._keep: dict[int, float] = {}  # what keep_merged was asked for
        self._ops_cache: SinkOperands | None = None  # see operands()

    # -- eligibility -------------------------------------------------------------------
    @property
    def linearized_bf16(self) -> bool:
        """Upstream's first wrapper linearizes only an interleaved bf16 sink."""
        return self.interleaved and self.dtype == torch.bfloat16

    def initialize_lora(self, backend: LoRABackend, generation: str = "v1") -> None:
        """Upstream's eligibility check for the multi-slot dense LoRA wrapper, then a
        module with no pool (upstream's ``initialize_lora`` starts afresh too).

        ``generation="v1"`` (``InklingBatchDenseMLPWithLoRA``) needs Triton for more
        than one slot and an interleaved bf16 sink, and lists every problem in one
        ``ValueError``. ``"v2"`` (``InklingBatchDenseMLPWithLoRAV2``, the dense engine)
        raises at the first of: a backend without the dense engine (only ``triton_v2``
        has one), a sink that is not bf16, an interleaved sink (it needs the
        contiguous ``[gate ‖ up]`` base). A failed call changes nothing.
        """
        if not isinstance(backend, LoRABackend):
            raise TypeError(f"initialize_lora: backend must be a LoRABackend (il.LoRABackend('triton', "
                            f"max_loras_per_batch=4)), got {type(backend).__name__}")
        check_generation(generation)
        if generation == "v1":
            problems = []
            if backend.max_loras_per_batch > 1 and backend.name != "triton":
                problems.append(PROBLEM_BACKEND)
            if not self.linearized_bf16:
                problems.append(PROBLEM_WEIGHTS)
            if problems:
                raise ValueError(MSG_INELIGIBLE.format(problems="; ".join(problems)))
        else:
            if not backend.dense_engine:
                raise ValueError(MSG_V2_NO_ENGINE.format(cls=V2_CLASS))
            # The dense engine linearizes the bf16 sink in either layout; V1's "only
            # interleaved" does not apply, the third check wants the other one.
            if self.dtype != torch.bfloat16:
                raise ValueError(MSG_V2_NOT_BF16.format(cls=V2_CLASS))
            if self.interleaved:
                raise ValueError(MSG_V2_INTERLEAVED)
        self.backend, self.generation = backend, generation
        self.clear_pool()

    def clear_pool(self) -> None:
        """Forget the pool and its derived operands, keeping the base weights: the next
        ``set_lora_info`` starts afresh, of any slot count and rank (what
        ``initialize_lora`` does after its checks; a benchmark reuses one sink's weights
        for pools of several shapes)."""
        self.lora_buffers = self.layout = None
        self.w1_delta = self.a_cat = self.down_cat = None
        self.kept, self._keep = None, {}

    # -- the pool ----------------------------------------------------------------------
    @property
    def shared_outer(self) -> bool:
        return self.layout is not None and self.layout.shared_outer

    def set_lora_info(self, gate_up_a: torch.Tensor, gate_up_b: torch.Tensor, down_a: torch.Tensor,
                      down_b: torch.Tensor) -> PoolLayout:
        """Validate and adopt the four pool buffers; build the derived operands.

        ``gate_up_a [S, O, 2R, H]``, ``gate_up_b [S, n, 2F, R]``, ``down_a [S, n, R, F]``,
        ``down_b [S, O, H, R]``. Raises what this module's generation raises upstream,
        in upstream's order (docs/reference.md#validation-order): its checks' ``ValueError``s, its pool-shape
        ``RuntimeError`` on a later call, and the raw torch errors of its operand step
        (same exception types). Unlike upstream's first generation, a failed call leaves
        the module exactly as it was: everything is built aside and adopted at the end.

        ``v1``, shared outer: ``w1_delta [S, n*2F, 2R]`` and ``a_cat [S, R, n*F]``,
        allocated once and later written in place (CUDA graphs replay against them).
        ``v2``: ``down_cat``, ``[S, R, n*F]`` shared outer (it is ``a_cat``) or
        ``[S, H, n*R]`` per expert; the kit adds the ``w1_delta`` its forward needs.
        """
        layout = validate_pool(gate_up_a, gate_up_b, down_a, down_b, n_shared_experts=self.n_shared_experts,
                               generation=self.generation)
        buffers = (gate_up_a, gate_up_b, down_a, down_b)
        if self.generation == "v2":
            self._set_lora_info_v2(buffers, layout)
            return layout
        if not layout.shared_outer:
            self.lora_buffers, self.layout = buffers, layout
            self.w1_delta = self.a_cat = None  # a later shared-outer call starts afresh
            self._merge_kept()
            return layout
        S, n, two_f, R = gate_up_b.shape
        if self.w1_delta is None or self.a_cat is None:
            w1_delta, a_cat = derive_operands(gate_up_b, down_a, self.interleaved)
        else:
            # Upstream compares the shapes it would allocate before it reshapes anything.
            old = (tuple(self.w1_delta.shape), tuple(self.a_cat.shape))
            new = ((S, n * two_f, 2 * R), (S, R, n * down_a.shape[3]))
            if old != new:
                raise RuntimeError(MSG_POOL_SHAPE.format(old_gate_up=old[0], new_gate_up=new[0],
                                                         old_down=old[1], new_down=new[1]))
            w1_delta, a_cat = torch.empty_like(self.w1_delta), torch.empty_like(self.a_cat)
            _write_slots(w1_delta, a_cat, gate_up_b, down_a, range(S), self.interleaved)
        self.w1_delta, self.a_cat = _into(self.w1_delta, w1_delta), _into(self.a_cat, a_cat)
        self.lora_buffers, self.layout = buffers, layout
        self._merge_kept()
        return layout

    def _set_lora_info_v2(self, buffers: tuple[torch.Tensor, ...], layout: PoolLayout) -> None:
        """The dense engine's ``set_lora_info`` after its checks (docs/reference.md#validation-order, second generation)."""
        gate_up_a, gate_up_b, down_a, down_b = buffers
        n, S, R, shared = self.n_shared_experts, layout.slots, layout.rank, layout.shared_outer
        two_f, hidden = gate_up_b.shape[2], down_b.shape[2]
        F = two_f // 2
        shape = (S, R, n * F) if shared else (S, hidden, n * R)
        if self.down_cat is not None and tuple(self.down_cat.shape) != shape:
            raise RuntimeError(MSG_V2_POOL_SHAPE.format(old=tuple(self.down_cat.shape), new=shape))
        # The engine's views of the pool for its GEMMs. The kit computes from the buffers
        # themselves; the views are taken for their failures, which are upstream's: an
        # empty per-expert A (reshape with -1), a gate-up B whose slots are not gate-up A's,
        # F = 0 (its segment offsets are range(0, n*2F+1, F)).
        if not shared:
            gate_up_a.reshape(S, n * 2 * R, -1)
        gate_up_b.view(S, n * two_f, R)
        range(0, n * two_f + 1, F)
        if not shared:
            down_a.view(S, n * R, -1)
        source = (down_a if shared else down_b).permute(0, 2, 1, 3)
        down_cat = down_a.new_empty(shape) if self.down_cat is None else torch.empty_like(self.down_cat)
        target = down_cat.view_as(source)
        with torch.no_grad():
            for s in range(source.shape[0]):
                target[s].copy_(source[s])
        w1_delta = None
        # The kit's forward needs w1_delta; a pool that upstream accepts but whose gate-up
        # B does not match down A (an odd 2F, another F or slot count) gets none, and the
        # forward refuses it (forward.check_pool_fits, ISL-K153).
        if (shared and two_f % 2 == 0 and gate_up_b.shape[0] == S == down_a.shape[0]
                and down_a.shape[3] == F):
            stored = self.w1_delta if self.w1_delta is not None and self.w1_delta.shape == (S, n * two_f, 2 * R) \
                else None
            w1_delta = gate_up_b.new_empty(S, n * two_f, 2 * R) if stored is None else torch.empty_like(stored)
            _write_slots(w1_delta, down_cat, gate_up_b, down_a, range(S), self.interleaved)
            w1_delta = _into(stored, w1_delta)
        self.down_cat = _into(self.down_cat, down_cat)
        self.w1_delta, self.a_cat = w1_delta, self.down_cat if shared else None
        self.lora_buffers, self.layout = buffers, layout
        self._merge_kept()

    def on_lora_slots_updated(self, slot_ids: Iterable[int] | None = None) -> None:
        """Re-derive the operands of the given slots after the pool changed them in place.

        ``slot_ids``: ids, or ``None`` for every slot (an empty set refreshes none).
        ``v1``, shared outer after a successful ``set_lora_info``: every id must be a
        slot, else ``IndexError`` listing every requested id, sorted. Per-expert pools,
        and a module with no pool yet, have nothing derived and accept any ids, as
        upstream does. ``v2`` does not range-check: an id past the end gets torch's own
        ``IndexError`` from the copy (and ``-1`` is the last slot, as in torch); before a
        successful ``set_lora_info`` it does nothing.
        """
        slot_ids = _slot_list(slot_ids)  # read once: a generator would be spent by the range check
        if self.lora_buffers is None:
            return
        if self.generation == "v2":
            self._refresh_v2(slot_ids)
        elif self.w1_delta is not None and self.a_cat is not None:
            _, gate_up_b, down_a, _ = self.lora_buffers
            S = gate_up_b.shape[0]
            if slot_ids is None:
                slot_ids = range(S)
            elif any(s < 0 or s >= S for s in slot_ids):
                raise IndexError(MSG_SLOT_RANGE.format(slot_ids=sorted(slot_ids)))
            _write_slots(self.w1_delta, self.a_cat, gate_up_b, down_a, slot_ids, self.interleaved)
        if self.kept is not None:
            S = self.lora_buffers[0].shape[0]
            # v1's per-expert refresh takes any ids, as upstream's does (those past the pool name no slot);
            # v2's copy reads -1 as the last slot, as torch indexes
            ids = range(S) if slot_ids is None else {s % S for s in slot_ids if -S <= s < S}
            remerge(self.operands(), self.kept, ids)

    # -- merged weights kept per slot (merged.py) ------------------------------------------------------------------
    def keep_merged(self, scalings: Mapping[int, float] | None) -> int:
        """Keep a merged copy of the base weights for each slot of ``scalings`` (slot -> the
        adapter's scaling, alpha / r as the batch will carry it); ``None`` or ``{}`` keeps none.
        Returns the device memory the copies take (``n*3F*H`` elements a slot).

        A forward of a host batch whose used slots are all kept at the batch's own scalings then
        runs the base forward on the merged weights (the triton backend, ``forward.triton_backend.plan``:
        one token through the GEMV kernels, one slot from two tokens on through cuBLAS's GEMMs, several
        in slot order from ``keeps``' tokens per slot), with no LoRA work per token. The copies
        follow the pool: ``on_lora_slots_updated`` writes a kept slot's merge again in place (so
        call it after every in-place write of a slot, as sglang 0.5.23 does), ``set_lora_info``
        writes every kept slot again from the new pool (one that does not fit the sink, or has fewer
        slots, drops those it cannot keep), and a change of the base weights is merged again at the next
        forward. Either outer layout merges (the merge reads the pool's own factors, expert by expert).
        Refused (``ISL-K166``, nothing changed): no pool, a pool that does not fit the sink, a slot
        past the pool, a scaling that is not a finite number."""
        scalings = dict(scalings or {})
        ops = self.operands()
        problem = check_keep(ops, scalings) if scalings else None
        if problem is not None:
            raise error("ISL-K166", problem=problem)
        keep = {int(s): float(c) for s, c in scalings.items()}
        self.kept = kept_merge(ops, keep, self._lin_key(), self.kept)
        self._keep = keep
        return 0 if self.kept is None else self.kept.nbytes

    def _merge_kept(self) -> None:
        """After a new pool: the merges asked for that it can hold, written again."""
        old, self.kept = self.kept, None
        ops = self.operands()
        self._keep = {s: c for s, c in self._keep.items() if check_keep(ops, {s: c}) is None}
        self.kept = kept_merge(ops, self._keep, self._lin_key(), old)

    def _lin_key(self) -> tuple:
        self.linearized()
        return self._lin_cache[0]

    def _refresh_v2(self, slot_ids: list[int] | None) -> None:
        _, gate_up_b, down_a, down_b = self.lora_buffers
        source = (down_a if self.shared_outer else down_b).permute(0, 2, 1, 3)
        target = self.down_cat.view_as(source)
        for s in range(source.shape[0]) if slot_ids is None else slot_ids:
            with torch.no_grad():
                target[s].copy_(source[s])
            if self.w1_delta is not None:
                _write_slots(self.w1_delta, self.a_cat, gate_up_b, down_a, (s,), self.interleaved)

    # -- tensor parallelism (docs/reference.md#tensor-parallelism) --------------------------------------------------
    def slice_lora_a(self, weights: Factor, tp_rank: int, target_module: str, tp_size: int) -> Factor:
        """This rank's share of a LoRA A factor: ``shard.slice_lora_a`` with this sink's n
        and (full, unsharded) F."""
        return shard.slice_lora_a(weights, tp_rank, target_module, tp_size, self.n_shared_experts,
                                  self.intermediate_size)

    def slice_lora_b(self, weights: Factor, tp_rank: int, target_module: str, tp_size: int) -> Factor:
        """This rank's share of a LoRA B factor: ``shard.slice_lora_b`` with this sink's n
        and (full, unsharded) F."""
        return shard.slice_lora_b(weights, tp_rank, target_module, tp_size, self.n_shared_experts,
                                  self.intermediate_size)

    # -- forward -----------------------------------------------------------------------
    def operands(self) -> SinkOperands:
        """What a forward backend reads: the weights and their linearized views, the
        layout, the adopted pool buffers and derived operands (``None`` where absent).

        The record holds the module's own tensors (no copies): a slot refresh, which
        writes in place, shows through it; after ``set_lora_info`` ask for a new one.
        The same record comes back while nothing was replaced (a forward's host time
        counts: a decode step is a few microseconds of GPU work).
        """
        ops, w13_lin = self._ops_cache, self.linearized()[0]
        kept = self.kept
        if kept is not None and kept.base != self._lin_cache[0]:  # the base weights changed under the merges
            kept = self.kept = replace(kept, base=self._lin_cache[0])
            remerge(self._operands(self.lora_buffers, self.w1_delta, self.a_cat), kept, kept.slots)
        if (ops is None or ops.w13_lin is not w13_lin or ops.buffers is not self.lora_buffers
                or ops.w1_delta is not self.w1_delta or ops.a_cat is not self.a_cat
                or ops.interleaved != self.interleaved or ops.kept is not kept):
            ops = self._ops_cache = self._operands(self.lora_buffers, self.w1_delta, self.a_cat, kept)
        return ops

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
        return self._operands((gate_up_a, gate_up_b, down_a, down_b), w1, a_cat)

    def _operands(self, buffers: tuple[torch.Tensor, ...] | None, w1_delta: torch.Tensor | None,
                  a_cat: torch.Tensor | None, kept: KeptMerge | None = None) -> SinkOperands:
        # first: it may linearize again, with the spare rows (shared outer only)
        w2_cat = None if buffers is None or w1_delta is None else self._down_cat(buffers[1].shape[0]
                                                                                 * buffers[1].shape[-1])  # S*R
        w13_lin, w2_lin = self.linearized()
        return SinkOperands(w13=self.w13.detach(), w2=self.w2.detach(), w13_lin=w13_lin, w2_lin=w2_lin,
                            interleaved=self.interleaved, buffers=buffers, w1_delta=w1_delta, a_cat=a_cat,
                            kept=kept, w2_cat=w2_cat)

    def forward(self, x: torch.Tensor, gammas: torch.Tensor, batch: "SlotBatch | None" = None,
                backend: str = "auto", *, out: torch.Tensor | None = None) -> torch.Tensor:
        """``x [T, H]`` (or ``[B, L, H]``), ``gammas [T, n]``, a ``SlotBatch`` naming each
        token's slot -> ``out`` like ``x``. No batch or no pool: the base sink.

        ``out``: a contiguous tensor of ``x``'s shape, the result's dtype (the sink's;
        float64 for ``backend="reference"``) and the sink's device, written and returned
        instead of a new tensor (every check runs first: a refused call writes nothing).
        ``static_io`` gives the tensors to pass as ``x``, ``gammas`` and ``out`` for a
        forward that copies nothing in or out.

        A sink of another activation than SiLU computes its base forward (the model's
        own), and refuses a LoRA forward (``ISL-K155``): that forward is sglang's, SiLU only.
        """
        if self.activation != "silu":
            if batch is None or self.lora_buffers is None:
                if out is None:
                    return self.base_forward(x, gammas)
                dst = check_out(out, x, self.dtype, self.device)  # before the forward: a refusal writes nothing
                dst.copy_(self.base_forward(x, gammas).reshape(dst.shape))
                return out
            raise error("ISL-K155", activation=self.activation)
        return run_forward(self.operands(), x, gammas, batch, backend, out=out)

    def static_io(self, batch: "SlotBatch | None" = None, *, tokens: int | None = None,
                  backend: str = "auto") -> StaticIO:
        """The tensors a forward of ``batch`` reads and writes in place (``StaticIO``:
        ``x [T, H]`` in the sink's dtype, ``gammas [T, n]`` float32, ``out [T, H]``, on the
        sink's device; ``tokens``: ``T``, read from the batch when not given). Write each
        step's inputs into ``io.x`` and ``io.gammas`` and call
        ``sink(io.x, io.gammas, batch=batch, backend=backend, out=io.out)``: on the ``triton``
        backend's graph path (CUDA, up to ``GRAPH_TOKENS`` tokens) these are the captured
        graph's static tensors, so the call copies nothing in or out (the host cost of a
        decode step, KERNEL_NOTES.md); elsewhere ordinary tensors, and the call is the same
        as with any others. Ask once per batch object and keep them; the next call
        overwrites ``io.out``."""
        return static_io(self.operands(), batch, tokens, backend)
