#!/usr/bin/env bash
# Megatron-LM's own unit tests on CPU ranks (gloo), with the project's CPU layer (snippets.cpu) as
# the only patch of megatron.core; test-side shims are in scripts/upstream/cpu_shims.py (SHIMS).
#
#   scripts/upstream_tests.sh --megatron-src PATH [--nproc 8] [--timeout 600] [--out DIR]
#                             [--with-flaky] [AREA...]
#
# PATH is a checkout of core_v0.19.0 (only its tests/ directory is used; megatron.core and
# megatron.training are the installed megatron-core==0.19.0). AREAs default to all of:
# parallel_state tensor_parallel schedules serialization dispatchers. One torchrun per area, one
# after another, each bounded by --timeout seconds (tests not reached by then are counted as such);
# rank 0 records each test's outcome in --out as it ends, and a table of counts per file is printed.
# Tests marked both flaky and flaky_in_dev are deselected, as Megatron's CI never runs them
# (run_ci_test.sh); --with-flaky runs them.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SRC="" NPROC=8 TIMEOUT=600 OUT="" AREAS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --megatron-src) SRC="$2"; shift 2 ;;
    --nproc) NPROC="$2"; shift 2 ;;
    --timeout) TIMEOUT="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --with-flaky) export UPSTREAM_WITH_FLAKY=1; shift ;;
    -h|--help) sed -n 2,14p "$0"; exit 0 ;;
    *) AREAS+=("$1"); shift ;;
  esac
done
if [[ -z "$SRC" || ! -d "$SRC/tests/unit_tests" ]]; then
  echo "usage: $0 --megatron-src PATH (a checkout of Megatron-LM core_v0.19.0 with tests/unit_tests)" >&2
  exit 2
fi
[[ ${#AREAS[@]} -eq 0 ]] && AREAS=(parallel_state tensor_parallel schedules serialization dispatchers)
declare -A FILES=(
  [parallel_state]="tests/unit_tests/test_parallel_state.py"
  [tensor_parallel]="tests/unit_tests/tensor_parallel"
  [schedules]="tests/unit_tests/pipeline_parallel/test_schedules.py"
  [serialization]="tests/unit_tests/dist_checkpointing/test_serialization.py"
  [dispatchers]="tests/unit_tests/transformer/moe/test_token_dispatcher.py tests/unit_tests/transformer/moe/test_a2a_token_dispatcher.py"
)
# pytest-mock (test_schedules.py's `mocker`) is pinned in the [test] extra that scripts/setup.sh installs
"$ROOT/.venv/bin/python" -c "import pytest_mock" 2>/dev/null ||
  { echo "error: pytest-mock is missing from .venv (run bash scripts/setup.sh)" >&2; exit 2; }
RUN="$(mktemp -d)"
OUT="${OUT:-$RUN/junit}"
mkdir -p "$OUT"
ln -s "$(cd "$SRC" && pwd)/tests" "$RUN/tests"   # tests only: megatron itself comes from the venv
export UPSTREAM_TESTS_DIR="$RUN/tests" PYTHONPATH="$ROOT/scripts/upstream:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo CUDA_VISIBLE_DEVICES=""
status=0
for area in "${AREAS[@]}"; do
  if [[ $area == tests/* ]]; then FILES[$area]="$area"; fi  # a file or folder of the checkout, as is
  [[ -n "${FILES[$area]:-}" ]] || { echo "unknown area $area (${!FILES[*]})" >&2; exit 2; }
  echo "== $area: ${FILES[$area]} ($NPROC ranks, at most ${TIMEOUT}s)"
  export UPSTREAM_RESULTS="$OUT/${area//\//_}.jsonl"
  # shellcheck disable=SC2086
  (cd "$RUN" && timeout --kill-after=10 "$TIMEOUT" "$ROOT/.venv/bin/torchrun" --nproc-per-node "$NPROC" \
      --master-port "$((29500 + RANDOM % 1000))" --no-python bash -c \
      'exec "$1" -m pytest -p cpu_shims -p no:cacheprovider -o addopts= -rN "${@:2}" >"$0.rank$LOCAL_RANK.log" 2>&1' \
      "$OUT/${area//\//_}" "$ROOT/.venv/bin/python" ${FILES[$area]}) || { echo "   exit $? (see $OUT/${area//\//_}.rank*.log)"; status=1; }
done
"$ROOT/.venv/bin/python" "$ROOT/scripts/upstream/summary.py" "$OUT"
exit $status
