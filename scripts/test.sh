#!/usr/bin/env bash
# Sets up the environment (with the test oracles, Horovod, and as root slurm-wlm and munge for
# the real-Slurm tests) and runs the whole test suite.
#   bash scripts/test.sh [pytest args...]
# Test files run in parallel, one file per worker at a time (pytest-xdist, --dist loadfile:
# a file's module fixtures are built once; files in tests/conftest.py's order, the long ones
# first, not xdist's by number of tests): BERT_TEST_WORKERS workers, by default as many as
# the CPUs up to 4 (most of a test's time is single-threaded: imports, graph building,
# process start-up). BERT_TEST_WORKERS=1 (or 0) runs everything in this one process.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/install.sh" --oracles --test-services
VENV="${BERT_VENV:-$ROOT/.venv}"
cd "$ROOT"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
CPUS=$(nproc 2>/dev/null || echo 1)
WORKERS="${BERT_TEST_WORKERS:-$(( CPUS < 4 ? CPUS : 4 ))}"
PARALLEL=()
[ "$WORKERS" -gt 1 ] && PARALLEL=(-n "$WORKERS" --dist loadfile --no-loadscope-reorder)
exec "$VENV/bin/python" -m pytest "${PARALLEL[@]}" "$@"
