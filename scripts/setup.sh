#!/usr/bin/env bash
# Install everything the project needs into ./.venv (idempotent, fast when nothing changed).
# Needs Python 3.12: megatron-core 0.19.0 declares Requires-Python >= 3.12 (and megatron.training
# imports typing.override, new in 3.12). Found as $PYTHON, python3.12 or python3 on PATH, or the
# newest pyenv 3.12 (~/.pyenv/versions/3.12.*), in that order. On 3.12, PyPI's torch==2.13.0 is its
# CUDA build (with the nvidia-* libraries, ~4.7 GB): it runs on a CPU, and the same install runs on GPUs.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh

is_312() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; }

pick_python() {
  local candidate
  for candidate in "${PYTHON:-}" python3.12 python3 $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.*/bin/python3.12 2>/dev/null | sort -V -r); do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 && is_312 "$candidate"; then
      echo "$candidate"; return 0
    fi
  done
  echo "error: Python 3.12 is required (megatron-core 0.19.0 needs >= 3.12) and none was found on PATH or in ~/.pyenv/versions; set PYTHON=/path/to/python3.12" >&2
  return 1
}

if [ -x .venv/bin/python ] && ! is_312 .venv/bin/python; then
  echo "setup: .venv is not Python 3.12 (an older pin's environment); making a new one"
  rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
  python=$(pick_python)
  echo "setup: creating .venv with $python"
  "$python" -m venv .venv
fi
stamp=.venv/.megatron-study-installed
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d" " -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  start=$SECONDS
  echo "setup: installing the project into .venv: torch 2.13.0 (PyPI's CUDA build, runs on the CPU),"
  echo "       megatron-core 0.19.0, mkdocs-material + mkdocs-jupyter, nbval, pytest, playwright ..."
  echo "       (pyproject.toml). First time: ~4.7 GB of downloads, 2-5 minutes; afterwards only when"
  echo "       pyproject.toml changes."
  # pip's own lines, one per package it fetches, shortened to "  fetching NAME"
  .venv/bin/python -m pip install --disable-pip-version-check --progress-bar off --retries 1 -c constraints.txt -e ".[test]" 2>&1 | quiet_pip \
    | sed -u -n -e 's/^Collecting \([^ ]*\).*/  fetching \1/p' -e 's/^Installing collected packages.*/  installing .../p' \
                -e 's/^ERROR/ERROR/p'
  .venv/bin/python -c "import snippets, megatron.core, megatron.training, mkdocs_jupyter, nbval" \
    || { echo "error: installation incomplete (pip's errors are above; rerun bash scripts/setup.sh)" >&2; exit 1; }
  echo "$want" > "$stamp"
  echo "setup: installed in $((SECONDS - start)) s"
fi
# The test command's notebook kernel (snippets/ranks/kernel_zygote.py): cheap, so always (re)written.
.venv/bin/python -m snippets.ranks.kernel_zygote install >/dev/null
