#!/usr/bin/env bash
# Sets up (or refreshes) the project's virtual environment.
#
#   bash scripts/install.sh [--oracles] [--no-horovod] [--test-services] [--check-toolkit]
#                           [--check-build]
#
# * Creates $BERT_VENV (default: ./.venv) with Python 3.11: $PYTHON, else python3.11 or python3
#   on PATH, else one `uv python install 3.11` fetches (uv from PATH, or installed from PyPI into
#   the cache); where none can be had, it says in one line what to install.
# * Installs TensorFlow 2.15.1: tensorflow[and-cuda] where `nvidia-smi` sees a GPU,
#   tensorflow-cpu otherwise (override with BERT_TF_FLAVOR=cpu|gpu). A venv switched from one
#   flavour to the other loses the other TensorFlow first (both provide the `tensorflow` module).
# * Builds Horovod 0.28.1 against that TensorFlow, with Gloo (and NCCL on GPU machines),
#   once: the wheel is cached in $BERT_CACHE_DIR keyed by every pinned version, so a
#   second run, even from a fresh clone, installs it in seconds. `horovodrun --check-build`
#   must then show what the flavour needs (Gloo; NCCL for gpu), or the install fails.
# * GPU flavour: needs a CUDA 12 toolkit (bin/nvcc, include/cuda_runtime.h, libcudart), the
#   first of $HOROVOD_CUDA_HOME, $CUDA_HOME, $CUDA_PATH, nvcc on PATH, /usr/local/cuda;
#   checked before anything is installed. BERT_CUDA_ANY_VERSION=1 accepts another CUDA
#   version (a build check only: TensorFlow 2.15.1 runs on CUDA 12). NCCL comes from the
#   venv's nvidia-nccl-cu12 unless HOROVOD_NCCL_HOME/_INCLUDE/_LIB say otherwise.
# * Before anything is downloaded, when Horovod is to be built: cmake must be 3.13-3.x (the first
#   on /usr/bin:$PATH, or $HOROVOD_CMAKE), a C++ compiler must be there, and for gpu the toolkit's
#   nvcc must take that compiler (the range its include/crt/host_config.h accepts).
# * --check-toolkit only finds and checks that CUDA toolkit and nvcc's host compiler, prints them
#   and exits; --check-build does the same for everything Horovod's build needs here.
# * --oracles adds the test-only references (torch CPU, transformers, all-MiniLM-L6-v2).
# * --test-services apt-installs slurm-wlm and munge (a real one-node Slurm for
#   tests/test_slurm.py) and openssh-server (ssh "hosts" on loopback addresses for
#   tests/test_multihost.py) when missing, as root on Debian/Ubuntu; where that cannot be done
#   the install goes on and those tests skip, saying why.
# Idempotent: a stamp file records what was installed; a rerun with nothing changed returns
# at once, once it has checked that the venv still runs it (its python starts, bert-tf is this
# checkout's, every requirement is installed at its version): a venv that does not is repaired.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${BERT_VENV:-$ROOT/.venv}"
CACHE="${BERT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bert-tf}"
TF_VERSION=2.15.1
HOROVOD_VERSION=0.28.1
WITH_ORACLES=0
WITH_HOROVOD=1
WITH_TEST_SERVICES=0
CHECK_TOOLKIT_ONLY=0
CHECK_BUILD_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --oracles) WITH_ORACLES=1 ;;
    --no-horovod) WITH_HOROVOD=0 ;;
    --test-services) WITH_TEST_SERVICES=1 ;;
    --check-toolkit) CHECK_TOOLKIT_ONLY=1 ;;
    --check-build) CHECK_BUILD_ONLY=1 ;;
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

log() { echo "[install] $*"; }
die() { echo "install.sh: $*" >&2; exit 1; }

# The CUDA toolkit, nvcc's host compiler and cmake: the checks made before anything is installed.
source "$ROOT/scripts/install_checks.sh"

FLAVOR="${BERT_TF_FLAVOR:-}"
if [ -z "$FLAVOR" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then FLAVOR=gpu; else FLAVOR=cpu; fi
fi
case "$FLAVOR" in
  cpu|gpu) ;;
  *) die "BERT_TF_FLAVOR='$FLAVOR' is neither cpu nor gpu" ;;
