"""The base module: Inkling's dense shared-expert sink (docs/reference.md#the-base-module).

Every token goes through every shared expert; the gate's per-token, per-expert
weights ``gammas [T, n]`` scale each expert's SwiGLU activation. Two forms compute
the same function: the *per-expert* form (one small matmul per expert) and the
*linearized* form serving uses (one GEMM up, one GEMM down for all experts).
"""
from __future__ import annotations

import math
import numbers
from typing import Callable, Literal

import torch
from torch import nn

from .catalog import error
from .geometry import Geometry, allocate, check_dtype, check_size

Form = Literal["linearized", "per_expert"]


def _gelu_tanh_formula(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": nn.functional.silu,
    "swish": nn.functional.silu,
    "gelu": nn.functional.gelu,
    "gelu_pytorch_tanh": lambda x: nn.functional.gelu(x, approximate="tanh"),
    "gelu_new": _gelu_tanh_formula,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": nn.functional.relu,
    "relu2": lambda x: torch.square(nn.functional.relu(x)),
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "mish": nn.functional.mish,
}
"""The gate activations the kit computes, by transformers' ``ACT2FN`` names (the model's
``config.hidden_act``; ``InklingSharedExperts`` computes ``act_fn(gate) * up``). sglang
0.5.23's shared sink computes ``silu`` only (``dense_mlp.py``, ``InklingBatchDenseMLP._swiglu``)."""


