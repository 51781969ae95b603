"""Notebook kernels that start warm: forked from a process that already imported torch,
the kit and ipykernel, instead of importing them again (about 2 s of CPU per kernel).

The kit's ``python3`` kernelspec (``install``, run by ``make setup``) starts this file;
``make lab`` (JupyterLab), the browser test and nbval (``--nbval-kernel-name python3``)
all start their kernels through it. One file, one job, three parts:

* **the launcher** (``warm_kernel.py -f CONNECTION_FILE``, the kernelspec's argv). It
  imports the standard library only: neither torch nor the kit. It asks the warm server
  of its environment (a Unix socket named by ``server_key``) to fork a kernel with its
  connection file, working directory, environment, umask and standard streams, starting
  the server on first use (under a lock, so racing launchers start one). jupyter_client
  signals the process it launched, so the launcher forwards those signals to the
  kernel's process group, watches its own parent as ipykernel's parent poller does, and
  exits as the kernel exits, with its status. Whatever fails before the kernel started
  (no fork, a socket error, a server that cannot import), it becomes today's kernel
  (``exec python -m ipykernel_launcher``): never worse than without it.
* **the server** (``warm_kernel.py serve SOCKET``, started by a launcher, in its own
  session, its output in ``SOCKET``'s ``.log``, never a terminal). It imports what a
  kernel imports before its first cell, then forks one kernel per request. The child
  takes the request's streams, session, directory, umask and environment, draws fresh
  random seeds where a new process would have them, and runs ``IPKernelApp`` with the
  request's arguments; it kills its process group when its launcher's socket closes (the
  launcher was killed). The server reaps each kernel and tells its launcher the exit
  status; it exits after ``IDLE_EXIT_S`` with no kernel, on ``stop``, or at once when a
  file it imported changed (a later launcher then starts a fresh one).
* ``install [--prefix P]`` writes the kernelspec (ipykernel's own, with this argv);
  ``start`` starts the server of its environment ahead of the first kernel (scripts/lab.sh);
  ``stop DIR`` asks every server under DIR to exit (the test run's, at its end).
"""
from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import socket
import stat
import sys
import time
from pathlib import Path

KERNEL_NAME = "python3"
DISPLAY_NAME = "Python 3"
SCRIPT = Path(__file__).resolve()
DIR_VARIABLE = "INKLING_LAB_KERNEL_DIR"
"""Where the servers' sockets, locks and logs live (default: a private folder of this
user under $XDG_RUNTIME_DIR or the temporary folder); the test run sets its own."""
IDLE_EXIT_S = 600.0
"""A server with no kernel exits after this long."""
VOLATILE_PREFIXES = ("JPY_", "PYTEST_")
"""Variables that differ from kernel to kernel of one JupyterLab or one pytest run and
that nothing a server imports reads at import (ipykernel reads ``JPY_PARENT_PID`` as a
default, passed to each kernel explicitly): left out of the server's key and environment,
with bash's own ``_`` (the command it ran last) and ``SHLVL`` (one less for what it
``exec``s): scripts/lab.sh's ``start`` and the JupyterLab it ``exec``s differ there."""
VOLATILE_NAMES = ("_", "SHLVL")


def _kept(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in VOLATILE_NAMES and not k.startswith(VOLATILE_PREFIXES)}
FORWARDED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
                  if hasattr(signal, name))  # where there is no fork (Windows) the kernel starts cold
SPAWN_TIMEOUT_S = 60.0
"""How long a launcher waits for a server it started to listen (it listens before it imports)."""


def interpreter_flags() -> list[str]:
    """The interpreter's own options this process was started with (``-Xfrozen_modules=off``
    from the kernelspec), for the server and for the fallback kernel."""
    return sys.orig_argv[1:len(sys.orig_argv) - len(sys.argv)]


def server_key(env: dict[str, str], flags: list[str]) -> str:
    """The name of the server that may fork a kernel for ``env``: one per interpreter, its
    options, this file's version and every variable that can change what an import gives
    (PYTHONPATH, the locale, thread counts, MPLBACKEND, ...), i.e. all but the volatile ones."""
    mark = SCRIPT.stat()
    kept = sorted(_kept(env).items())
    blob = json.dumps([sys.executable, flags, str(SCRIPT), mark.st_mtime_ns, mark.st_size, kept])
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def server_dir(env: dict[str, str]) -> Path:
    """The folder of this user's servers, created private (0700); OSError when it is not
    (another user's folder, a file): the launcher then starts the kernel cold."""
    told = env.get(DIR_VARIABLE)
    base = Path(env.get("XDG_RUNTIME_DIR") or env.get("TMPDIR") or "/tmp")
    path = Path(told) if told else base / f"inkling-lab-kernels-{os.getuid()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    mark = path.lstat()
    if not stat.S_ISDIR(mark.st_mode) or mark.st_uid != os.getuid() or mark.st_mode & 0o077:
        raise OSError(f"{path}: not a folder only this user can use")
    return path


