#!/usr/bin/env bash
# Sets up the environment and runs the end-to-end demo on a corpus built from text already on
# this machine.   bash scripts/demo.sh [--output_dir DIR] [--corpus FILE] ...
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/install.sh"
VENV="${BERT_VENV:-$ROOT/.venv}"
cd "$ROOT"
# The demo keeps TensorFlow's logging out of the console itself (demo.py -v 0 brings it back).
exec "$VENV/bin/python" demo.py "$@"
