#!/usr/bin/env bash
# Install everything, then serve the site at http://127.0.0.1:${PORT:-8000}/ (Ctrl-C to stop).
# mkdocs' INFO lines (one per note converted, ...) are dropped; warnings and errors are kept, and
# one line says when the site is ready (and when it was rebuilt after an edit).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. scripts/env.sh
url="http://127.0.0.1:${PORT:-8000}/"
echo "serve: building the site (about 10 s on an idle machine, more under load)..."
PYTHONUNBUFFERED=1 .venv/bin/mkdocs serve --dev-addr "127.0.0.1:${PORT:-8000}" 2>&1 | awk -v url="$url" '
  / Serving on /             { print "serve: ready, open " url " (Ctrl-C to stop)"; ready = 1; fflush(); next }
  / Documentation built in / { if (ready) { print "serve: rebuilt after a change"; fflush() } next }
  /^INFO / || /^ *$/         { next }
                             { print; fflush() }'
