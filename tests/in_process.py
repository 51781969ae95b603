"""``inkling-lab`` run inside the test's own process, for the tests that read only what a
command prints and the status it exits with: a launch of ``python -m inkling_lab.cli``
pays torch's import (seconds on a busy 2-core machine) for a run of milliseconds.

What the process would give the command is emulated: stdout and stdin as byte streams
with the encoding and error handler ``PYTHONIOENCODING`` names (stderr keeps
``backslashreplace``, as CPython's own stderr does), stdin empty unless given, the
environment the test sets, warnings printed to stderr once per run as a fresh
interpreter prints them, and argparse's ``SystemExit`` as the exit status. An exception
the command lets out is not caught: the test fails on it, where the process would have
printed a traceback. Tests whose point is the process (signals, resource limits, the
console script) launch it instead; a command that could block on what it is given (a
FIFO, ``/dev/zero``) runs in a forked child (``forked_cli``), whose hang guard is the
parent's."""
from __future__ import annotations

import io
import os
import pickle
import select
import signal
import subprocess
import sys
import warnings
from typing import Mapping

from inkling_lab.cli import main


def _stream(environ: Mapping[str, str], errors: str) -> io.TextIOWrapper:
    """A text stream over bytes, encoded as ``PYTHONIOENCODING`` asks ("name:errors")."""
    name, _, asked = environ.get("PYTHONIOENCODING", "").partition(":")
    return io.TextIOWrapper(io.BytesIO(), encoding=name or "utf-8", errors=asked or errors, write_through=True)


def run_cli(*argv: str, env: Mapping[str, str] | None = None, input: bytes = b"") -> subprocess.CompletedProcess:
    """``main(argv)`` as ``subprocess.run([python, -m, inkling_lab.cli, *argv], input=input,
    capture_output=True, env={**os.environ, **env})`` would see it: exit status, stdout and
    stderr bytes."""
    saved_env, saved = dict(os.environ), (sys.stdin, sys.stdout, sys.stderr)
    os.environ.update(env or {})
    stdout, stderr = _stream(os.environ, "strict"), _stream(os.environ, "backslashreplace")
    stdin = io.TextIOWrapper(io.BytesIO(input), encoding=stdout.encoding, errors=stdout.errors)
    sys.stdin, sys.stdout, sys.stderr = stdin, stdout, stderr
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")  # a fresh interpreter's filters, not pytest's recorder
            warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: sys.stderr.write(
                warnings.formatwarning(message, category, filename, lineno, line))
            try:
                code = main(list(argv))
            except SystemExit as exc:  # argparse: --help, a usage error
                code = exc.code if isinstance(exc.code, int) else 1
        stdout.flush()
        stderr.flush()
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["inkling-lab", *argv], code or 0, stdout.buffer.getvalue(),
                                       stderr.buffer.getvalue())


def forked_cli(*argv: str, hang_guard: float) -> subprocess.CompletedProcess:
    """``run_cli(*argv)`` in a forked child of this process, for a command that could block
    forever on what it is given (a FIFO, ``/dev/zero``): the child has nothing to import,
    and the hang guard is the parent's, an event: it waits until the child's result comes
    through a pipe (at once when the command returns), for at most ``hang_guard`` seconds,
    then kills the child and fails. The child never returns into the test session."""
    readable, writable = os.pipe()
    child = os.fork()
    if child == 0:
        status = 70
        try:
            os.close(readable)
            result = run_cli(*argv)
            with os.fdopen(writable, "wb") as pipe:
                pipe.write(pickle.dumps((result.returncode, result.stdout, result.stderr)))
            status = 0
        finally:
            os._exit(status)
    os.close(writable)
    with os.fdopen(readable, "rb") as pipe:
        ready, _, _ = select.select([pipe], [], [], hang_guard)
        if not ready:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            raise AssertionError(f"inkling-lab {' '.join(argv)} did not return within {hang_guard} s")
        data = pipe.read()
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and data, f"the forked run died: status {status}"
    code, stdout, stderr = pickle.loads(data)
    return subprocess.CompletedProcess(["inkling-lab", *argv], code, stdout, stderr)
