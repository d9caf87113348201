#!/usr/bin/env bash
# Preflight of a GPU node before pre-training on it (cli/preflight.py): the GPUs TensorFlow
# sees, Horovod's build, and a short phase-1 loop on one GPU and on all GPUs beside NVIDIA's
# published speeds. The last line says PASS or what fell back; exit 0 PASS, 2 fell back,
# 1 failed.   bash scripts/preflight.sh [--model base|large] [--precision fp16|bf16|tf32|fp32] ...
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$( [ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3 )}"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" -m cli.preflight "$@"
