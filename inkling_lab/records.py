"""Records the kit writes and reads back: the environment a run was made in, JSON files,
and the one relative error every comparison uses."""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import subprocess
from pathlib import Path
from typing import Any, Sequence

import torch

from .atomic import atomic_write


def json_ready(value: Any) -> Any:
    """``value`` for ``json.dumps(..., allow_nan=False)``: every NaN or infinite float becomes
    ``null``, and its mapping gains ``"<key>_not_finite"`` saying what it was (``"nan"``,
    ``"inf"``, ``"-inf"``), so that a script reads valid JSON and still learns why the
    number is missing. Lists keep their length (the reason of an element in a list is
    ``null``'s own: look at the other fields of the record)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            out[k] = json_ready(v)
            if isinstance(v, float) and not math.isfinite(v):
                out[f"{k}_not_finite"] = repr(v)
        return out
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (for records and labels)."""
    return str(dtype).removeprefix("torch.")


FLOAT64_ROUNDING = 64 * torch.finfo(torch.float64).eps
"""Two float64 computations of one value whose difference is at most this (~1.4e-14, relative
to the values compared) agree to rounding: how much, and where the largest difference falls,
changes from one CPU to another with the machine's matrix kernels, so reports print neither."""


def relative_error(out: torch.Tensor, ref: torch.Tensor, norm: str = "max") -> float:
    """``|out - ref| / |ref|`` in float64, 0 when both are zero.

    ``norm="max"``: the largest absolute difference over the largest absolute
    reference value (the kernels' and the shards' check); ``norm="fro"``: the
    Frobenius norms (the per-expert defect's size over a whole output).
    """
    if norm not in ("max", "fro"):
        raise ValueError(f"norm must be 'max' or 'fro', got {norm!r}")
    a, b = out.detach().cpu().double(), ref.detach().cpu().double()
    if not b.numel():
        return 0.0
    d = a - b
    diff, scale = ((d.abs().max(), b.abs().max()) if norm == "max" else (d.norm(), b.norm()))
    diff, scale = float(diff), float(scale)
    return diff / scale if scale else diff


def git_commit() -> str | None:
    """``INKLING_LAB_COMMIT`` when the caller sets it, else the checkout's commit.

    The caller's word comes first: a copy of the tree run elsewhere (a remote GPU
    machine) can sit inside another checkout whose ``git rev-parse HEAD`` names the
    wrong commit (the side-by-side records up to v8 carry such a field, see
    ``data/profiles/README.md``)."""
    told = os.environ.get("INKLING_LAB_COMMIT")
    if told:
        return told
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return commit if len(commit) == 40 else None


def environment(command: str) -> dict:
    """Device, versions, date, git commit and the command that made a record."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    cuda = torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "sm_count": torch.cuda.get_device_properties(0).multi_processor_count if cuda else None,
        "torch": torch.__version__, "triton": triton_version, "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(), "command": command,
    }


def write_json(path: str | os.PathLike, payload: dict) -> Path:
    """Write ``payload`` as JSON, atomically."""
    return atomic_write(path, (json.dumps(payload, indent=1) + "\n").encode())


def load_record(path: str | os.PathLike, required: Sequence[str] = ("environment",), what: str = "record",
                how: str = "") -> dict:
    """A JSON record; says which of the ``required`` keys are missing, and how to make one.
    Read only from a regular file (``ISL-K232``: a FIFO would block forever); a file that
    is no JSON is a ``ValueError`` naming it."""
    from .adapters import read_regular

    try:
        rec = json.loads(read_regular(path).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{path}: not a {what} (not JSON: {exc})") from None
    missing = [k for k in required if not isinstance(rec, dict) or k not in rec]
    if missing:
        hint = f"; make one with {how}" if how else ""
        raise ValueError(f"{path}: not a {what} (missing {missing}){hint}")
    return rec
