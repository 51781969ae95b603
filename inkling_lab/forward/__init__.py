"""Forward backends for the shared sink with LoRA, and the dispatcher (docs/reference.md#the-forward).

``reference`` (float64 loops, the ground truth), ``torch`` (vectorized, any device)
and ``triton`` (GPU kernels; CPU only under ``TRITON_INTERPRET=1``). ``auto`` picks
the fastest correct one for the device. Every backend is
``fn(ops: SinkOperands, x [T, H], gammas [T, n], batch: SlotBatch | None, out=None) -> out [T, H]``
(``out``: a checked ``[T, H]`` tensor to write into and return, else a new one);
``run_forward`` checks the inputs once, for all of them. ``static_io`` hands out the
tensors a forward reads and writes without copying them (``StaticIO``).
"""
from __future__ import annotations

import importlib
import weakref
from dataclasses import replace
from typing import Callable

import torch

from ..batch import SlotBatch
from ..catalog import error, message
from ..operands import SinkOperands
from ..sink import check_tokens
from .reference import reference_forward
from .static import StaticIO
from .torch_backend import torch_forward

Backend = Callable[..., torch.Tensor]
"""``fn(ops, x [T, H], gammas [T, n], batch, out=None) -> out [T, H]``."""


class _Imported:
    """A backend whose module is imported at its first use (Triton is optional and takes
    about a second to import). ``load`` puts the function itself into ``BACKENDS``, so
    later calls go straight to it (an import statement costs ~1 µs a call even when
    the module is loaded)."""

    def __init__(self, name: str, module: str, attr: str):
        self.name, self.module, self.attr = name, module, attr

    def load(self) -> Backend:
        fn = getattr(importlib.import_module(self.module, __name__), self.attr)
        BACKENDS[self.name] = fn
        return fn

    def __call__(self, ops: SinkOperands, x: torch.Tensor, gammas: torch.Tensor,
                 batch: "SlotBatch | None", out: torch.Tensor | None = None) -> torch.Tensor:
        return self.load()(ops, x, gammas, batch, out)


BACKENDS: dict[str, Backend] = {"reference": reference_forward, "torch": torch_forward,
                                "triton": _Imported("triton", ".triton_backend", "triton_forward")}


def pick_backend(x: torch.Tensor) -> str:
    """``triton`` for bf16/fp16 work on CUDA where Triton imports, else ``torch``.

    Measured on the H200 (``data/profiles/h200_grid.json``): the triton backend beats
    the torch one at every grid point (2.4x to 125x). float32 stays on ``torch``:
    Triton's float32 dots run in tf32 (~1e-3), torch's matmuls in full float32. On CPU
    the interpreter runs the kernels far slower than torch, so ``auto`` never picks it.
    """
    if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16):
        triton = BACKENDS["triton"]
        try:
            if isinstance(triton, _Imported):
                triton.load()
            return "triton"
        except ImportError:
            pass
    return "torch"


def check_pool_fits(ops: SinkOperands) -> None:
    """Refuse a pool whose gate-up B ``[S, n, 2F, R]`` or down A ``[S, n, R, F]`` is not
    of the sink's ``F`` (``ISL-K153``). Upstream's ``set_lora_info`` never compares the
    pool to the module, so such a pool can be adopted; every backend would then fail
    inside its matmuls (or, for a second-generation odd 2F, find no ``w1_delta``)."""
    _, gate_up_b, down_a, _ = ops.buffers
    F = ops.intermediate
    problems = []
    if gate_up_b.shape[2] != 2 * F:
        problems.append(f"gate_up_b is {list(gate_up_b.shape)}, whose 2F = {gate_up_b.shape[2]} is not 2 * {F}")
    if down_a.shape[3] != F:
        problems.append(f"down_a is {list(down_a.shape)}, whose F = {down_a.shape[3]} is not {F}")
    if problems:
        S, n, R = ops.slots, ops.n, ops.max_rank
        raise ValueError(message("ISL-K153", F=F, problems="; ".join(problems),
                                 want_gate_up_b=[S, n, 2 * F, R], want_down_a=[S, n, R, F]))


