"""pytest configuration shared by the unit tests and the notebook run (nbval).

* Notebook cells tagged ``gpu`` are skipped when CUDA is absent. They must be leaves:
  no later cell may need them. The count of skipped cells is printed, so nothing is
  skipped silently, and a notebook in which nothing ran fails the run.
* stderr is not compared: torch and matplotlib warnings differ across versions.
* Tests assert behaviour, never elapsed time: no hypothesis example has a deadline, and
  slow data generation on a busy machine is no failure (the ``kit`` profile).
* Under ``-n 2 --dist loadscope`` (``make test``) the browser test's module, a long
  scope (every notebook, one after the other, in one JupyterLab), starts first: the
  other worker runs the unit tests and the notebooks meanwhile, the longest unit modules
  first, so that both workers end on short scopes instead of the browser test or a long
  module starting late and running alone at the end.
* Notebook kernels (nbval's, and the browser test's JupyterLab's) fork from warm servers
  of this run's own (scripts/warm_kernel.py, in a folder named by INKLING_LAB_KERNEL_DIR,
  which the workers and JupyterLab inherit), stopped as the run ends.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("MPLBACKEND", "Agg")
settings.register_profile("kit", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kit")

_NB_STATS: dict[str, dict[str, int]] = {}
# Handed out first, in this order: the browser test (one scope, every notebook one after
# the other in one JupyterLab), then the unit modules that take longest (measured), so
# that the run ends on short scopes on both workers rather than on one long module on
# one of them (loadscope orders by number of tests, which put these last). A module
# missing here only loses its place in the queue.
_FIRST_SCOPES = ("tests/test_e2e_jupyterlab.py", "tests/test_parallel.py", "tests/test_triton.py",
                 "tests/test_upstream_vllm.py", "tests/test_files_and_cli_safety.py", "tests/test_widgets.py",
                 "tests/test_h200_pdl_script.py", "tests/test_hostile.py")


_KERNEL_SERVERS: list[str] = []  # the folder this run made for its warm kernel servers


def pytest_configure(config):
    if not hasattr(config, "workerinput") and "INKLING_LAB_KERNEL_DIR" not in os.environ:
        _KERNEL_SERVERS.append(tempfile.mkdtemp(prefix="inkling-kernels-"))
        os.environ["INKLING_LAB_KERNEL_DIR"] = _KERNEL_SERVERS[0]


def pytest_unconfigure(config):
    for folder in _KERNEL_SERVERS:  # `stop` returns once they have exited
        subprocess.run([sys.executable, str(Path(__file__).parent / "scripts" / "warm_kernel.py"), "stop", folder])
        shutil.rmtree(folder, ignore_errors=True)


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch is a dependency
        return False


def pytest_collectstart(collector):
    if collector.fspath and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("stderr",)


def pytest_collection_modifyitems(config, items):
    has_cuda = _cuda()
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is None:
            continue
        stats = _NB_STATS.setdefault(item.fspath.basename, {"cells": 0, "gpu_skipped": 0})
        stats["cells"] += 1
        tags = cell.get("metadata", {}).get("tags", [])
        if "gpu" in tags and not has_cuda:
            stats["gpu_skipped"] += 1
            item.add_marker(pytest.mark.skip(reason="gpu cell: CUDA is not available here"))
    for name, stats in _NB_STATS.items():
        if stats["cells"] and stats["cells"] == stats["gpu_skipped"]:
            raise pytest.UsageError(f"{name}: every code cell is gpu-only; the notebook would run nothing here")


def pytest_sessionfinish(session):
    # Under pytest-xdist the workers collect; hand their counts to the controller.
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["notebook_cells"] = json.dumps(_NB_STATS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    for name, stats in json.loads(getattr(node, "workeroutput", {}).get("notebook_cells", "{}")).items():
        _NB_STATS[name] = stats  # every worker collects every notebook: the counts agree


def pytest_terminal_summary(terminalreporter):
    if not _NB_STATS:
        return
    terminalreporter.section("notebook cells")
    for name, stats in sorted(_NB_STATS.items()):
        ran = stats["cells"] - stats["gpu_skipped"]
        terminalreporter.write_line(
            f"{name}: {ran} of {stats['cells']} code cells run, {stats['gpu_skipped']} gpu cells skipped (no CUDA)")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LongestFirst(LoadScopeScheduling):
        """loadscope, with the scopes of ``_FIRST_SCOPES`` handed out before the others, in
        that tuple's order."""

        def _assign_work_unit(self, node):
            for scope in reversed(_FIRST_SCOPES):
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)
