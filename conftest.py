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
"""
from __future__ import annotations

import json
import os

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