esac

# What the Horovod wheel is built for: the flavour, and on GPUs the CUDA version and the
# compute capabilities it compiles kernels for (so another toolkit never reuses the wheel).
# The build runs with /usr/bin first on PATH (the system cmake before a pip one in an active
# venv) and, for gpu, the toolkit's bin/ before that (Horovod takes its kernel list from nvcc).
BUILD_KEY=$FLAVOR
BUILD_PATH="/usr/bin:$PATH"
if [ "$CHECK_TOOLKIT_ONLY" = 1 ] ||
   { [ "$FLAVOR" = gpu ] && { [ "$WITH_HOROVOD" = 1 ] || [ "$CHECK_BUILD_ONLY" = 1 ]; }; }; then
  find_cuda_toolkit
  BUILD_PATH="$TOOLKIT_ROOT/bin:$BUILD_PATH"
  TOOLKIT_LINE="CUDA toolkit: $TOOLKIT_ROOT (CUDA $TOOLKIT_VERSION, from $TOOLKIT_FROM)"
  if [ "$CHECK_TOOLKIT_ONLY" = 1 ]; then
    check_host_compiler
    printf '%s\n' "$TOOLKIT_LINE" "$HOST_LINE"
    exit 0
  fi
  BUILD_KEY="gpu-cuda$TOOLKIT_VERSION"
  if [ -n "${HOROVOD_BUILD_CUDA_CC_LIST:-}" ]; then
    BUILD_KEY="$BUILD_KEY-cc$(echo "$HOROVOD_BUILD_CUDA_CC_LIST" | tr -c '0-9\n' '_')"
  fi
fi

# Everything Horovod's build needs here, checked: sets BUILD_LINES or fails in one line.
check_build_tools() {
  check_cmake
  BUILD_LINES=("$CMAKE_LINE")
  if [ "$FLAVOR" = gpu ]; then
    check_host_compiler
    BUILD_LINES+=("$HOST_LINE")
  else
    find_host_cxx cxx
    BUILD_LINES+=("C++ compiler: ${HOST_CXX[*]} ($HOST_CXX_FROM)")
  fi
}
if [ "$CHECK_BUILD_ONLY" = 1 ]; then
  check_build_tools
  [ "$FLAVOR" = cpu ] || BUILD_LINES=("$TOOLKIT_LINE" "${BUILD_LINES[@]}")
  printf '%s\n' "flavour: $FLAVOR" "${BUILD_LINES[@]}"
  exit 0
fi

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

