#!/usr/bin/env bash
# Proves on any Linux machine, a GPU not needed, that scripts/install.sh builds Horovod with NCCL.
#
#   bash scripts/check_gpu_build.sh [DIR]     (DIR default: a new folder under ${TMPDIR:-/tmp})
#
# Runs `BERT_TF_FLAVOR=gpu bash scripts/install.sh` into DIR/venv with a fresh wheel cache
# DIR/cache (it downloads tensorflow[and-cuda], about 3 GB, and compiles for a few minutes;
# a second run in the same DIR reuses the venv's packages but builds Horovod again), then prints
# the log's tail, `horovodrun --check-build`, where the built library finds libnccl, and
# `hvd.init()` on the CPU. Exits non-zero when NCCL or Gloo is missing.
#
# The CUDA toolkit is the one install.sh finds (bash scripts/install.sh --check-toolkit). PyPI
# has no CUDA 12 nvcc, so where that toolkit is not CUDA 12 the check makes DIR/cuda-toolkit of
# symlinks: its compiler, with libcudart_static.a replaced by a linker script naming the venv's
# CUDA 12 libcudart.so.12 (TensorFlow's runtime), passed with BERT_CUDA_ANY_VERSION=1 and
# HOROVOD_BUILD_CUDA_CC_LIST=75,80,86,89,90 (unless set). The toolkit itself is never changed.
# That proves compiling and linking only: a GPU node builds with its own CUDA 12 toolkit.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-}"
if [ -z "$DIR" ]; then DIR=$(mktemp -d "${TMPDIR:-/tmp}/bert-gpu-build-check.XXXXXX"); fi
mkdir -p "$DIR"; DIR="$(cd "$DIR" && pwd)"
VENV="$DIR/venv"; CACHE="$DIR/cache"; LOG="$DIR/install.log"
say() { echo "[check-gpu-build] $*"; }

# A fresh build every time: no cached wheel, no stamp saying "up to date".
rm -rf "$CACHE"; rm -f "$VENV/.bert-tf-installed"

toolkit_line=$(BERT_CUDA_ANY_VERSION=1 bash "$ROOT/scripts/install.sh" --check-toolkit) || exit 1
compiler_root=$(echo "$toolkit_line" | sed -n 's/^CUDA toolkit: \(.*\) (CUDA [0-9.]*, from .*)$/\1/p')
compiler_version=$(echo "$toolkit_line" | sed -n 's/^CUDA toolkit: .* (CUDA \([0-9.]*\), from .*)$/\1/p')
say "$toolkit_line"

if [ "${compiler_version%%.*}" = 12 ]; then
  toolkit="$compiler_root"
  proves="a CUDA $compiler_version toolkit's nvcc and NCCL build, compiled and linked"
else
  # CUDA $compiler_version's compiler + TensorFlow's CUDA 12 runtime. nvcc finds its tools and
  # libraries from the path it was started by (bin/..), so bin/ and lib/ are real folders here.
  # Horovod takes the CUDA runtime API from TensorFlow's library (which loads libcudart.so.12);
  # the linker script makes sure nothing links CUDA $compiler_version's runtime instead.
  toolkit="$DIR/cuda-toolkit"
  cudart12="$VENV/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12"
  rm -rf "$toolkit"; mkdir -p "$toolkit/bin" "$toolkit/lib" "$toolkit/targets/x86_64-linux"
  compiler_lib="$compiler_root/lib64"; [ -d "$compiler_lib" ] || compiler_lib="$compiler_root/lib"
  ln -s "$compiler_root"/bin/* "$toolkit/bin/"
  ln -s "$compiler_root/include" "$toolkit/include"
  [ -d "$compiler_root/nvvm" ] && ln -s "$compiler_root/nvvm" "$toolkit/nvvm"
  for entry in "$compiler_lib"/*; do
    case "$(basename "$entry")" in libcudart*) ;; *) ln -s "$entry" "$toolkit/lib/" ;; esac
  done
  echo "INPUT($cudart12)" > "$toolkit/lib/libcudart_static.a"
  ln -s "$cudart12" "$toolkit/lib/libcudart.so"
  ln -s lib "$toolkit/lib64"
  ln -s ../../include "$toolkit/targets/x86_64-linux/include"
  ln -s ../../lib "$toolkit/targets/x86_64-linux/lib"
  export BERT_CUDA_ANY_VERSION=1
  export HOROVOD_BUILD_CUDA_CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-75,80,86,89,90}"
  proves="CUDA $compiler_version's nvcc with TensorFlow's CUDA 12 runtime ($toolkit), compiled and linked"
fi

say "building into $VENV, wheel cache $CACHE; the full log is $LOG (tail -f to follow)"
status=0 started=$SECONDS
HOROVOD_CUDA_HOME="$toolkit" BERT_TF_FLAVOR=gpu BERT_VENV="$VENV" BERT_CACHE_DIR="$CACHE" \
  bash "$ROOT/scripts/install.sh" >"$LOG" 2>&1 || status=$?
say "install.sh exited with $status after $((SECONDS - started)) s; its own lines in $LOG:"
grep -E '^(\[install\]|install\.sh:)' "$LOG" || true
say "the last 25 lines of $LOG:"
tail -n 25 "$LOG"
[ "$status" = 0 ] || { say "FAILED: install.sh did not finish (log above)"; exit 1; }

say "horovodrun --check-build:"
check=$(TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-3} "$VENV/bin/horovodrun" --check-build 2>&1) || true
echo "$check"
mpi_lib=$(ls "$VENV"/lib/python3*/site-packages/horovod/tensorflow/mpi_lib*.so 2>/dev/null | head -n 1) ||
  { say "FAILED: the venv has no horovod/tensorflow/mpi_lib*.so"; exit 1; }
say "$(basename "$mpi_lib"): run-time path and what it loads"
readelf -d "$mpi_lib" | grep -E 'RPATH|RUNPATH|NEEDED.*(nccl|cudart)' || true
ldd "$mpi_lib" | grep -E 'libnccl|libcudart' || true
undefined=$(LD_LIBRARY_PATH="$(dirname "$mpi_lib")/../../tensorflow" ldd -r "$mpi_lib" 2>&1 |
            grep -c '^undefined symbol' || true)
say "symbols left undefined beside TensorFlow's libraries (ldd -r): $undefined"
say "hvd.init() on the CPU:"
CUDA_VISIBLE_DEVICES="" TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-3} "$VENV/bin/python" -c '
import horovod.tensorflow as hvd
hvd.init()
print(f"hvd.init(): rank {hvd.rank()} of {hvd.size()}, nccl_built={hvd.nccl_built()}, gloo_built={hvd.gloo_built()}")
' || { say "FAILED: hvd.init() did not run"; exit 1; }

missing=""
for name in NCCL Gloo TensorFlow; do
  grep -Eq "\[X\] $name[[:space:]]*\$" <<< "$check" || missing="$missing $name"
done
nccl_line=$(ldd "$mpi_lib" | grep 'libnccl') || true
case "$nccl_line" in ""|*"not found"*) missing="$missing libnccl.so.2-at-run-time" ;; esac
[ "$undefined" = 0 ] || missing="$missing $undefined-symbols"
if [ -n "$missing" ]; then say "FAILED: the build lacks$missing"; exit 1; fi
say "PROVED: Horovod builds with NCCL and Gloo against TensorFlow's CUDA 12 pip packages:"
say "  $proves."
say "  This proves compiling and linking only (no kernel ran on a GPU here); a GPU node builds"
say "  with its own CUDA 12 toolkit: BERT_TF_FLAVOR=gpu bash scripts/install.sh there."
