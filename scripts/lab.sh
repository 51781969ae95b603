#!/usr/bin/env bash
# The one way the kit starts JupyterLab: `make lab` and the end-to-end browser test
# (tests/test_e2e_jupyterlab.py) both come through here, so the test proves the command
# the README tells people to run. Extra arguments go to `jupyter lab` unchanged, e.g.
#   scripts/lab.sh --no-browser --port=8890
# VENV picks the virtual environment (default .venv, as in the Makefile), LAB_DIR the
# working copies' folder (default lab).
#
# JupyterLab opens the learner's working copies in lab/ (git-ignored, made on the first
# run by scripts/lab_copies.py), never the tracked notebooks: autosave writes there, and
# a session leaves the clone as it was.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-.venv}"
lab="${LAB_DIR:-lab}"  # the browser test keeps its own copies (LAB_DIR=lab-e2e), never yours
# One Python for the two steps before JupyterLab (importing the kit, and torch with it,
# is most of their time): the working copies (scripts/lab_copies.py), then JupyterLab's
# "would you like news?" toast and update check, off for the kit's own environment (its
# app-wide overrides; a person's own settings are not touched).
overrides="$venv/share/jupyter/lab/settings/overrides.json"
# The notebook kernels' warm server (scripts/warm_kernel.py) imports torch and the kit
# while the rest starts, so that the first notebook's kernel starts warm too (it does
# nothing when the kernelspec Jupyter finds is not the kit's).
"$venv/bin/python" scripts/warm_kernel.py start || true
"$venv/bin/python" - "$lab" "$overrides" <<'PY'
import json, sys
from pathlib import Path
sys.path.insert(0, "scripts")
import lab_copies
from inkling_lab.atomic import atomic_write
if lab_copies.main(["--lab", sys.argv[1]]):
    raise SystemExit(1)
path = Path(sys.argv[2])
settings = json.loads(path.read_text()) if path.exists() else {}
want = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}}
merged = {**settings, **{k: {**settings.get(k, {}), **v} for k, v in want.items()}}
if merged != settings:
    atomic_write(path, (json.dumps(merged, indent=2) + "\n").encode())
PY

args=(--notebook-dir=. "$lab/00_start_here.ipynb")
# Jupyter refuses to start as root unless told; containers and CI run as root.
if [ "$(id -u)" = 0 ]; then args+=(--allow-root); fi
# Unless the caller picks them (the browser test does), the token and port are chosen
# here, so that the address is printed once, below, instead of four times in the log.
if [[ " $* " != *" --IdentityProvider.token="* && " $* " != *" --port="* ]]; then
  token="$("$venv/bin/python" -c 'import secrets; print(secrets.token_hex(24))')"
  port="$("$venv/bin/python" -c '
import socket
for port in range(8888, 8988):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        print(port)
        break')"
  args+=(--IdentityProvider.token="$token" --port="$port" --ServerApp.port_retries=0 --ServerApp.log_level=WARN)
  echo "JupyterLab: http://localhost:$port/lab/tree/$lab/00_start_here.ipynb?token=$token"
  echo "  (open it in your browser if no window opens by itself; Control-C here stops JupyterLab)"
fi
exec "$venv/bin/jupyter" lab "${args[@]}" "$@"