def _send(conn: socket.socket, message: dict) -> None:
    conn.sendall((json.dumps(message) + "\n").encode())


def _messages(conn: socket.socket, tick: float | None = None):
    """Each newline-ended JSON message on ``conn`` until it closes; ``None`` after each
    ``tick`` seconds without one."""
    buffer = b""
    while True:
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield json.loads(line)
        if not select.select([conn], [], [], tick)[0]:
            yield None
            continue
        chunk = conn.recv(65536)
        if not chunk:
            return
        buffer += chunk


# ---------------------------------------------------------------- the launcher


class _Forwarder:
    """Forwards the signals jupyter_client sends the launcher (interrupt, terminate) to
    the kernel's process group; those that come before the kernel's pid wait for it."""

    def __init__(self) -> None:
        self.kernel = 0
        self.pending: list[int] = []
        for signum in FORWARDED:
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame) -> None:
        if self.kernel:
            self.send(signum)
        else:
            self.pending.append(signum)

    def send(self, signum: int) -> None:
        try:
            os.killpg(self.kernel, signum)
        except ProcessLookupError:
            pass  # it has just exited; the server will say how

    def start(self, pid: int) -> None:
        self.kernel = pid
        for signum in self.pending:
            self.send(signum)

    def restore(self) -> None:
        """Default handlers, then the signals that came while there was no kernel (a
        SIGTERM during the start still ends the start, as it would end a cold kernel's)."""
        for signum in FORWARDED:
            signal.signal(signum, signal.SIG_DFL if signum != signal.SIGINT else signal.default_int_handler)
        for signum in self.pending:
            os.kill(os.getpid(), signum)


def _connect(path: Path) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        return None
    return conn


