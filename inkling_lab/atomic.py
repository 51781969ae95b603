"""Atomic file writes: every file the kit writes (pool exports, sample adapters,
profile records, executed notebooks) goes through here.

What a writer may rely on:

* a reader never sees half a file: the data goes to a hidden temporary file
  ``.NAME.<pid>-<random>.tmp`` in the same folder, is flushed and fsynced, then takes
  the final name in one step; the folder is fsynced after that, so the new name
  survives a power loss;
* ``exclusive=True`` never replaces a file: the final name is taken with a hard link,
  which fails when the name exists, so of two writers racing for one new name exactly
  one wins and the other gets ``FileExistsError`` naming the file;
* the new file's mode is the umask's (``0o666 & ~umask``, as ``open()`` gives), and a
  replaced file keeps its mode;
* a failed write (full disk, read-only folder, an exception in the caller) leaves the
  old file, no temporary one, and raises an ``OSError`` that names the file;
* a writer killed mid-write leaves its temporary file behind (nothing can remove it at
  that moment); the next write of the same name removes such files whose process is
  gone and that are older than the current process.
"""
from __future__ import annotations

import errno
import os
import re
import secrets
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from .catalog import message

_STARTED = time.time()
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)-[0-9a-f]+\.tmp$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # someone else's process, or unknowable: keep its file
    return True


