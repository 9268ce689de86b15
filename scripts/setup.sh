#!/usr/bin/env bash
# Install everything the project needs into ./.venv (idempotent, fast when nothing changed).
# Needs Python 3.11 (python3.11 or python3). torch==2.13.0 is a CPU wheel on our machines.
set -euo pipefail
cd "$(dirname "$0")/.."

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
  "$(pick_python)" -m venv .venv
fi
stamp=.venv/.megatron-study-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "installing the project into .venv (first time: a minute or two)..."
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --retries 1 -c constraints.txt -e ".[test]" --extra-index-url https://download.pytorch.org/whl/cpu 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
  .venv/bin/python -c "import megatron.core, snippets, mkdocs_jupyter, nbval" \
    || { echo "error: installation incomplete" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
# The test command's notebook kernel (snippets/ranks/kernel_zygote.py): cheap, so always (re)written.
.venv/bin/python -m snippets.ranks.kernel_zygote install >/dev/null
