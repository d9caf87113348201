#!/usr/bin/env bash
# Sets up the environment (with the test oracles and Horovod) and runs the whole test suite.
#   bash scripts/test.sh [pytest args...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/install.sh" --oracles
VENV="${BERT_VENV:-$ROOT/.venv}"
cd "$ROOT"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
exec "$VENV/bin/python" -m pytest "$@"