def _spawn(path: Path, flags: list[str], env: dict[str, str]) -> socket.socket | None:
    """Connect to the server at ``path``, starting it first if none listens; one launcher
    at a time (``flock``), so that racing launchers start one server."""
    import fcntl
    import subprocess

    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn = _connect(path)
        if conn is not None:
            return conn
        with open(path.with_suffix(".log"), "ab") as log:
            server = subprocess.Popen(
                [sys.executable, *flags, str(SCRIPT), "serve", str(path)], cwd=path.parent,
                env=_kept(env),
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + SPAWN_TIMEOUT_S
        while server.poll() is None and time.monotonic() < deadline:
            conn = _connect(path)
            if conn is not None:
                return conn
            time.sleep(0.01)
        return None


def _request_kernel(argv: list[str], flags: list[str], env: dict[str, str]):
    """A forked kernel: (its pid, the messages of its socket, which end with its exit
    status), or None when no server could start one (the caller starts it cold)."""
    path = server_dir(env) / f"{server_key(env, flags)}.sock"
    umask = os.umask(0)
    os.umask(umask)
    request = (json.dumps({"argv": argv, "cwd": os.getcwd(), "env": env, "umask": umask}) + "\n").encode()
    for attempt in range(2):  # the second after a server that retired or died meanwhile
        conn = (_connect(path) if attempt == 0 else None) or _spawn(path, flags, env)
        if conn is None:
            return None
        messages = _messages(conn, tick=1.0)
        first: dict = {}
        try:
            sent = socket.send_fds(conn, [request], [0, 1, 2])
            conn.sendall(request[sent:])
            deadline = time.monotonic() + SPAWN_TIMEOUT_S  # a warming server answers late
            first = next(m for m in messages if m is not None or time.monotonic() > deadline) or {}
        except (OSError, ValueError, StopIteration):
            pass
        if "pid" in first:
            return first["pid"], messages
        conn.close()
        if "refused" in first:  # this request cannot be served warm (_Server._refusal)
            return None
    return None


def _watch_parent(env: dict[str, str]):
    """A check that says when the launcher's parent (the Jupyter server, nbval) is gone,
    as ipykernel's ParentPollerUnix decides it for a cold kernel."""
    told = int(env.get("JPY_PARENT_PID") or 0)
    parent = told if told and told == os.getppid() else 0
    if not told:
        return lambda: False
    return lambda: os.getppid() != parent if parent else os.getppid() == 1


def launch(argv: list[str]) -> None:
    """Run the kernel for ipykernel's arguments ``argv`` (``-f CONNECTION_FILE``): forked
    by the warm server, or, when that fails before the kernel started, cold in this
    process. Returns never: exits with the kernel's status."""
    flags, env = interpreter_flags(), dict(os.environ)
    forwarder = _Forwarder()
    try:
        started = _request_kernel(argv, flags, env) if hasattr(os, "fork") else None
    except OSError:
        started = None
    if started is None:
        forwarder.restore()
        os.execv(sys.executable, [sys.executable, *flags, "-m", "ipykernel_launcher", *argv])
    pid, messages = started
    forwarder.start(pid)
    orphaned = _watch_parent(env)
    for message in messages:
        if message is None:
            if orphaned():  # as a cold kernel's parent poller: the kernel goes too
                forwarder.send(signal.SIGKILL)
                os._exit(1)
        elif "exit" in message:
            code = message["exit"]
            if code < 0:  # killed by a signal: die of the same one
                signal.signal(-code, signal.SIG_DFL)
                os.kill(os.getpid(), -code)
            sys.exit(code)
    sys.exit(1)  # the server went away without a word; the kernel has exited


# ---------------------------------------------------------------- the server


def _log(text: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [{os.getpid()}] {text}", file=sys.stderr, flush=True)


def _threads() -> int:
    """This process's threads, native ones included (Linux; elsewhere Python's count)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def _top_level(names) -> set[str]:
    return {name.partition(".")[0] for name in names}


class _Server:
    """One warm server: listens on ``path``, imports, then forks kernels (``run``)."""

    def __init__(self, path: Path) -> None:
        self.path, self.pid = path, os.getpid()
        self.kernels: dict[int, socket.socket] = {}
        path.unlink(missing_ok=True)  # a dead server's; a live one would have answered
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(64)
        self.inode = path.stat().st_ino
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)

    def warm_up(self) -> None:
        """Import what a kernel imports before its first cell: ipykernel (before the
        working directory is on sys.path, as ipykernel_launcher does), then torch and the
        kit (a notebook's first import, with it). Nothing that depends on the kernel:
        matplotlib picks its backend from MPLBACKEND, which ipykernel sets at kernel start;
        ipywidgets registers its comm target only inside a running kernel. numpy.random,
        seeded at its import, stays unimported (each kernel seeds its own)."""
        started, env = time.monotonic(), dict(os.environ)
        if sys.path and Path(sys.path[0] or ".").resolve() == SCRIPT.parent:
            del sys.path[0]  # this file's folder: a cold kernel has no such entry
        import ipykernel.ipkernel  # noqa: F401
        import ipykernel.kernelapp  # noqa: F401

        before = set(sys.modules)
        import torch
        import inkling_lab  # noqa: F401

        # Top-level modules a cold kernel imports with its working directory first on
        # sys.path: a folder holding one of them would shadow it there (_refusal).
        self.shadowable = _top_level(set(sys.modules) - before) - _top_level(before)
        # What these imports set in the environment (an import may: torch's inductor sets
        # TORCHINDUCTOR_CACHE_DIR), each kernel's environment gets too, as a cold one would.
        self.env_added = {k: v for k, v in os.environ.items() if env.get(k) != v}
        self.files = self._files()
        self.threads = _threads()
        # This torch seeds its default generator at random in each new process (a fresh
        # Generator gets the fixed default seed): so must each kernel.
        self.reseed_torch = torch.default_generator.initial_seed() != torch.Generator().initial_seed()
        _log(f"warm in {time.monotonic() - started:.1f} s: {sys.executable} torch {torch.__version__}, "
             f"{len(self.files)} files, {self.threads} threads")

    @staticmethod
    def _files() -> dict[str, tuple[int, int]]:
        marks = {}
        for module in list(sys.modules.values()):
            name = getattr(module, "__file__", None)
            if name:
                try:
                    mark = os.stat(name)
                except OSError:
                    continue
                marks[name] = (mark.st_mtime_ns, mark.st_size)
        return marks

    def _changed(self) -> str | None:
        for name, mark in self.files.items():
            try:
                now = os.stat(name)
            except OSError:
                return name
            if (now.st_mtime_ns, now.st_size) != mark:
                return name
        return None

    def _refusal(self, request: dict, fds: list[int]) -> str | None:
        """Why this request cannot have a forked kernel that behaves as a cold one, if so."""
        import threading

        if len(fds) != 3:
            return "it did not bring its three standard streams"
        if threading.active_count() > 1 or _threads() > self.threads:
            # Only the threads the imports started may run at a fork: OpenBLAS's pool,
            # which its own fork handler stops first (and starts again on its next use).
            return "a thread started since the imports"
        try:
            here = os.listdir(request["cwd"])
        except OSError as error:
            return f"cannot list the working directory: {error}"
        from importlib.machinery import all_suffixes

        suffixes = tuple(all_suffixes())
        for entry in here:
            name = entry
            for suffix in suffixes:
                if entry.endswith(suffix):
                    name = entry[:-len(suffix)].partition(".")[0]
                    break
            found = os.path.join(request["cwd"], entry, "__init__.py") if entry == name else os.path.join(
                request["cwd"], entry)
            imported = getattr(sys.modules.get(name), "__file__", None) if name in self.shadowable else None
            if imported and os.path.isfile(found) and not os.path.samefile(found, imported):
                return f"{found} would shadow the imported {name} ({imported})"
        return None

    def _retire(self) -> None:
        """Stop listening: a later launcher starts a new server on this path."""
        if self.listener.fileno() >= 0:
            self.listener.close()
            try:
                if self.path.stat().st_ino == self.inode:
                    self.path.unlink()
            except OSError:
                pass

    def _reap(self) -> None:
        while self.kernels:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            conn = self.kernels.pop(pid, None)
            if conn is not None:
                try:
                    _send(conn, {"exit": code})
                except OSError:
                    pass  # its launcher is gone (killed): nobody to tell
                conn.close()
            _log(f"kernel {pid} exited ({code}); {len(self.kernels)} left")

    def _accept(self):
        """Serve one connection; returns (socket, request, fds) in a forked kernel only.
        The socket's folder is this user's alone (server_dir): no one else connects."""
        conn, _ = self.listener.accept()
        fds: list[int] = []
        try:
            conn.settimeout(10.0)
            data = b""
            while not data.endswith(b"\n"):
                chunk, more, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                if not chunk and not data:  # a look (``start``): nothing to serve
                    conn.close()
                    return None
                if not chunk:
                    raise OSError("closed before its request ended")
                data, fds = data + chunk, fds + more
            request = json.loads(data)
            conn.settimeout(None)
        except (OSError, ValueError) as error:
            _log(f"a request failed: {error}")
            for fd in fds:
                os.close(fd)
            conn.close()
            return None
        if request.get("stop"):
            self._retire()
            _send(conn, {"stopping": self.pid, "kernels": len(self.kernels)})
            conn.close()
            return None
        changed = self._changed()
        refusal = None if changed else self._refusal(request, fds)
        if changed or refusal:
            if changed:
                _log(f"stale ({changed} changed): retiring")
                self._retire()  # before the answer: the launcher's next try starts a fresh server
            else:
                _log(f"refused: {refusal}")
            _send(conn, {"stale": changed} if changed else {"refused": refusal})
            for fd in fds:
                os.close(fd)
            conn.close()
            return None
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.listener.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            for other in self.kernels.values():
                other.close()
            return conn, request, fds
        for fd in fds:
            os.close(fd)
        self.kernels[pid] = conn
        _log(f"kernel {pid} in {request['cwd']}")
        return None

    def run(self):
        """Serve until idle, stopped or stale (and then until its kernels exited); returns
        (socket, request, fds) in a forked kernel, None in the server as it exits."""
        idle_since = time.monotonic()
        try:
            while self.kernels or self.listener.fileno() >= 0:
                timeout = None if self.kernels else idle_since + IDLE_EXIT_S - time.monotonic()
                if timeout is not None and timeout <= 0:
                    _log("idle: exiting")
                    return None
                watched = [self.wake_r] + ([self.listener] if self.listener.fileno() >= 0 else [])
                ready = select.select(watched, [], [], timeout)[0]
                if self.wake_r in ready:
                    os.read(self.wake_r, 4096)
                self._reap()
                if self.listener in ready:
                    child = self._accept()
                    if child is not None:
                        return child
                if ready and not self.kernels:
                    idle_since = time.monotonic()
            return None
        finally:
            if os.getpid() == self.pid:
                self._retire()


def _become_kernel(server: _Server, conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked child: the request's process, then ipykernel's app (returns as the
    kernel shuts down; the interpreter then exits as a cold kernel's does)."""
    import threading

    os.setsid()  # its own session and process group, as jupyter_client gives a cold kernel
    for fd, target in zip(fds, (0, 1, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.update(server.env_added)
    # Fresh seeds where a new process has them: Python's random reseeds itself in a forked
    # child (random.py, os.register_at_fork); numpy.random is not imported yet (warm_up).
    if server.reseed_torch:
        import torch

        torch.default_generator.seed()

    def watch_launcher() -> None:  # a killed launcher closes its end: the kernel goes too
        while conn.recv(4096):
            pass
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch_launcher, name="warm-kernel-launcher", daemon=True).start()
    import ipykernel_launcher
    from ipykernel.kernelapp import IPKernelApp

    sys.argv = [ipykernel_launcher.__file__, *request["argv"]]
    parent = int(request["env"].get("JPY_PARENT_PID") or 0)  # its default was read in the server
    _send(conn, {"pid": os.getpid()})
    IPKernelApp.launch_instance(argv=[*request["argv"], f"--IPKernelApp.parent_handle={parent}"])


def serve(path: Path) -> int:
    """The server's life; in each forked kernel, the kernel's."""
    server = _Server(path)
    try:
        server.warm_up()
    except BaseException:
        import traceback

        _log("cannot warm up:\n" + traceback.format_exc())
        server._retire()
        return 1
    child = server.run()
    if child is None:
        used = os.times()
        _log(f"exiting; CPU {used.user + used.system:.1f} s, its kernels' {used.children_user + used.children_system:.1f} s")
        return 0
    _become_kernel(server, *child)
    return 0


# ---------------------------------------------------------------- install, stop


def install(prefix: str | None = None) -> Path:
    """Install the kernelspec ``python3`` under ``prefix`` (default: this environment,
    ``sys.prefix``): ipykernel's own (resources, metadata) with this file as its argv.
    Returns the folder it wrote."""
    import tempfile

    from ipykernel.kernelspec import write_kernel_spec
    from jupyter_client.kernelspec import KernelSpecManager

    # -Xfrozen_modules=off as ipykernel's own spec has it (JupyterLab's debugger needs it).
    argv = [sys.executable, "-Xfrozen_modules=off", str(SCRIPT), "-f", "{connection_file}"]
    with tempfile.TemporaryDirectory() as scratch:
        staged = write_kernel_spec(Path(scratch) / KERNEL_NAME, overrides={"argv": argv, "display_name": DISPLAY_NAME})
        return Path(KernelSpecManager().install_kernel_spec(staged, KERNEL_NAME, prefix=prefix or sys.prefix))


def start_server() -> bool:
    """Start the server a kernel of this environment would ask for, if the kernelspec
    ``python3`` Jupyter finds here is this file's (``make lab`` does, as JupyterLab boots,
    so that the first notebook's kernel is warm too); returns whether one listens."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        argv = KernelSpecManager().get_kernel_spec(KERNEL_NAME).argv
        flags = argv[1:argv.index(str(SCRIPT))]
    except (NoSuchKernel, ValueError):
        return False
    if argv[0] != sys.executable:
        return False
    env = dict(os.environ)
    try:
        conn = _spawn(server_dir(env) / f"{server_key(env, flags)}.sock", flags, env)
    except OSError:
        return False
    if conn is None:
        return False
    conn.close()
    return True


def stop_servers(directory: Path, wait_s: float = 10.0) -> list[int]:
    """Ask every server under ``directory`` to exit (each does once its kernels have) and
    wait up to ``wait_s`` for them to be gone; returns the pids that answered."""
    pids = []
    for path in Path(directory).glob("*.sock"):
        conn = _connect(path)
        if conn is None:
            continue
        with conn:
            try:
                _send(conn, {"stop": True})
                answer = next(_messages(conn), {})
            except (OSError, ValueError):
                continue
        if "stopping" in answer:
            pids.append(answer["stopping"])
    deadline = time.monotonic() + wait_s
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return pids


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"] and len(argv) == 2:
        return serve(Path(argv[1]))
    if argv[:1] == ["install"]:
        prefix = argv[2] if argv[1:2] == ["--prefix"] and len(argv) == 3 else None
        if len(argv) != (3 if prefix else 1):
            raise SystemExit("usage: warm_kernel.py install [--prefix PREFIX]")
        print(f"installed kernelspec {KERNEL_NAME} in {install(prefix)}")
        return 0
    if argv == ["start"]:
        return 0 if start_server() else 1
    if argv[:1] == ["stop"] and len(argv) == 2:
        stop_servers(Path(argv[1]))
        return 0
    launch(argv)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