def remove_stale_temporaries(folder: Path, name: str) -> list[Path]:
    """Remove the temporary files of earlier, killed writes of ``folder/name``: those whose
    writing process no longer runs and that are older than this process. Returns them."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        m = _TEMP.match(entry.name)
        if m is None or m["name"] != name or int(m["pid"]) == os.getpid() or _alive(int(m["pid"])):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_mtime < _STARTED:
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            pass  # gone already, or not ours to remove
    return removed


def _named(exc: OSError, path: Path) -> OSError:
    """The same error, naming the file it was about (a full disk's ENOSPC names none)."""
    out = type(exc)(exc.errno, f"{exc.strerror or exc}: could not write {path.name}", str(path))
    out.add_note(f"output path: {path}")
    return out


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # a platform without directory fds
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename is still atomic
    finally:
        os.close(fd)


def file_kind(mode: int) -> str:
    """What an ``st_mode`` is, in words (``"a FIFO (named pipe)"``, ``"a directory"``...)."""
    return ("a regular file" if stat.S_ISREG(mode) else "a directory" if stat.S_ISDIR(mode)
            else "a symbolic link" if stat.S_ISLNK(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "not a regular file")


class OutputRefused(FileExistsError):
    """``check_target``'s refusal of an existing name (``ISL-K213``): it says what the name is."""


def _refusal(path: Path, text: str, reason: str, cls: type[Exception] = OutputRefused) -> Exception:
    exc = cls(message("ISL-K213", file=path.name or repr(text), reason=reason))
    exc.add_note(f"output path: {text!r}" if not text else f"output path: {path}")
    return exc


def check_target(path: str | os.PathLike[str], *, force: bool, folder: bool = False) -> Path:
    """``path`` as an output the kit may write (``ISL-K213`` for everything else), checked
    before any work: not empty, not a folder's name, its nearest existing parent a folder;
    if it exists, never a symbolic link (not it, not what it points to), a FIFO, a socket
    or a device, whatever ``force`` says; a regular file (``folder``: a directory) only
    with ``force``."""
    text = os.fspath(path)
    target = Path(text)
    if not text:
        raise _refusal(target, text, "the output path is empty: give a file name, e.g. -o pool.safetensors",
                       ValueError)
    if not folder and (text.endswith(os.sep) or target.name in ("", ".", "..")):
        raise _refusal(target, text, "it names a folder, not a file: add the file name, e.g. pool.safetensors",
                       IsADirectoryError)
    for parent in target.parents:
        try:
            mode = os.stat(parent).st_mode
        except FileNotFoundError:
            continue  # made when written (and removed again if the write fails)
        except OSError as exc:
            raise _refusal(target, text, f"its folder {parent} cannot be used ({exc.strerror})",
                           NotADirectoryError) from None
        if not stat.S_ISDIR(mode):
            raise _refusal(target, text, f"its folder {parent} is {file_kind(mode)}, not a folder", NotADirectoryError)
        break
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return target
    wanted = stat.S_ISDIR(mode) if folder else stat.S_ISREG(mode)
    if not wanted:
        what = "a folder" if folder else "a regular file"
        raise _refusal(target, text, f"it is {file_kind(mode)}, and --force (force=True in Python) replaces only "
                       f"{what}: never a symbolic link or what it points to, a FIFO, a socket, a device"
                       + ("" if folder else " or a folder"))
    if not force:
        raise _refusal(target, text, "it already exists; to replace it, pass --force on the command line "
                       "(force=True in Python)")
    return target


def _missing_folders(folder: Path) -> list[Path]:
    """The folders that ``folder.mkdir(parents=True)`` would create, deepest first."""
    missing = []
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _remove_folders(created: list[Path]) -> None:
    """Remove the folders a failed write made (deepest first), each only while empty."""
    for made in created:
        try:
            os.rmdir(made)
        except OSError:
            return


@contextmanager
def atomic_writer(path: str | os.PathLike[str], *, exclusive: bool = False) -> Iterator[BinaryIO]:
    """A binary file to write ``path`` through, atomically (see the module's promises).

    ``exclusive``: refuse (``FileExistsError``) when ``path`` exists, also when another
    writer creates it meanwhile. The folder is created if missing.
    """
    path = check_target(path, force=not exclusive)
    folder = path.parent
    created = _missing_folders(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _remove_folders(created)
        raise _named(exc, path) from None
    remove_stale_temporaries(folder, path.name)
    tmp = folder / f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as exc:
        _remove_folders(created)
        raise _named(exc, path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if not exclusive:
                try:
                    os.fchmod(f.fileno(), stat.S_IMODE(path.stat().st_mode))  # a replaced file keeps its mode
                except FileNotFoundError:
                    pass
            os.fsync(f.fileno())
        if exclusive:
            _link_new(tmp, path)
        else:
            check_target(path, force=True)  # again at the last moment: what the name is now is what is replaced
            os.replace(tmp, path)
        _fsync_dir(folder)
    except OutputRefused:
        tmp.unlink(missing_ok=True)
        _remove_folders(created)
        raise
    except FileExistsError:
        tmp.unlink(missing_ok=True)
        _remove_folders(created)
        raise _refusal(path, str(path), "it already exists (it appeared while this write ran, or was there "
                       "before); to replace it, pass --force on the command line (force=True in Python)",
                       FileExistsError) from None
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        _remove_folders(created)
        raise _named(exc, path) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        _remove_folders(created)
        raise


def _link_new(tmp: Path, path: Path) -> None:
    """Give ``tmp`` the name ``path`` only if no file has it (``FileExistsError`` else)."""
    try:
        os.link(tmp, path)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        # A filesystem without hard links (FAT, some FUSE mounts): check, then rename.
        # Not atomic against a racing writer, which these filesystems give no way to be.
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "exists", str(path)) from None
        os.replace(tmp, path)
        return
    tmp.unlink()


def atomic_write(path: str | os.PathLike[str], data: bytes, *, exclusive: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically (see ``atomic_writer``)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"atomic_write writes bytes, got {type(data).__name__}")
    with atomic_writer(path, exclusive=exclusive) as f:
        f.write(data)
    return Path(path)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a file written with a plain ``open`` to the disk (``atomic_folder``'s files)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_folder(path: str | os.PathLike[str], *, force: bool = False) -> Iterator[Path]:
    """A folder to write ``path`` through, atomically: the caller fills the hidden
    temporary folder ``.NAME.<pid>-<random>.tmp`` beside ``path`` (and may read it back:
    an export proves its output there), then every file in it and the folder are
    fsynced and it takes the final name in one rename.

    Without ``force`` an existing ``path`` is refused (``FileExistsError``), also when
    it appears meanwhile (a rename onto an existing folder fails). With ``force`` the
    old folder is renamed aside first and removed after the new one has its name, so
    a reader sees the old folder or the new one, and for one moment neither. Any
    failure (an exception in the caller included) removes the temporary folder and
    leaves ``path`` as it was.
    """
    import shutil

    path = Path(path)
    if os.path.lexists(path) or not os.fspath(path):
        check_target(path, force=force, folder=True)  # a FIFO, a device, a link or a file is never replaced
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _named(exc, path) from None

    def refuse() -> Exception:
        return _refusal(path, str(path), "it already exists; to replace it, pass --force on the command line "
                        "(force=True in Python)", FileExistsError)

    if os.path.lexists(path) and not force:  # early, before any work; the rename is the real guard
        raise refuse()
    tmp = folder / f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        tmp.mkdir()
    except OSError as exc:
        raise _named(exc, path) from None
    old = None
    try:
        yield tmp
        for entry in tmp.iterdir():
            fsync_file(entry)
        _fsync_dir(tmp)
        if force and os.path.lexists(path):
            old = folder / f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.old"
            os.rename(path, old)
        try:
            os.rename(tmp, path)  # onto an existing non-empty folder (or a file) this fails
        except OSError as exc:
            if old is not None:
                os.rename(old, path)
                old = None
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                raise refuse() from None
            raise
        _fsync_dir(folder)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, FileExistsError):
            raise
        raise _named(exc, path) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
