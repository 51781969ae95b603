#!/usr/bin/env bash
# The one way the kit starts JupyterLab: `make lab` and the end-to-end browser test
# (tests/test_e2e_jupyterlab.py) both come through here, so the test proves the command
# the README tells people to run. Extra arguments go to `jupyter lab` unchanged, e.g.
#   scripts/lab.sh --no-browser --port=8890
# VENV picks the virtual environment (default .venv, as in the Makefile).
set -euo pipefail
cd "$(dirname "$0")/.."
# Jupyter refuses to start as root unless told; containers and CI run as root.
as_root=()
if [ "$(id -u)" = 0 ]; then as_root=(--allow-root); fi
exec "${VENV:-.venv}/bin/jupyter" lab --notebook-dir=. notebooks/00_start_here.ipynb "${as_root[@]}" "$@"
