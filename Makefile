# The kit's two commands (README): `make lab` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: setup lab lab-reset test notebooks e2e clean

setup: $(STAMP)

# torch first, pinned to the CPU wheel these machines keep on disk; then the project,
# whose "torch>=2.4" is then already satisfied (no multi-GB CUDA download).
# setuptools' "Editable installation" notice is a box of asterisks about nothing to do: hidden.
$(STAMP): pyproject.toml
	@echo "first run: about 3 minutes (torch, JupyterLab and the kit into $(VENV)/); later runs start at once"
	@$(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q torch==2.13.0
	@PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q -e '.[dev]'
	@$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3" >/dev/null
	@touch $(STAMP)

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
	$(PY) -m pytest -n 2 --dist loadscope --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --durations=15

# Re-execute every notebook in place, so committed outputs are what the code gives today
# (gpu cells stay unrun without CUDA).
notebooks: setup
	$(PY) scripts/data/execute_notebooks.py notebooks/*.ipynb notebooks/03_errors/*.ipynb

clean:
	rm -rf $(VENV)
