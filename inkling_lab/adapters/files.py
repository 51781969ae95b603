"""Adapter folders on disk: ``load_adapter`` (the header first, then only the shared-sink tensors; regular
files only, never pickle) and ``save_adapter`` (atomic)."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as save_safetensors_bytes

from ..atomic import atomic_write
from ..catalog import error, message
from .names import CONFIG_FILE, WEIGHTS_FILE, _refuse, _where
from .target_parameters import _as_target_parameters
from .adapter import Adapter


def as_path(what: str, value: object) -> Path:
    """``value`` as a ``Path`` if it is one (a ``str`` or ``os.PathLike``, not empty), else
    ``TypeError``/``ValueError`` naming ``what`` (Python's own words name neither the
    argument nor the call; an empty one would be the current folder)."""
    if isinstance(value, (str, os.PathLike)):
        if not os.fspath(value):  # Path("") is the current folder: never read in its place silently
            raise ValueError(f"{what} is an empty path: give the folder or file itself ('.' for the current folder)")
        return Path(value)
    raise TypeError(f"{what} must be a path (str or os.PathLike), got {type(value).__name__}: {value!r}"[:300])


def _adapter_folder(path: str | os.PathLike[str]) -> Path:
    p = as_path("the adapter folder", path)
    return p.parent if p.name in (CONFIG_FILE, WEIGHTS_FILE) else p


def load_adapter(path: str | os.PathLike[str], repair: bool = True, guess: bool = False,
                 module: str | None = None) -> Adapter:
    """Read a PEFT adapter folder (or its config or weights file) into an ``Adapter``.

    ``module``: read only that shared-sink module's factors (an ``Adapter.modules`` name,
    ``sink_modules`` lists them from the header), every other tensor named, not loaded,
    and no sha256 computed: one module of a large adapter in memory at a time (the
    export streams an adapter so); the checks are those of that module's factors.

    Safetensors only: a pickle checkpoint (``adapter_model.bin``) is refused, never
    opened. Errors name the file and tensor: ``ISL-K201`` no config, ``K202``
    malformed config, ``K203`` no weights file, ``K204`` corrupt weights, ``K205``
    a factor not 2D, ``K206`` a factor of another rank, ``K207`` a name that is no
    shared-sink projection, ``K208`` no shared-sink factor, ``K209`` an A without
    its B, ``K214`` gate and up (or two experts' copies) of different shapes. The
    sha256 of the weights file identifies the adapter in converted pools.
    """
    folder = _adapter_folder(path)
    source = str(folder)
    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    for path in (config_path, weights_path):  # a FIFO, a device or a folder under either name: said so, never opened
        try:
            check_regular(path)
        except ValueError as exc:
            raise _refuse(exc, folder) from None
    if not config_path.is_file():
        named = sorted(c.parent.name for c in folder.glob(f"*/{CONFIG_FILE}")) if folder.is_dir() else []
        if named:  # PEFT saves adapters other than "default" in subfolders named after them
            raise _refuse(error("ISL-K311", file=_where(source, CONFIG_FILE), names=", ".join(named),
                                folder=f"{folder.name}/{named[0]}"), folder)
        why = "" if folder.is_dir() else " (the folder does not exist)"
        raise _refuse(error("ISL-K201", folder=Path(source).name or source, why=why), folder)
    try:
        raw = read_regular(config_path)
    except ValueError as exc:  # no regular file after all (swapped meanwhile), or far past any config's size
        raise _refuse(exc, folder) from None
    try:
        config = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _refuse(error("ISL-K202", folder=Path(source).name or source, problem=f"not valid JSON ({exc})"),
                      folder) from None
    except RecursionError:
        raise _refuse(error("ISL-K202", folder=Path(source).name or source, problem="not valid JSON (nested too "
                            "deeply to read: a PEFT config is a flat object)"), folder) from None
    if not weights_path.is_file():
        pickled = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
        hint = (f" (found {', '.join(sorted(pickled))}: pickle checkpoints are never loaded, because "
                "unpickling runs code; re-save it with safetensors.torch.save_file)") if pickled else ""
        raise _refuse(error("ISL-K203", folder=Path(source).name or source, found=hint), folder)
    size = weights_path.stat().st_size
    try:
        # The header is parsed and checked against the file's size before any tensor
        # is read; then only the shared-sink factors are read, one tensor at a time.
        # Sorted, as safe_open lists them: normalization reports the first factor that
        # does not split.
        with open_safetensors(weights_path) as f:
            keys = sorted(f.keys())
            shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
            weights = {k: f.get_tensor(k) for k in keys if _is_sink_key(k)
                       and (module is None or sink_module_of(k) == module)}
    except (SafetensorError, ValueError, RuntimeError, OSError) as exc:
        raise _refuse(error("ISL-K204", folder=Path(source).name or source, size=size, reason=exc), folder) from None
    # with ``module``, the other sink modules' tensors are not this adapter's to check
    others = {k: _NOT_LOADED for k in keys if k not in weights and (module is None or not _is_sink_key(k))}
    try:
        return Adapter.from_state(config, {**weights, **others}, source=source,
                                  sha256=file_sha256(weights_path) if module is None else "",
                                  repair=repair, guess=guess, saved_shapes=shapes)
    except ValueError as exc:
        raise _refuse(exc, folder)


_NOT_LOADED = torch.empty(0, device="meta")
"""Stands for a tensor of another module: ``from_state`` only names those."""


HEADER_LIMIT = 100_000_000
"""safetensors' own limit on a header's declared size (bytes)."""


TEXT_LIMIT = 64 * 2 ** 20
"""The most bytes of a JSON file (a config, an index) the kit reads: real ones are kilobytes."""


def _kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "not a regular file")


def _not_regular(path: str | os.PathLike[str], kind: str) -> ValueError:
    return ValueError(message("ISL-K232", file=Path(path).name or os.fspath(path), kind=kind))


def check_regular(path: str | os.PathLike[str]) -> None:
    """Refuse ``path`` (``ISL-K232``) when it exists (symlinks followed) but is no regular
    file: a FIFO, a device, a socket or a directory. An absent path passes: the caller
    says that in its own words."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return
    if not stat.S_ISREG(mode):
        raise _not_regular(path, _kind(mode))


def open_regular(path: str | os.PathLike[str]) -> int:
    """A read-only file descriptor of ``path`` (symlinks followed), only if it is a regular
    file (else ``ISL-K232``). Opened non-blocking and checked on the descriptor itself, so
    that neither a FIFO nor a name swapped for one after a check can block the read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # what open() says for a socket
            raise _not_regular(path, "a socket") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_regular(path, _kind(mode))
    os.set_blocking(fd, True)
    return fd


def read_regular(path: str | os.PathLike[str], limit: int = TEXT_LIMIT) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (``ISL-K232`` for anything else
    but a regular file; ``ValueError`` naming the file past the limit)."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise ValueError(f"{Path(path).name}: {size} bytes, more than the {limit} a JSON file of this kind can "
                             "need: is it the right file?")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit + 1)[:limit]
    finally:
        os.close(fd)


class HeaderError(ValueError):
    """A safetensors header that cannot describe its file (``check_safetensors_header``)."""


def check_safetensors_header(fd: int, name: str) -> None:
    """Refuse a file whose safetensors header cannot be right, before anything is mapped or
    allocated: its 8-byte length past the file (or past safetensors' 100 MB), a header that
    is no JSON object, tensor data offsets past the file, or data that does not fill it."""
    size = os.fstat(fd).st_size
    if size < 8:
        raise HeaderError(f"{name}: {size} bytes, shorter than the 8-byte header length")
    declared = int.from_bytes(os.pread(fd, 8, 0), "little")
    if declared > min(size - 8, HEADER_LIMIT):
        raise HeaderError(f"{name}: its header declares {declared} bytes, but the file holds {size - 8} after the "
                         f"length (and safetensors reads at most {HEADER_LIMIT})")
    try:
        header = json.loads(os.pread(fd, declared, 8))
    except (ValueError, RecursionError) as exc:
        raise HeaderError(f"{name}: its header is not JSON ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise HeaderError(f"{name}: its header is not a JSON object")
    data, end = size - 8 - declared, 0
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) and 0 <= o <= data for o in offsets)):
            raise HeaderError(f"{name}: tensor {key!r} has data offsets {offsets!r} outside the file's {data} bytes "
                             "of tensor data")
        end = max(end, offsets[1])
    if end != data:
        raise HeaderError(f"{name}: its header describes {end} bytes of tensor data but the file holds {data}")


@contextmanager
def open_safetensors(path: str | os.PathLike[str]) -> Iterator[Any]:
    """``safe_open(path)`` (lazy, per tensor), for a regular file only (``ISL-K232``: a FIFO
    would block forever) whose header checks out against its size first
    (``check_safetensors_header``: nothing is mapped for a damaged or huge sparse file).
    The file is opened once, by Python, and handed over as ``/proc/self/fd/N`` where
    Linux has it: the file checked is the file read, and a path that is not UTF-8 (a
    Linux file name may be any bytes; safetensors takes only UTF-8 paths) works too."""
    name = os.fspath(path)
    fd = open_regular(name)
    try:
        check_safetensors_header(fd, Path(name).name)
        handle = f"/proc/self/fd/{fd}" if os.path.exists(f"/proc/self/fd/{fd}") else name
        with safe_open(handle, framework="pt") as f:
            yield f
    finally:
        os.close(fd)


def _is_sink_key(key: str) -> bool:
    return "shared_experts" in key


def sink_module_of(key: str) -> str | None:
    """The shared-sink module a tensor belongs to (its key up to the last ``shared_experts``,
    as ``FactorName.module`` names it), or None."""
    m = re.match(r"^(.*shared_experts)\.", key)
    return m[1] if m else None


def sink_modules(path: str | os.PathLike[str]) -> list[str]:
    """The shared-sink modules of an adapter folder's weights file, in the file's (sorted)
    key order, read from its header alone."""
    with open_safetensors(_adapter_folder(path) / WEIGHTS_FILE) as f:
        return list(dict.fromkeys(m for k in sorted(f.keys()) if (m := sink_module_of(k)) is not None))


def file_sha256(path: str | os.PathLike[str], chunk: int = 2 ** 24) -> str:
    """The sha256 of a file, read in 16 MiB chunks (bounded memory for any size)."""
    h = hashlib.sha256()
    with os.fdopen(open_regular(path), "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def save_adapter(adapter: Adapter, folder: str | os.PathLike[str], *, target_parameters: bool = False) -> Path:
    """Write ``adapter`` as a PEFT folder (config and safetensors, each atomically): its
    shared-sink factors under the kit's names (a ``target_parameters`` export is
    written per expert); other modules' tensors are not part of an ``Adapter``.

    ``target_parameters=True``: as PEFT's ``target_parameters`` export of transformers'
    ``InklingSharedExperts`` instead, for an adapter whose factors are named per expert
    as ``gate_proj``/``up_proj``/``down_proj`` (what PEFT itself writes for such a model,
    without needing PEFT: ``load_adapter`` reads it back to the same factors).
    """
    if not isinstance(adapter, Adapter):  # before anything is made on disk
        raise TypeError(f"save_adapter: adapter must be an Adapter (load_adapter, synthetic_adapter), got "
                        f"{type(adapter).__name__}")
    folder = as_path("save_adapter: folder", folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": "LORA", **adapter.config, "r": adapter.r, "lora_alpha": adapter.lora_alpha,
              "target_modules": adapter.target_modules}
    tensors = {k: v.contiguous() for k, v in adapter.weights.items()}
    if target_parameters:
        tensors, targets = _as_target_parameters(adapter.weights)
        config.update(target_modules=[], target_parameters=targets)
    atomic_write(folder / WEIGHTS_FILE, save_safetensors_bytes(tensors))
    atomic_write(folder / CONFIG_FILE, (json.dumps(config, indent=2, sort_keys=True) + "\n").encode())
    return folder
