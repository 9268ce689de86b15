#!/usr/bin/env bash
# Install everything the project needs into ./.venv (idempotent, fast when nothing changed).
# Needs Python 3.11 (python3.11 or python3). torch==2.13.0 is a CPU wheel on our machines.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh

pick_python() {
  for candidate in "${PYTHON:-}" python3.11 python3; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      echo "$candidate"; return 0
    fi
  done
  echo "error: Python 3.11 is required (megatron-core 0.16.1 + mkdocs-jupyter 0.26); set PYTHON=/path/to/python3.11" >&2
  return 1
}

if [ ! -x .venv/bin/python ]; then
  python=$(pick_python)
  echo "setup: creating .venv with $python"
  "$python" -m venv .venv
fi
stamp=.venv/.megatron-study-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  start=$SECONDS
  echo "setup: installing the project into .venv: torch (CPU), megatron-core 0.16.1, mkdocs-material +"
  echo "       mkdocs-jupyter, nbval, pytest, playwright ... (pyproject.toml). First time: ~1 GB of"
  echo "       downloads, 2-5 minutes; afterwards only when pyproject.toml changes."
  # pip's own lines, one per package it fetches, shortened to "  fetching NAME"
  .venv/bin/python -m pip install --disable-pip-version-check --progress-bar off --retries 1 -c constraints.txt -e ".[test]" --extra-index-url https://download.pytorch.org/whl/cpu 2>&1 | quiet_pip \
    | sed -u -n -e 's/^Collecting \([^ ]*\).*/  fetching \1/p' -e 's/^Installing collected packages.*/  installing .../p' \
                -e 's/^ERROR/ERROR/p'
  .venv/bin/python -c "import megatron.core, snippets, mkdocs_jupyter, nbval" \
    || { echo "error: installation incomplete (pip's errors are above; rerun bash scripts/setup.sh)" >&2; exit 1; }
  echo "$want" > "$stamp"
  echo "setup: installed in $((SECONDS - start)) s"
fi
# The test command's notebook kernel (snippets/ranks/kernel_zygote.py): cheap, so always (re)written.
.venv/bin/python -m snippets.ranks.kernel_zygote install >/dev/null
