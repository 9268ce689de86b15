#!/usr/bin/env bash
# Pair, execute and store the outputs of notes: scripts/execute_notes.sh notes/02_*.py ...
# (no argument: every note). The .py is the text we edit; the .ipynb is rebuilt from it and run
# top to bottom in a fresh kernel, so its stored outputs are exactly what nbval will compare.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
notes=("$@")
[ ${#notes[@]} -gt 0 ] || notes=(notes/[0-9][0-9]_*.py)
for py in "${notes[@]}"; do
  if [[ ! "$(basename "$py")" =~ ^[0-9][0-9]_[A-Za-z0-9_]+\.py$ ]] || [ ! -f "$py" ]; then
    echo "error: unknown note '$py' -- a note is notes/NN_slug.py; existing notes:" >&2
    ls notes/[0-9][0-9]_*.py >&2
    exit 2
  fi
  nb="${py%.py}.ipynb"
  "$PY" -m jupytext --quiet --set-formats ipynb,py:percent "$py"
  "$PY" -m jupytext --quiet --sync "$py"
  "$PY" -m jupyter nbconvert --log-level=WARN --to notebook --execute --inplace \
    --ExecutePreprocessor.timeout=300 "$nb"
  touch "$py"  # the text stays the source of truth for the next --sync
  echo "executed $nb"
done
