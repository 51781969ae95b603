"""JupyterLab started the README's way (scripts/lab.sh), on loopback, for one test run.

The server gets a random token, a free port and its own Jupyter config, data, runtime,
settings and workspace directories (and IPython's), so neither the user's Jupyter setup nor an earlier run changes what the
test sees, and the test changes nothing of theirs. Its working copies are its own
(``LAB_DIR``, a git-ignored folder beside ``notebooks/``), never a learner's ``lab/``.
JupyterLab runs with its defaults, autosave on, as a learner's does: the test proves
that a session changes nothing git tracks.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 15.0

LAB_DIR = "lab-e2e"
"""The test's working copies, beside notebooks/ (git-ignored); emptied before each run."""


class LabUnavailable(RuntimeError):
    """JupyterLab exited or did not answer on its port."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _process_table() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, start time in clock ticks)} of every live process."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it exited while we looked
        table[int(stat.parent.name)] = (int(fields[1]), int(fields[19]))
    return table


def _descendants(pid: int) -> set[tuple[int, int]]:
    """(pid, start time) of every live process below ``pid``. Kernels run in their own
    session, so signalling the server's process group alone would leave them behind."""
    table = _process_table()
    found: set[tuple[int, int]] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for child, (ppid, started) in table.items():
            if ppid == parent:
                found.add((child, started))
                todo.append(child)
    return found


def _kill_survivors(processes: set[tuple[int, int]]) -> None:
    """SIGKILL those of ``processes`` still alive; the start time guards against a reused pid."""
    table = _process_table()
    for pid, started in processes:
        if table.get(pid, (0, None))[1] == started:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class LabServer:
    """One JupyterLab process tree, from ``start`` to ``stop``; its log goes to ``log_path``."""

    def __init__(self, repo: Path, state_dir: Path, log_path: Path) -> None:
        self.repo = repo
        self.state_dir = state_dir
        self.log_path = log_path
        self.token = secrets.token_hex(24)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # The test process forces matplotlib's Agg backend (conftest); a person's shell
        # does not, and the kernel must draw inline as it does for them.
        env.pop("MPLBACKEND", None)
        # Kernel specs and lab extensions stay found: they live in the venv (sys.prefix).
        for name, sub in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"),
                          ("JUPYTER_RUNTIME_DIR", "runtime"), ("JUPYTERLAB_SETTINGS_DIR", "settings"),
                          ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"), ("IPYTHONDIR", "ipython")):
            env[name] = str(self.state_dir / sub)
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
        env["LAB_DIR"] = LAB_DIR
        return env

    def url(self, path: str) -> str:
        """``path`` on this server, with the token the browser needs to get in."""
        return f"{self.base_url}/{path.lstrip('/')}?token={self.token}"

    def start(self) -> None:
        """Launch scripts/lab.sh with the test's flags and wait until the server answers.

        Raises LabUnavailable, with the server's log, when it exits or does not answer.
        """
        command = [
            str(self.repo / "scripts" / "lab.sh"),
            "--no-browser",
            f"--IdentityProvider.token={self.token}",
            f"--port={self.port}",
            "--ServerApp.ip=127.0.0.1",
            # Fail on a taken port instead of quietly serving on another one.
            "--ServerApp.port_retries=0",
            # window.jupyterapp: the test reads cell outputs from the notebook model.
            "--LabApp.expose_app_in_browser=True",
        ]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.repo / LAB_DIR, ignore_errors=True)  # fresh copies, as on a first run
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(
                command, cwd=self.repo, env=self._environment(), stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise LabUnavailable(
                    f"JupyterLab exited with code {self._process.returncode} before answering on "
                    f"127.0.0.1:{self.port} (is the port taken?). Its log:\n{self.log_tail()}")
            if self._answers():
                return
            time.sleep(0.25)
        self.stop()
        raise LabUnavailable(
            f"JupyterLab did not answer on 127.0.0.1:{self.port} within {READY_TIMEOUT_S:.0f} s. "
            f"Its log:\n{self.log_tail()}")

    def _request(self, path: str, method: str = "GET", timeout: float = 2.0) -> bytes:
        request = urllib.request.Request(
            f"{self.base_url}/{path}", method=method,
            headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read()

    def _answers(self) -> bool:
        try:
            self._request("api/status")
        except (urllib.error.URLError, OSError):
            return False
        return True

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server's log (kernel start failures show up here)."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Shut the server and its kernels down: politely, then by signal. Idempotent."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        tree = _descendants(process.pid)
        try:
            self._request("api/shutdown", method="POST")
        except (urllib.error.URLError, OSError):
            pass  # the signals below do it
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        _kill_survivors(tree)
