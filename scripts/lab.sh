#!/usr/bin/env bash
# Open the notes in JupyterLab: installs the project (scripts/setup.sh) and JupyterLab into .venv,
# then starts JupyterLab on notes/ at http://127.0.0.1:8888/ (the .py twins open as notebooks too,
# through jupytext). Run a note top to bottom; outputs should equal the stored ones.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. scripts/env.sh
if ! .venv/bin/python -c "import jupyterlab" 2>/dev/null; then
  echo "lab: installing JupyterLab into .venv (first time: ~1 minute)..."
  .venv/bin/python -m pip install --quiet --disable-pip-version-check jupyterlab 2>&1 | quiet_pip
fi
root=()
[ "$(id -u)" = 0 ] && root=(--allow-root)  # containers often run as root; JupyterLab refuses without it
exec .venv/bin/jupyter lab --ip 127.0.0.1 --port "${PORT:-8888}" --no-browser "${root[@]}" notes/ "$@"
