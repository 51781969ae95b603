"""``StaticIO``: the tensors a forward reads and writes in place, without a copy in or
out (``forward.static_io`` hands them out; the ``triton`` backend's graphs are captured
around them)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..operands import SinkOperands


@dataclass(frozen=True)
class StaticIO:
    """Tensors for a forward that copies nothing in or out: ``x [T, H]`` (the sink's
    dtype), ``gammas [T, n]`` and ``out [T, H]``, on the sink's device. Write a step's
    inputs into ``x`` and ``gammas`` (in place: ``copy_``, or the previous layer's own
    ``out=``), then ``sink(io.x, io.gammas, batch=batch, out=io.out)``. On the ``triton``
    backend's graph path they are the graph's own static tensors (passed back, each is
    recognized by identity, not by value, and not copied); the next call overwrites
    ``out``. Elsewhere they are ordinary tensors of those shapes."""

    x: torch.Tensor
    gammas: torch.Tensor
    out: torch.Tensor

    @staticmethod
    def empty(ops: SinkOperands, tokens: int, gammas_dtype: torch.dtype = torch.float32) -> "StaticIO":
        """Zero-filled tensors for ``tokens`` tokens of ``ops``' sink (zeros, not
        ``torch.empty``: a kernel or a print of them reads no stale memory)."""
        like = dict(dtype=ops.dtype, device=ops.device)
        return StaticIO(torch.zeros(tokens, ops.hidden, **like), torch.zeros(tokens, ops.n, dtype=gammas_dtype,
                                                                              device=ops.device),
                        torch.zeros(tokens, ops.hidden, **like))
