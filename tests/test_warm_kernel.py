"""Warm notebook kernels (scripts/warm_kernel.py): a kernel started by jupyter_client from
the kit's kernelspec is forked by a server that already imported the kit, and behaves as a
cold one: its own directory, environment, umask and random streams; interrupted, shut
down or orphaned as jupyter_client expects; started cold when no server can start.

Each kernel costs CPU: two warm kernels (one server) serve most tests, one cold one the fallback.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import warm_kernel  # noqa: E402

sys.path.pop(0)

GONE_TIMEOUT_S = 300.0
"""A guard against a hang, not a measure: a process that should exit has this long."""

PROBE = """
import json, os, random, sys
_kit_before = 'inkling_lab' in sys.modules
_torch_before = 'torch' in sys.modules
_umask = os.umask(0); os.umask(_umask)
_draws = [random.random()]
if _torch_before:
    import numpy, torch
    _draws += [numpy.random.random(), torch.rand(1).item()]
print(json.dumps({"cwd": os.getcwd(), "session": os.environ.get("JPY_SESSION_NAME"), "kit": _kit_before,
                  "torch": _torch_before, "pid": os.getpid(), "ppid": os.getppid(), "umask": _umask,
                  "draws": _draws}))
"""


@pytest.fixture(scope="module")
def kernels_dir(tmp_path_factory) -> Path:
    """The kernelspec ``install`` writes, under a scratch prefix (the venv's stays as it is)."""
    prefix = tmp_path_factory.mktemp("prefix")
    warm_kernel.install(str(prefix))
    return prefix / "share" / "jupyter" / "kernels"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    path = tmp_path_factory.mktemp("servers")
    path.chmod(0o700)
    yield path
    stopped = warm_kernel.stop_servers(path)  # as the test run's end does (conftest)
    assert stopped and not any(warm_kernel.running(pid) for pid in stopped), "a server outlived stop"


def _environment(kernels_dir: Path, servers: Path) -> dict[str, str]:
    """The test's environment, its servers in ``servers``, Jupyter finding the spec first."""
    return {**os.environ, warm_kernel.DIR_VARIABLE: str(servers), "JUPYTER_PATH": str(kernels_dir.parent)}


@contextlib.contextmanager
def _kernel(kernels_dir: Path, servers: Path, cwd: Path, **env: str):
    km = KernelManager(kernel_name=warm_kernel.KERNEL_NAME,
                       kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels_dir)]))
    km.start_kernel(cwd=str(cwd), env={**_environment(kernels_dir, servers), **env})
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _run(kc, code: str) -> tuple[dict, str]:
    """The execute reply's content and what the cell printed."""
    printed: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])

    reply = kc.execute_interactive(code, timeout=120, output_hook=hook)
    return reply["content"], "".join(printed)


def _probe(kc) -> dict:
    content, printed = _run(kc, PROBE)
    assert content["status"] == "ok", content
    return json.loads(printed)


def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while warm_kernel.running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not warm_kernel.running(pid)


@pytest.fixture(scope="module")
def two(kernels_dir, servers, tmp_path_factory):
    """Two warm kernels side by side of one server, each probed once at its start (umask
    027 here). Their environments differ only where JupyterLab's kernels differ, in
    ``JPY_SESSION_NAME``: the server has neither's, each kernel must see its own. The
    server was started ahead of them, as scripts/lab.sh does (``start``)."""
    cwd = tmp_path_factory.mktemp("cwd")
    subprocess.run([sys.executable, str(warm_kernel.SCRIPT), "start"], env=_environment(kernels_dir, servers),
                   check=True)
    old = os.umask(0o027)
    try:
        with _kernel(kernels_dir, servers, cwd, JPY_SESSION_NAME="first.ipynb") as a:
            with _kernel(kernels_dir, servers, cwd, JPY_SESSION_NAME="second.ipynb") as b:
                os.umask(old)
                yield cwd, [(km, kc, _probe(kc)) for km, kc in (a, b)]
    finally:
        os.umask(old)


def test_a_kernel_is_forked_warm_with_its_own_directory_environment_umask_and_seeds(two, servers):
    cwd, kernels = two
    (km_a, _, a), (km_b, _, b) = kernels
    for km, seen, session in ((km_a, a, "first.ipynb"), (km_b, b, "second.ipynb")):
        assert seen["kit"] and seen["torch"], "the kit was not imported before the first cell: a cold kernel"
        assert seen["pid"] != km.provisioner.pid, "the launcher ran the kernel itself (the cold fallback)"
        assert (seen["cwd"], seen["session"], seen["umask"]) == (str(cwd), session, 0o027)
    assert a["ppid"] == b["ppid"], "one environment, one server"
    logs = [p.read_text() for p in servers.glob("*.log")]
    assert sum(log.count("warm in") for log in logs) == 1, "not the server `start` started"
    # random, numpy and torch: each kernel draws its own, as two new processes would.
    assert all(x != y for x, y in zip(a["draws"], b["draws"], strict=True)), (a["draws"], b["draws"])


