#!/usr/bin/env bash
# Install everything, then serve the site at http://127.0.0.1:${PORT:-8000}/ (Ctrl-C to stop).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/mkdocs serve --dev-addr "127.0.0.1:${PORT:-8000}"
