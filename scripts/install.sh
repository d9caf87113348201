#!/usr/bin/env bash
# Sets up (or refreshes) the project's virtual environment.
#
#   bash scripts/install.sh [--oracles] [--no-horovod] [--test-services]
#
# * Creates $BERT_VENV (default: ./.venv) with Python 3.11.
# * Installs TensorFlow 2.15.1: tensorflow[and-cuda] where `nvidia-smi` sees a GPU,
#   tensorflow-cpu otherwise (override with BERT_TF_FLAVOR=cpu|gpu).
# * Builds Horovod 0.28.1 against that TensorFlow, with Gloo (and NCCL on GPU machines),
#   once: the wheel is cached in $BERT_CACHE_DIR keyed by every pinned version, so a
#   second run, even from a fresh clone, installs it in seconds.
# * --oracles adds the test-only references (torch CPU, transformers, all-MiniLM-L6-v2).
# * --test-services apt-installs slurm-wlm and munge (a real one-node Slurm for
#   tests/test_slurm.py) and openssh-server (ssh "hosts" on loopback addresses for
#   tests/test_multihost.py) when missing, as root on Debian/Ubuntu; where that cannot be done
#   the install goes on and those tests skip, saying why.
# Idempotent: a stamp file records what was installed; a rerun with nothing changed
# returns at once.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${BERT_VENV:-$ROOT/.venv}"
CACHE="${BERT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bert-tf}"
TF_VERSION=2.15.1
HOROVOD_VERSION=0.28.1
WITH_ORACLES=0
WITH_HOROVOD=1
WITH_TEST_SERVICES=0
for arg in "$@"; do
  case "$arg" in
    --oracles) WITH_ORACLES=1 ;;
    --no-horovod) WITH_HOROVOD=0 ;;
    --test-services) WITH_TEST_SERVICES=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

log() { echo "[install] $*"; }

# System packages for tests, not for the venv (so outside the stamp below): nothing to do
# once the programs are there; never fails the install (the tests that need them skip).
install_test_services() {
  local program packages=()
  for program in slurmctld slurmd sbatch scontrol munged; do
    if ! command -v "$program" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$program" ]; then
      packages=(slurm-wlm munge); break
    fi
  done
  [ -x /usr/sbin/sshd ] || packages+=(openssh-server)
  [ ${#packages[@]} -gt 0 ] || return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    log "${packages[*]} not installed and cannot be here (needs root and apt-get):" \
        "the real-Slurm / multi-host ssh tests will skip"
    return 0
  fi
  log "installing ${packages[*]} (apt-get) for the real-Slurm / multi-host ssh tests"
  local output
  if ! output=$( { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
                   --no-install-recommends "${packages[@]}"; } 2>&1 ); then
    log "apt-get could not install ${packages[*]} (the tests needing them will skip):" \
        "$(echo "$output" | tail -n 1)"
  fi
  return 0
}
if [ "$WITH_TEST_SERVICES" = 1 ]; then install_test_services; fi

PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && \
       "$candidate" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then
      PYTHON="$candidate"; break
    fi
  done
fi
[ -n "$PYTHON" ] || { echo "install.sh: Python 3.11 not found (set PYTHON=/path/to/python3.11)" >&2; exit 1; }

FLAVOR="${BERT_TF_FLAVOR:-}"
if [ -z "$FLAVOR" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then FLAVOR=gpu; else FLAVOR=cpu; fi
fi

PY_TAG=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
STAMP_KEY=$(cat "$ROOT/setup.py" "$0" | sha256sum | cut -c1-16)-$FLAVOR-$WITH_ORACLES-$WITH_HOROVOD-$PY_TAG
STAMP="$VENV/.bert-tf-installed"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_KEY" ]; then
  log "environment at $VENV is up to date ($FLAVOR)"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade "pip>=23" "setuptools>=65" wheel

EXTRAS="$FLAVOR,test"
[ "$WITH_ORACLES" = 1 ] && EXTRAS="$EXTRAS,oracles"
log "installing the package with extras [$EXTRAS]"
"${PIP[@]}" install -q -e "$ROOT[$EXTRAS]"

if [ "$WITH_HOROVOD" = 1 ]; then
  # pip's cmake 4.x cannot configure Horovod's bundled Gloo; the system cmake can.
  "${PIP[@]}" uninstall -y -q cmake >/dev/null 2>&1 || true
  WHEEL_DIR="$CACHE/wheels/horovod-$HOROVOD_VERSION-tf$TF_VERSION-$PY_TAG-$FLAVOR"
  if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    command -v cmake >/dev/null 2>&1 || { echo "install.sh: Horovod needs cmake (3.13-3.x) on PATH: apt-get install cmake" >&2; exit 1; }
    log "building Horovod $HOROVOD_VERSION against TensorFlow $TF_VERSION (a few minutes, once)"
    export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
           HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
    if [ "$FLAVOR" = gpu ]; then
      export HOROVOD_GPU_OPERATIONS=NCCL
      NCCL_DIR=$("$VENV/bin/python" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)
      [ -n "$NCCL_DIR" ] && export HOROVOD_NCCL_INCLUDE="$NCCL_DIR/include" HOROVOD_NCCL_LIB="$NCCL_DIR/lib"
    fi
    tmp="$WHEEL_DIR.tmp.$$"
    mkdir -p "$tmp"
    PATH="/usr/bin:$PATH" "${PIP[@]}" wheel -q --no-build-isolation --no-deps \
      "horovod==$HOROVOD_VERSION" -w "$tmp"
    rm -rf "$WHEEL_DIR"; mv "$tmp" "$WHEEL_DIR"
  else
    log "reusing the cached Horovod wheel in $WHEEL_DIR"
  fi
  "${PIP[@]}" install -q --no-deps --force-reinstall "$WHEEL_DIR"/horovod-*.whl
  # Horovod's own runtime dependencies (its wheel was installed with --no-deps).
  "${PIP[@]}" install -q cloudpickle psutil pyyaml packaging
fi

echo "$STAMP_KEY" > "$STAMP"
log "done: activate with 'source $VENV/bin/activate'"