# tensorflow-cpu and tensorflow[and-cuda] both provide the `tensorflow` module, so a venv switched
# from one flavour to the other must lose the other one first: installed beside it, whichever
# pip wrote last would win file by file. Removed before the new one is installed (they share
# files: removing one after installing the other would break it), with this flavour's own
# TensorFlow if both are there (it is installed again just after). Leaving gpu also removes the
# CUDA packages tensorflow's [and-cuda] extra brought that no other installed package needs,
# and, under --no-horovod, the Horovod built for the other flavour. Says so in one line.
remove_other_flavour() {
  local other site plan names=() removing="" kept=""
  if [ "$FLAVOR" = gpu ]; then other=tensorflow_cpu; else other=tensorflow; fi
  for site in "$VENV"/lib/python3*/site-packages; do
    compgen -G "$site/$other-*.dist-info" >/dev/null && break
    site=""
  done
  [ -n "$site" ] || return 0
  plan=$("$VENV/bin/python" - "$FLAVOR" "$WITH_HOROVOD" 2>&1 <<'PY'
"""What leaving the other flavour removes: 'remove NAME VERSION' and 'keep NAME NEEDER' lines."""
import importlib.metadata as metadata
import re
import sys

flavour, with_horovod = sys.argv[1], sys.argv[2] == "1"
def key(name):
    return re.sub(r"[-_.]+", "-", name).lower()
def required(dist):
    named = ((re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line), line) for line in dist.requires or [])
    return [(match.group(0), line) for match, line in named if match]
installed = {key(d.metadata["Name"]): d for d in metadata.distributions() if d.metadata["Name"]}
remove = [n for n in ("tensorflow-cpu", "tensorflow") if n in installed]
if not with_horovod and "horovod" in installed:
    remove.append("horovod")
if flavour == "cpu" and "tensorflow" in installed:
    cuda = {key(name) for name, line in required(installed["tensorflow"])
            if re.search(r"extra\s*==\s*['\"]and[-_]cuda['\"]", line)}
    cuda &= set(installed)
    needed_by = {}
    while True:  # a CUDA package another remaining package requires stays (with what it needs)
        leaving = set(remove) | cuda
        for name, dist in installed.items():
            if name in leaving:
                continue
            for requirement, _ in required(dist):
                if key(requirement) in cuda:
                    needed_by[key(requirement)] = name
        if not set(needed_by) & cuda:
            break
        cuda -= set(needed_by)
    remove += sorted(cuda)
    for name in sorted(needed_by):
        print("keep", name, needed_by[name])
for name in remove:
    print("remove", name, installed[name].version)
PY
  ) || die "could not read which packages $VENV/bin/python has (to remove the $other the" \
    "$FLAVOR flavour replaces): $(tail -n 1 <<< "$plan"); fix that venv or remove it"
  local action name what
  while read -r action name what; do
    case "$action" in
      remove) names+=("$name"); removing="${removing:+$removing, }$name $what" ;;
      keep) kept="${kept:+$kept, }$name (needed by $what)" ;;
    esac
  done <<< "$plan"
  [ ${#names[@]} -gt 0 ] || return 0
  log "the $FLAVOR flavour replaces the other one in $VENV: removing $removing (one TensorFlow" \
      "only may provide the tensorflow module)${kept:+; keeping $kept}"
  "${PIP[@]}" uninstall -y -q "${names[@]}"
}

# Python 3.11: $PYTHON, python3.11 or python3 on PATH, or one uv fetches (install_checks.sh).
find_python311

PY_TAG=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
STAMP_KEY=$(cat "$ROOT/setup.py" "$0" "$ROOT/scripts/install_checks.sh" | sha256sum |
            cut -c1-16)-$BUILD_KEY-$WITH_ORACLES-$WITH_HOROVOD-$PY_TAG
STAMP="$VENV/.bert-tf-installed"
EXTRAS="$FLAVOR,test"
[ "$WITH_ORACLES" = 1 ] && EXTRAS="$EXTRAS,oracles"
# The stamp is trusted only while the venv still runs what it names (install_checks.sh's
# venv_problem): a venv whose python is gone, or that lost a package, is repaired.
UP_TO_DATE=0
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_KEY" ]; then
  problem=$(venv_problem "$PY_TAG" "$EXTRAS" "$WITH_HOROVOD")
  if [ -z "$problem" ]; then
    UP_TO_DATE=1
  else
    log "the environment at $VENV does not run what it was installed with: $problem; repairing it"
    rm -f "$STAMP"
  fi
fi
WHEEL_DIR="$CACHE/wheels/horovod-$HOROVOD_VERSION-tf$TF_VERSION-$PY_TAG-$BUILD_KEY"
# Before anything is downloaded: a Horovod build (none when its wheel is cached) checks its tools.
BUILD_LINES=()
if [ "$UP_TO_DATE" = 0 ] && [ "$WITH_HOROVOD" = 1 ] && ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
  check_build_tools
fi
for line in ${TOOLKIT_LINE:+"$TOOLKIT_LINE"} "${BUILD_LINES[@]}"; do log "$line"; done
if [ "$WITH_TEST_SERVICES" = 1 ]; then install_test_services; fi
if [ "$UP_TO_DATE" = 1 ]; then
  log "environment at $VENV is up to date ($FLAVOR)"
  exit 0
fi

prepare_venv
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade "pip>=23" "setuptools>=65" wheel
remove_other_flavour

log "installing the package with extras [$EXTRAS]"
"${PIP[@]}" install -q -e "$ROOT[$EXTRAS]"

# Our serving kernels (finetuning/custom_ops.py), built now for this TensorFlow and CPU so
# that the first model served does not wait ~10 s for them; without a C++ compiler the
# serving graph keeps TensorFlow's ops, and this says so on one line.
log "building the serving kernels"
TF_CPP_MIN_LOG_LEVEL=2 "$VENV/bin/python" -m finetuning.custom_ops 2>&1 || true

# The NCCL Horovod links: the venv's nvidia-nccl-cu12, the one TensorFlow itself loads, unless
# the user names another with HOROVOD_NCCL_HOME/_INCLUDE/_LIB. pip ships only libnccl.so.2, so
# the linker gets an unversioned libnccl.so link in $1 (a build folder, not the package), and
# the library an rpath from site-packages/horovod/tensorflow/ to nvidia/nccl/lib.
use_venv_nccl() {
  if [ -n "${HOROVOD_NCCL_HOME:-}${HOROVOD_NCCL_INCLUDE:-}${HOROVOD_NCCL_LIB:-}" ]; then
    log "NCCL: yours (HOROVOD_NCCL_HOME='${HOROVOD_NCCL_HOME:-}'" \
        "HOROVOD_NCCL_INCLUDE='${HOROVOD_NCCL_INCLUDE:-}' HOROVOD_NCCL_LIB='${HOROVOD_NCCL_LIB:-}')"
    return 0
  fi
  local nccl_dir
  nccl_dir=$("$VENV/bin/python" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null) ||
    die "the venv $VENV has no nvidia-nccl-cu12 (tensorflow[and-cuda] brings it): rerun, or" \
      "set HOROVOD_NCCL_HOME to an NCCL 2 install"
  [ -f "$nccl_dir/include/nccl.h" ] && [ -f "$nccl_dir/lib/libnccl.so.2" ] ||
    die "$nccl_dir lacks include/nccl.h or lib/libnccl.so.2: reinstall nvidia-nccl-cu12, or set" \
      "HOROVOD_NCCL_HOME to an NCCL 2 install"
  ln -sfn "$nccl_dir/lib/libnccl.so.2" "$1/libnccl.so"
  export HOROVOD_NCCL_INCLUDE="$nccl_dir/include" HOROVOD_NCCL_LIB="$1" \
         HOROVOD_NCCL_LINK="${HOROVOD_NCCL_LINK:-SHARED}"
  export LDFLAGS="${LDFLAGS:+$LDFLAGS }-Wl,-rpath,\$ORIGIN/../../nvidia/nccl/lib"
  log "NCCL: $nccl_dir (nvidia-nccl-cu12 of the venv, linked shared)"
}

# `horovodrun --check-build` of the venv must show what the flavour needs; for gpu, the built
# library must also find libnccl and resolve every symbol (CUDA's runtime API comes from
# TensorFlow's own library, which loads libcudart.so.12). Otherwise the cached wheel is removed
# (so a rerun builds it again) and the install fails in one line. check-build imports TensorFlow
# in a dozen processes (30-60 s on 2 cores), so a reused CPU wheel ($1 = quick) is asked the same
# questions in one process instead, keeping that path as fast as it was.
check_horovod_build() {
  local output needed=(TensorFlow Gloo) missing=() name problems="" mpi_lib linked undefined
  [ "$FLAVOR" = gpu ] && needed+=(NCCL)
  if [ "$1" = quick ]; then
    output=$(TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-3} "$VENV/bin/python" -c '
import horovod.tensorflow as hvd
for name, built in (("TensorFlow", True), ("Gloo", hvd.gloo_built()), ("NCCL", hvd.nccl_built())):
    print("    [%s] %s" % ("X" if built else " ", name))' 2>&1) || true
    log "Horovod of the cached wheel (horovod.tensorflow in one process):"
  else
    # (TF_CPP_MIN_LOG_LEVEL=3: not TensorFlow's start-up lines from each of its processes)
    output=$(TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-3} "$VENV/bin/horovodrun" --check-build 2>&1) || true
    log "horovodrun --check-build:"
  fi
  echo "$output"
  for name in "${needed[@]}"; do
    grep -Eq "\[X\] $name[[:space:]]*\$" <<< "$output" || missing+=("$name")
  done
  [ ${#missing[@]} -eq 0 ] || problems="Horovod lacks ${missing[*]}"
  if [ "$FLAVOR" = gpu ]; then
    mpi_lib=$(ls "$VENV"/lib/python3*/site-packages/horovod/tensorflow/mpi_lib*.so 2>/dev/null | head -n 1) || true
    if [ -z "$mpi_lib" ]; then
      problems="${problems:+$problems, }no horovod/tensorflow/mpi_lib*.so"
    else
      linked=$(ldd "$mpi_lib" | grep -E 'libnccl' | tr -s ' \t\n' ' ') || true
      log "$(basename "$mpi_lib") loads:${linked:- no shared libnccl (NCCL linked statically)}"
      case "$linked" in
        *"not found"*) problems="${problems:+$problems, }$(basename "$mpi_lib") does not find libnccl.so.2" ;;
      esac
      undefined=$(LD_LIBRARY_PATH="$(dirname "$mpi_lib")/../../tensorflow" ldd -r "$mpi_lib" 2>&1 |
                  sed -n 's/^undefined symbol: \([^ \t]*\).*/\1/p' | head -n 3 | tr '\n' ' ')
      [ -z "$undefined" ] || problems="${problems:+$problems, }undefined symbols ${undefined% } ..."
    fi
  fi
  if [ -n "$problems" ]; then
    rm -rf "$WHEEL_DIR"
    die "the Horovod built for $BUILD_KEY is incomplete: $problems (output above);" \
      "removed the cached wheel $WHEEL_DIR so a rerun rebuilds it"
  fi
  log "Horovod has ${needed[*]}"
}

# Horovod's CMake, but without the build-tree run-time path: it would name the temporary
# folder of the libnccl.so link; the rpath to the venv's nvidia/nccl/lib is all the library needs.
cmake_without_build_rpath() {
  local real_cmake
  real_cmake=${HOROVOD_CMAKE:-$(PATH="$BUILD_PATH" command -v cmake)}
  cat > "$1/cmake" <<WRAPPER
#!/bin/sh
case "\$1" in --build|-E|--version) exec "$real_cmake" "\$@" ;; esac
exec "$real_cmake" -DCMAKE_SKIP_BUILD_RPATH=ON "\$@"
WRAPPER
  chmod +x "$1/cmake"
  export HOROVOD_CMAKE="$1/cmake"
}