def check_pool_dtype(ops: SinkOperands) -> None:
    """Refuse pool buffers of another dtype than the sink's weights (``ISL-K161``): every
    backend would fail inside a matmul (torch's "expected m1 and m2 to have the same
    dtype") or, in a kernel, read the bytes as the wrong type. Then the derived operands
    (``ISL-K165``): built once from the first pool, they keep its dtype when a later
    ``set_lora_info`` hands a pool of another (as upstream's do); the check names them."""
    d, (b0, b1, b2, b3), w1, a_cat = ops.dtype, ops.buffers, ops.w1_delta, ops.a_cat
    # Every forward passes here: the common case in one expression (a torch dtype is a
    # singleton), the messages only on a mismatch.
    if (b0.dtype is d and b1.dtype is d and b2.dtype is d and b3.dtype is d
            and (w1 is None or w1.dtype is d) and (a_cat is None or a_cat.dtype is d)):
        return
    dtypes = [b.dtype for b in ops.buffers]
    if any(t != d for t in dtypes):
        raise TypeError(message("ISL-K161", pool=", ".join(str(t).removeprefix("torch.") for t in dtypes),
                                sink=str(d).removeprefix("torch.")))
    kept = {name: t for name, t in (("w1_delta", w1), ("a_cat", a_cat)) if t is not None and t.dtype != d}
    raise TypeError(message("ISL-K165", operands=", ".join(f"{k} {str(t.dtype).removeprefix('torch.')}"
                                                           for k, t in kept.items()),
                            pool=str(d).removeprefix("torch.")))


_CHECKED: list = [None]
"""The last host batch ids ``check_batch_slots`` passed: ``(weakref, storage, version, slots)``."""


def check_batch_slots(batch: SlotBatch, slots: int) -> None:
    """A host-resident batch's slot ids, checked again at the forward: a ``SlotBatch`` is
    frozen but its tensors are not, and an id rewritten in place past the pool would
    read another slot's memory in a kernel (or raise torch's raw ``IndexError``). A
    device-resident batch is the caller's (checked when it was built: a CUDA graph
    replay allows no sync).

    The ids a decode loop passes again unchanged are not scanned again (two torch
    reductions, ~10-25 µs of host time a call, ``h200_gemv.json``'s host phases): the
    last ids that passed are remembered by identity, storage and version counter, and
    any in-place write bumps the counter."""
    ids = batch.weight_indices
    if ids.device.type != "cpu" or not ids.numel():
        return
    seen = _CHECKED[0]
    if seen is not None and seen[0]() is ids and seen[1:] == (ids.data_ptr(), ids._version, slots):
        return
    bad = (ids < -1) | (ids >= slots)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        raise error("ISL-K103", where="segment", index=i, slot=int(ids[i]), last=slots - 1, count=int(bad.sum()))
    _CHECKED[0] = (weakref.ref(ids), ids.data_ptr(), ids._version, slots)


def check_batch(ops: SinkOperands, batch: object, num_tokens: int, what: str) -> None:
    """Refuse a batch that is not a ``SlotBatch``, does not describe ``num_tokens`` tokens
    (``what``: where that count comes from, for the message), is for another slot count
    than the pool, or meets a pool that does not fit the sink (``check_pool_fits``,
    ``check_pool_dtype``); then its slot ids (``check_batch_slots``)."""
    if not isinstance(batch, SlotBatch):
        raise TypeError(f"batch must be a SlotBatch (il.SlotBatch.from_token_slots(token_slots, num_slots)) or "
                        f"None (the base sink), got {type(batch).__name__}")
    if batch.num_tokens != num_tokens:
        raise ValueError(f"the batch describes {batch.num_tokens} tokens but {what} {num_tokens}")
    slots = batch.num_slots
    if ops.buffers is not None:
        if slots != ops.slots:
            raise ValueError(f"the batch is for {slots} slots but the pool has {ops.slots}")
        check_pool_fits(ops)
        check_pool_dtype(ops)
    check_batch_slots(batch, slots)  # the pool's count where there is one: the same, checked above


