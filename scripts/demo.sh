#!/usr/bin/env bash
# Sets up the environment and runs the end-to-end demo on a corpus built from text already on
# this machine.   bash scripts/demo.sh [--output_dir DIR] [--corpus FILE] ...
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/install.sh"
VENV="${BERT_VENV:-$ROOT/.venv}"
cd "$ROOT"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
exec "$VENV/bin/python" demo.py "$@"