if [ "$WITH_HOROVOD" = 1 ]; then
  # pip's cmake 4.x cannot configure Horovod's bundled Gloo; the system cmake can.
  "${PIP[@]}" uninstall -y -q cmake >/dev/null 2>&1 || true
  if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    log "building Horovod $HOROVOD_VERSION against TensorFlow $TF_VERSION (a few minutes, once)"
    export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
           HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
    if [ "$FLAVOR" = gpu ]; then
      # Horovod's CMake takes nvcc from HOROVOD_CUDA_HOME, its kernel list from the nvcc on PATH.
      export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="$TOOLKIT_ROOT"
      build_dir=$(mktemp -d "${TMPDIR:-/tmp}/bert-horovod-build.XXXXXX")
      trap 'rm -rf "$build_dir"' EXIT
      use_venv_nccl "$build_dir"
      cmake_without_build_rpath "$build_dir"
    fi
    tmp="$WHEEL_DIR.tmp.$$"
    mkdir -p "$tmp"
    # --no-cache-dir: pip's own wheel cache ignores the HOROVOD_* build settings and would hand
    # back a wheel built for another flavour.
    PATH="$BUILD_PATH" "${PIP[@]}" wheel -q --no-cache-dir --no-build-isolation --no-deps \
      "horovod==$HOROVOD_VERSION" -w "$tmp"
    rm -rf "$WHEEL_DIR"; mv "$tmp" "$WHEEL_DIR"
    check=full
  else
    log "reusing the cached Horovod wheel in $WHEEL_DIR"
    check=quick; [ "$FLAVOR" = cpu ] || check=full
  fi
  "${PIP[@]}" install -q --no-deps --force-reinstall "$WHEEL_DIR"/horovod-*.whl
  # Horovod's own runtime dependencies (its wheel was installed with --no-deps).
  "${PIP[@]}" install -q cloudpickle psutil pyyaml packaging
  check_horovod_build "$check"
fi

echo "$STAMP_KEY" > "$STAMP"
log "done: activate with 'source $VENV/bin/activate'"