def check_out(out: object, x: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The caller's ``out`` for a forward of ``x [T, H]`` (or ``[..., H]``) as ``[T, H]``
    rows (a view: the forward writes the caller's memory), after checking that it is a
    contiguous tensor of ``x``'s shape, of ``dtype`` (the backend's result: the sink's,
    float64 for ``reference``) on ``device``. Raises ``TypeError`` (not a tensor, wrong
    dtype), ``ValueError`` (shape, device, layout), each naming ``out``;
    nothing has been computed or written then."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor of x's shape (or None: a new one), got {type(out).__name__}")
    if out.shape != x.shape:
        raise ValueError(f"out has shape {tuple(out.shape)} but x has {tuple(x.shape)}: pass a tensor of x's shape "
                         f"(torch.empty_like(x))")
    if out.dtype is not dtype:
        raise TypeError(f"out is {out.dtype} but this forward returns {dtype}: pass a tensor of {dtype}")
    # Not ISL-K151's fix (out.to(device)): a moved copy would be written, not the caller's tensor.
    if out.device != device:
        raise ValueError(f"out is on {out.device}, the sink on {device}: pass a tensor on {device}")
    # The kernels write rows of H at a stride of H: another layout would leave the caller's view wrong.
    if not out.is_contiguous():
        raise ValueError(f"out is not contiguous (strides {tuple(out.stride())}): pass a contiguous tensor "
                         f"(torch.empty_like(x)); out.contiguous() would be a copy, not this tensor")
    return out if out.dim() == 2 else out.view(-1, out.shape[-1])


def run_forward(ops: SinkOperands, x: torch.Tensor, gammas: torch.Tensor, batch: SlotBatch | None = None,
                backend: str = "auto", *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Base plus LoRA for ``x [T, H]`` (or ``[B, L, H]``) and ``gammas [T, n]``.

    ``x`` and ``gammas`` must have the sink's dtype and device; the batch must describe
    ``T`` tokens over the pool's ``S`` slots, and the pool must be of the sink's ``F``
    (``check_pool_fits``). Returns ``x``'s shape; the ``reference`` backend returns
    float64. ``out``: a contiguous tensor of ``x``'s shape and the result's dtype on the
    sink's device (``check_out``), written and returned instead of a new tensor; every
    check runs before anything is written. Tensors from ``static_io`` passed as ``x``,
    ``gammas`` and ``out`` are read and written in place by the ``triton`` backend's graph
    (no copy in, none out).
    """
    x2, g2 = check_tokens(x, gammas, n=ops.n, hidden=ops.hidden, dtype=ops.dtype, device=ops.device)
    if batch is not None:
        check_batch(ops, batch, x2.shape[0], "x has")
    name = pick_backend(x2) if backend == "auto" else backend
    fn = BACKENDS.get(name)
    if fn is None:
        raise ValueError(f"unknown backend {backend!r}; choose one of {sorted(BACKENDS) + ['auto']}")
    if out is None:
        res = fn(ops, x2, g2, batch)
        return res if x2 is x else res.reshape(x.shape)  # x2 is x: x was [T, H] already
    fn(ops, x2, g2, batch, check_out(out, x, torch.float64 if name == "reference" else ops.dtype, ops.device))
    return out


def static_io(ops: SinkOperands, batch: SlotBatch | None, tokens: int | None = None,
              backend: str = "auto") -> StaticIO:
    """The tensors of ``StaticIO`` for a forward of ``batch`` (``tokens``: its token count,
    read from the batch when not given; required without one) on ``backend``.

    For the ``triton`` backend's graph path (CUDA, a batch, up to ``GRAPH_TOKENS`` tokens)
    they are the plan's static tensors, the same for every call with this batch object
    (its graphs are captured around them); ``gammas`` is float32 (sglang's router
    weights) unless an earlier call captured the graph with another dtype. Otherwise new
    zero-filled tensors (``gammas`` float32), read and written in place like any others;
    ``reference``'s ``out`` is float64, as its result."""
    if tokens is None:
        if batch is None:
            raise ValueError("static_io without a batch needs tokens= (the token count T)")
        tokens = batch.num_tokens if isinstance(batch, SlotBatch) else 0
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be a whole number of at least 0, got {tokens!r}")
    if batch is not None:
        check_batch(ops, batch, tokens, "tokens is")
    probe = torch.empty(0, dtype=ops.dtype, device=ops.device)
    name = pick_backend(probe) if backend == "auto" else backend
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {sorted(BACKENDS) + ['auto']}")
    if name == "triton":
        io = importlib.import_module(".triton_backend", __name__).static_io(ops, batch, tokens)
        if io is not None:
            return io
    io = StaticIO.empty(ops, tokens)
    if name == "reference":
        return replace(io, out=io.out.to(torch.float64))
    return io