def activation_fn(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The function of an ``ACT2FN`` name; ``ISL-K154`` for one the kit does not compute."""
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise error("ISL-K154", name=name, known=", ".join(ACTIVATIONS))
    return ACTIVATIONS[name]


def gate_up_rows(intermediate: int, interleaved: bool, device: torch.device | str | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices of the gate and up features inside one expert's ``2F`` rows.

    Interleaved: row ``2f`` is gate feature ``f`` and row ``2f+1`` up feature ``f``.
    Contiguous: rows ``0..F-1`` gate, ``F..2F-1`` up. Returns two ``[F]`` index tensors.
    """
    f = torch.arange(intermediate, device=device)
    if interleaved:
        return 2 * f, 2 * f + 1
    return f, f + intermediate


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for working dtypes up to float32 (docs/reference.md#the-base-module); float64 stays float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def swiglu_sink(y: torch.Tensor, gammas: torch.Tensor, interleaved: bool,
                out_dtype: torch.dtype | None = None, activation: str = "silu") -> torch.Tensor:
    """The sink activation ``silu(gate) * up * gamma``, in float32, cast once.

    ``y [T, n, 2F]`` (gate/up rows in the sink's layout), ``gammas [T, n]`` ->
    ``act [T, n, F]`` in ``out_dtype`` (default: ``y``'s dtype). ``activation``: the
    model's gate activation by its ``ACT2FN`` name (``ACTIVATIONS``), SiLU by default.
    """
    two_f = y.shape[-1]
    if two_f % 2:
        raise ValueError(f"swiglu_sink needs an even last dimension 2F, got {two_f}")
    gate_idx, up_idx = gate_up_rows(two_f // 2, interleaved, y.device)
    y32 = y.to(accumulation_dtype(y.dtype))
    act_fn = nn.functional.silu if activation == "silu" else activation_fn(activation)
    act = act_fn(y32[..., gate_idx]) * y32[..., up_idx]
    act = act * gammas.to(y32.dtype).unsqueeze(-1)
    return act.to(out_dtype or y.dtype)


def linearize(w13: torch.Tensor, w2: torch.Tensor, spare_rows: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The serving form of the weights: ``w13 [n, 2F, H] -> w13_lin [n*2F, H]`` (a view)
    and ``w2 [n, H, F] -> w2_lin [n*F, H]`` (a copy: expert-major, feature-minor rows), the
    first ``n*F`` rows of a ``[n*F + spare_rows, H]`` tensor whose other rows are left
    uninitialized for the forward (``SharedSink._down_cat``)."""
    n, two_f, hidden = w13.shape
    f = w2.shape[2]
    rows = w2.new_empty(n * f + spare_rows, hidden)
    rows[:n * f].view(n, f, hidden).copy_(w2.transpose(1, 2))
    return w13.reshape(n * two_f, hidden), rows[:n * f]


def _as_tokens(x: torch.Tensor, last: int, what: str, device: torch.device) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    shape = x.shape
    if not shape or shape[-1] != last:
        raise ValueError(f"{what} must end in a dimension of size {last}, got shape {tuple(shape)}")
    # Checked here so that a mismatch names the tensor instead of surfacing as a raw torch error.
    if x.device != device:
        raise error("ISL-K151", what=what, got=x.device, want=device)
    # Rows already: the tensor itself (a reshape is a torch op, microseconds of a decode step's host time).
    return x if len(shape) == 2 else x.reshape(-1, last)


def check_tokens(x: torch.Tensor, gammas: torch.Tensor, *, n: int, hidden: int, dtype: torch.dtype,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [T, H]`` (or ``[..., H]``) and ``gammas [T, n]`` (or ``[..., n]``) as 2D token
    rows, after checking their sizes and that they are where the sink's weights are.

    ``x`` must have the weights' dtype. ``gammas`` may be of any floating dtype: sglang
    passes the router's weights, typically float32 next to bf16 hidden states, and the
    activation reads them in float32 either way. Raises ``ValueError`` for a wrong size,
    token count or device, ``TypeError`` for a wrong dtype or a non-tensor; each message
    names the argument and the fix.
    """
    x2 = _as_tokens(x, hidden, "x", device)
    g2 = _as_tokens(gammas, n, "gammas", device)
    if x2.dtype != dtype:
        raise error("ISL-K150", got=x2.dtype, want=dtype)
    if not g2.is_floating_point():
        raise TypeError(f"gammas is {g2.dtype}: the experts' weights are real numbers, pass gammas.float()")
    if g2.shape[0] != x2.shape[0]:
        raise ValueError(f"gammas has {g2.shape[0]} tokens but x has {x2.shape[0]}")
    return x2, g2


class SharedSink(nn.Module):
    """Inkling's shared-expert sink: ``w13 [n, 2F, H]``, ``w2 [n, H, F]``.

    ``forward(x [T, H] or [B, L, H], gammas [T, n] or [B, L, n]) -> out`` of ``x``'s
    shape: SwiGLU and the gamma weighting in float32, one cast back to the working
    dtype, the expert sum accumulated in float32. ``activation``: the model's gate
    activation (``config.hidden_act``, an ``ACTIVATIONS`` name); sglang's sink is SiLU.
    """

    def __init__(self, n_shared_experts: int, hidden_size: int, intermediate_size: int,
                 interleaved: bool = True, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, seed: int = 0, *, activation: str = "silu") -> None:
        super().__init__()
        activation_fn(activation)  # an unknown name is refused here, not at the first forward
        for name, value in (("n_shared_experts", n_shared_experts), ("hidden_size", hidden_size),
                            ("intermediate_size", intermediate_size)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"SharedSink: {name} must be an integer, got {value!r}")
        if min(n_shared_experts, hidden_size, intermediate_size) < 1:
            raise ValueError(
                "SharedSink needs n_shared_experts, hidden_size and intermediate_size of at least 1, got "
                f"{n_shared_experts}, {hidden_size}, {intermediate_size}")
        for name, value in (("n_shared_experts", n_shared_experts), ("hidden_size", hidden_size),
                            ("intermediate_size", intermediate_size)):
            check_size(f"SharedSink: {name}", value)
        check_dtype("SharedSink: dtype", dtype)
        self.n_shared_experts = n_shared_experts
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.interleaved = interleaved
        self.activation = activation
        n, H, F = n_shared_experts, hidden_size, intermediate_size
        self.w13 = nn.Parameter(allocate((n, 2 * F, H), "SharedSink: w13 [n, 2F, H]", dtype, device, "empty"),
                                requires_grad=False)
        self.w2 = nn.Parameter(allocate((n, H, F), "SharedSink: w2 [n, H, F]", dtype, device, "empty"),
                               requires_grad=False)
        self.reset_parameters(seed)
        self._lin_cache: tuple[tuple, tuple[torch.Tensor, torch.Tensor], int] | None = None

    @classmethod
    def from_geometry(cls, g: Geometry, interleaved: bool = True, dtype: torch.dtype = torch.float32,
                      device: torch.device | str | None = None, seed: int = 0) -> SharedSink:
        """A sink of ``g``'s ``n``, ``H`` and ``F`` (``il.PRESETS["inkling-tp8"]``, say)."""
        return cls(g.n, g.hidden, g.intermediate, interleaved, dtype, device, seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int = 0) -> None:
        """Seeded random weights, scaled so activations stay near unit size."""
        gen = torch.Generator(device="cpu").manual_seed(seed)
        H, F = self.hidden_size, self.intermediate_size
        self.w13.copy_(torch.randn(self.w13.shape, generator=gen) / math.sqrt(H))
        self.w2.copy_(torch.randn(self.w2.shape, generator=gen) / math.sqrt(F))

    @property
    def dtype(self) -> torch.dtype:
        return self.w13.dtype

    @property
    def device(self) -> torch.device:
        return self.w13.device

    def linearized(self, spare_rows: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """``(w13_lin [n*2F, H], w2_lin [n*F, H])``, cached until the weights change
        (new storage, or an in-place write: ``w2_lin`` is a copy). ``spare_rows``: at least
        this many rows after ``w2_lin``'s in its storage (``_down_cat``); the most ever asked
        for is kept across weight changes."""
        try:
            # nn.Module's __getattr__ costs ~0.7 µs a parameter; every forward asks for these.
            w13, w2 = self._parameters["w13"], self._parameters["w2"]
        except KeyError:  # a parametrized weight (torch.nn.utils.parametrize) is a property instead
            w13, w2 = self.w13, self.w2
        key, cache = (w13.data_ptr(), w13._version, w2.data_ptr(), w2._version), self._lin_cache
        if cache is None or cache[0] != key or cache[2] < spare_rows:
            spare = max(spare_rows, 0 if cache is None else cache[2])
            self._lin_cache = (key, linearize(w13.detach(), w2.detach(), spare), spare)
        return self._lin_cache[1]

    def _down_cat(self, rows: int) -> torch.Tensor:
        """``[n*F + rows, H]``: ``w2_lin``'s rows and ``rows`` more after them in the same storage,
        which a forward overwrites with its slots' down ``B^T`` to run the down expand as more of the
        down GEMM's ``K`` (``triton_backend._down_cat``, v27, one slot; ``_down_slot_cats``, v37, several)."""
        w2_lin = self.linearized(rows)[1]
        return w2_lin.as_strided((w2_lin.shape[0] + rows, w2_lin.shape[1]), w2_lin.stride(),
                                 w2_lin.storage_offset())

    def base_forward(self, x: torch.Tensor, gammas: torch.Tensor, form: Form = "linearized") -> torch.Tensor:
        """The sink without LoRA, in either form."""
        x2, g2 = check_tokens(x, gammas, n=self.n_shared_experts, hidden=self.hidden_size,
                              dtype=self.dtype, device=self.device)
        n, F = self.n_shared_experts, self.intermediate_size
        if form == "linearized":
            w13_lin, w2_lin = self.linearized()
            y = (x2 @ w13_lin.T).view(-1, n, 2 * F)
            act = swiglu_sink(y, g2, self.interleaved, activation=self.activation).reshape(-1, n * F)
            # A GEMM accumulates its sum over n*F in float32 inside; this is the expert sum.
            out = act @ w2_lin
        elif form == "per_expert":
            y = torch.einsum("th,efh->tef", x2, self.w13)
            act = swiglu_sink(y, g2, self.interleaved, activation=self.activation)
            acc = accumulation_dtype(act.dtype)
            out = torch.zeros(x2.shape[0], self.hidden_size, dtype=acc, device=x2.device)
            for e in range(n):
                out += (act[:, e] @ self.w2[e].T).to(acc)
        else:
            raise ValueError(f"form must be 'linearized' or 'per_expert', got {form!r}")
        return out.to(x.dtype).reshape(x.shape)

    def forward(self, x: torch.Tensor, gammas: torch.Tensor) -> torch.Tensor:  # noqa: D401
        """``x [T, H]`` (or ``[B, L, H]``), ``gammas [T, n]`` -> ``out`` like ``x``."""
        return self.base_forward(x, gammas)

    def extra_repr(self) -> str:
        layout = "interleaved" if self.interleaved else "contiguous"
        return (f"n={self.n_shared_experts}, H={self.hidden_size}, F={self.intermediate_size}, "
                f"{layout}, dtype={self.dtype}" + (f", activation={self.activation}" if self.activation != "silu" else ""))

