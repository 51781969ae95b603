# The kit's two commands (README): `make lab` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
KERNELSPEC := $(VENV)/share/jupyter/kernels/python3/kernel.json

.PHONY: setup lab lab-reset test notebooks e2e clean

setup: $(STAMP) $(KERNELSPEC)

# torch first, pinned to the CPU wheel these machines keep on disk; then the project,
# whose "torch>=2.4" is then already satisfied (no multi-GB CUDA download).
# setuptools' "Editable installation" notice is a box of asterisks about nothing to do: hidden.
$(STAMP): pyproject.toml
	@echo "first run: about 3 minutes (torch, JupyterLab and the kit into $(VENV)/); later runs start at once"
	@$(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q torch==2.13.0
	@PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

# Notebook kernels start warm, forked from a process that already imported torch and the
# kit (scripts/warm_kernel.py): the venv's kernelspec python3, which JupyterLab and nbval
# find before a user's own, runs its launcher. Rewritten whenever the launcher changes,
# so an existing .venv gets it too.
$(KERNELSPEC): scripts/warm_kernel.py $(STAMP)
	@$(PY) scripts/warm_kernel.py install >/dev/null

# The same launch script the end-to-end browser test drives (tests/e2e/lab.py). It opens
# your working copies in lab/ (git-ignored, made on the first run): the tracked notebooks
# stay as they are. `make lab-reset` moves lab/ aside (to lab-backups/) and copies afresh.
lab: setup
	@VENV=$(VENV) scripts/lab.sh

lab-reset: setup
	@$(PY) scripts/lab_copies.py --reset

e2e: setup
	$(PY) -m pytest -m e2e tests/test_e2e_jupyterlab.py

test: setup
	$(PY) -m pytest -n 2 --dist loadscope --nbval --nbval-kernel-name python3 --nbval-sanitize-with tests/nbval_sanitize.cfg --durations=15

# Re-execute every notebook in place, so committed outputs are what the code gives today
# (gpu cells stay unrun without CUDA).
notebooks: setup
	$(PY) scripts/data/execute_notebooks.py notebooks/*.ipynb notebooks/03_errors/*.ipynb

clean:
	rm -rf $(VENV)