def test_interrupt_stops_a_busy_cell_and_shutdown_leaves_no_process(two):
    _, [(km, kc, seen), _] = two
    # stop_on_error=False: ipykernel would abort the next request too, cold or warm.
    msg_id = kc.execute("print('looping', flush=True)\nwhile True: pass", stop_on_error=False)
    while True:  # the cell's own code runs (ipykernel takes SIGINT only then) once it printed
        msg = kc.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            break
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=120)
    while reply["parent_header"].get("msg_id") != msg_id:  # a late kernel_info reply of the start
        reply = kc.get_shell_msg(timeout=120)
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    assert _run(kc, "print(6 * 7)")[1] == "42\n"  # and it still works
    km.shutdown_kernel()
    assert _wait_gone(seen["pid"]), "the kernel outlived its shutdown"
    assert not km.is_alive()


def test_a_killed_launcher_takes_its_kernel_with_it(two):
    _, [_, (km, _, seen)] = two
    os.kill(km.provisioner.pid, signal.SIGKILL)  # what shutdown_kernel(now=True) sends
    assert _wait_gone(seen["pid"]), "the kernel outlived its launcher"


def test_a_directory_that_would_shadow_an_imported_module_gets_a_cold_kernel(kernels_dir, servers, tmp_path):
    import inkling_lab

    (tmp_path / "torch.py").write_text("raise ImportError('the working directory has its own torch')\n")
    with _kernel(kernels_dir, servers, tmp_path) as (km, kc):
        shadowed = _probe(kc)
    assert shadowed["pid"] == km.provisioner.pid and not shadowed["torch"], "a warm kernel's torch is not its own"
    assert "would shadow the imported torch" in "".join(p.read_text() for p in servers.glob("*.log"))
    # The clone's own folder holds the kit a kernel imports from it: the same files, warm.
    with _kernel(kernels_dir, servers, ROOT) as (km, kc):
        here = _probe(kc)
    same = os.path.samefile(ROOT / "inkling_lab" / "__init__.py", inkling_lab.__file__)
    assert (here["pid"] != km.provisioner.pid) == same and here["cwd"] == str(ROOT)


def test_a_server_that_cannot_start_leaves_the_kernel_cold(kernels_dir, servers, tmp_path):
    # A PYTHONPATH whose torch cannot be imported: its own server (a new environment gets a
    # new one, the warm one of the tests above is not asked) dies warming up.
    broken = tmp_path / "broken" / "torch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('a torch that cannot be imported')\n")
    path = os.pathsep.join(filter(None, [str(broken.parent), os.environ.get("PYTHONPATH")]))
    with _kernel(kernels_dir, servers, tmp_path, PYTHONPATH=path, JPY_SESSION_NAME="cold.ipynb") as (km, kc):
        seen = _probe(kc)
    assert seen["pid"] == km.provisioner.pid, "not the launcher's own process: not the cold fallback"
    assert not seen["kit"] and not seen["torch"]
    assert (seen["cwd"], seen["session"]) == (str(tmp_path), "cold.ipynb")
    logs = "".join(p.read_text() for p in servers.glob("*.log"))
    assert "cannot warm up" in logs and "a torch that cannot be imported" in logs


def test_the_server_key_follows_what_imports_read_and_nothing_volatile():
    env = {"PATH": "/usr/bin", "PYTHONPATH": "/a", "JPY_PARENT_PID": "1", "PYTEST_CURRENT_TEST": "x"}
    key = warm_kernel.server_key(env, [])
    assert warm_kernel.server_key({**env, "JPY_PARENT_PID": "2", "JPY_SESSION_NAME": "n.ipynb",
                                   "PYTEST_XDIST_WORKER": "gw1", "SHLVL": "0", "_": "/usr/bin/jupyter"}, []) == key
    assert warm_kernel.server_key({**env, "PYTHONPATH": "/b"}, []) != key
    assert warm_kernel.server_key({**env, "MPLBACKEND": "Agg"}, []) != key
    assert warm_kernel.server_key(env, ["-Xfrozen_modules=off"]) != key


def test_a_folder_others_can_enter_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(OSError, match="only this user"):
        warm_kernel.server_dir({warm_kernel.DIR_VARIABLE: str(shared)})


def test_the_kernelspec_is_ipykernels_own_with_the_launcher_as_its_argv(kernels_dir):
    from ipykernel.kernelspec import RESOURCES, get_kernel_dict

    folder = kernels_dir / warm_kernel.KERNEL_NAME
    spec = json.loads((folder / "kernel.json").read_text())
    assert spec["argv"] == [sys.executable, "-Xfrozen_modules=off", str(warm_kernel.SCRIPT), "-f", "{connection_file}"]
    assert {k: v for k, v in spec.items() if k not in ("argv", "display_name")} == {
        k: v for k, v in get_kernel_dict().items() if k not in ("argv", "display_name")}
    assert {p.name for p in Path(RESOURCES).iterdir()} <= {p.name for p in folder.iterdir()}
    # The notebooks name it (tests/test_course.py): a notebook saved in JupyterLab keeps its metadata.
    assert spec["display_name"] == warm_kernel.DISPLAY_NAME
