#!/usr/bin/env bash
# Install everything, then run every test: nbval over notes/*.ipynb plus tests/ (site build, link
# check, browser, citations, launcher, CPU patches, recorder). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. scripts/env.sh
# Bytecode caches on (the environment may turn them off): the test processes, the runner's
# subprocesses, the kernels and the site builds then compile the project's modules once per run
# (__pycache__/ is git-ignored) instead of once per process.
unset PYTHONDONTWRITEBYTECODE

# The browser tests drive Debian's Chromium (no browser download is possible here). Install it
# when we can (root with apt); otherwise they skip with a message -- except under CI, where a
# missing browser fails them.
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing Debian chromium for the browser tests..."
    apt-get update -qq >/dev/null 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-noto-cjk >/dev/null 2>&1
  else
    echo "note: /usr/bin/chromium not found; browser tests will be skipped (sudo apt-get install chromium)"
  fi
fi

# -n 3 on 2 cores: a third worker fills the time the others wait (for a browser, a timeout, a
# subprocess); measured 188 s against 203-208 s with -n 2 (README benchmark).
# --dist loadfile keeps each notebook's cells (and each test file) on one worker.
# --nbval-kernel-name megatron-study: kernels forked from one that already imported torch and
# megatron.core (snippets/ranks/kernel_zygote.py), ~4 s less per notebook than a fresh python3 kernel.
exec .venv/bin/python -m pytest --nbval notes/ tests/ -n 3 --dist loadfile --nbval-kernel-name megatron-study "$@"
