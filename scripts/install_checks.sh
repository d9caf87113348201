# What scripts/install.sh checks before anything is downloaded or installed: a Python 3.11
# (fetched with uv where the machine has none), whether an installed environment still runs
# what its stamp says, and what Horovod's build needs (a build that fails on them fails late
# otherwise, after tensorflow[and-cuda]'s 3 GB): the CUDA toolkit (gpu), whether its nvcc takes
# the host compiler the build gives it, cmake.
# Sourced, not run: it uses install.sh's die, log, CACHE, ROOT, VENV, BUILD_PATH,
# HOROVOD_VERSION and TF_VERSION, and each check sets variables (PYTHON, TOOLKIT_*, HOST_CXX*,
# HOST_LINE, CMAKE_LINE) or fails in one line.

# --------------------------------------------------------------------------- Python 3.11

PYTHON_ADVICE="install Python 3.11 (pyenv install 3.11; Ubuntu: the deadsnakes PPA's python3.11\
 and python3.11-venv; or uv: 'uv python install 3.11') or set PYTHON=/path/to/python3.11, and rerun"

is_python311() {
  "$1" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' >/dev/null 2>&1
}

# The first and the last line of a tool's error output, as one phrase.
error_gist() {
  local first last
  first=$(grep -v '^[[:space:]]*$' <<< "$1" | head -n 1 | sed 's/^[[:space:]]*//') || true
  last=$(grep -v '^[[:space:]]*$' <<< "$1" | tail -n 1 | sed 's/^[[:space:]]*//') || true
  if [ "$first" = "$last" ]; then echo "$first"; else echo "$first ... $last"; fi
}

# The Python the venv is made with: $PYTHON (checked), else python3.11 or a python3 that is 3.11
# on PATH, else one uv fetches (Ubuntu 24.04 and Debian 13 ship 3.12 and 3.13 only, and
# TensorFlow 2.15.1 has no wheel for them). uv is the one on PATH, or one this script installs
# from PyPI into $CACHE/uv with any python3 that makes venvs; the Python it fetches (from
# python-build-standalone's releases, or $UV_PYTHON_INSTALL_MIRROR) stays in $CACHE/python
# ($UV_PYTHON_INSTALL_DIR), so a rerun finds it without fetching. Sets PYTHON or fails in one line.
find_python311() {
  local candidate
  if [ -n "${PYTHON:-}" ]; then
    is_python311 "$PYTHON" || die "PYTHON=$PYTHON is not a Python 3.11 that runs: $PYTHON_ADVICE"
    return 0
  fi
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && is_python311 "$candidate"; then
      # The interpreter itself, not the name: with the venv active, python3.11 on PATH is the
      # venv's own link (which a repair replaces), and a pyenv shim may change its mind.
      PYTHON=$("$candidate" -c 'import sys; print(getattr(sys, "_base_executable", "") or sys.executable)')
      return 0
    fi
  done
  python_from_uv
}

python_from_uv() {
  local uv boot output found
  export UV_PYTHON_INSTALL_DIR="${UV_PYTHON_INSTALL_DIR:-$CACHE/python}"
  uv=$(command -v uv 2>/dev/null) || uv=""
  if [ -z "$uv" ] && [ -x "$CACHE/uv/bin/uv" ]; then uv="$CACHE/uv/bin/uv"; fi
  if [ -z "$uv" ]; then
    boot=$(command -v python3 2>/dev/null) || boot=""
    [ -n "$boot" ] || die "no Python 3.11 (no python3.11 on PATH, no python3 at all) and no uv to" \
      "fetch one with: $PYTHON_ADVICE"
    log "no Python 3.11 on PATH ($boot is $("$boot" -c 'import sys; print("%d.%d" % sys.version_info[:2])' \
        2>/dev/null || echo "of unknown version")): installing uv from PyPI into $CACHE/uv to fetch one"
    if ! output=$( { "$boot" -m venv "$CACHE/uv" && "$CACHE/uv/bin/python" -m pip install -q uv; } 2>&1 ); then
      rm -rf "$CACHE/uv"
      die "no Python 3.11 on PATH, and uv could not be installed to fetch one ($boot -m venv, then" \
        "pip install uv: $(error_gist "$output")): $PYTHON_ADVICE (or apt-get install python3-venv," \
        "which lets this script install uv)"
    fi
    uv="$CACHE/uv/bin/uv"
  fi
  found=$("$uv" python find 3.11 2>/dev/null) || found=""
  if [ -z "$found" ]; then
    log "fetching Python 3.11 with uv ($uv python install 3.11, into $UV_PYTHON_INSTALL_DIR)"
    output=$("$uv" python install 3.11 2>&1) ||
      die "no Python 3.11 on PATH, and '$uv python install 3.11' could not fetch one" \
        "($(error_gist "$output")): $PYTHON_ADVICE"
    found=$("$uv" python find 3.11 2>/dev/null) || found=""
  fi
  [ -n "$found" ] && is_python311 "$found" ||
    die "'$uv python find 3.11' names no Python 3.11 that runs (${found:-nothing}): $PYTHON_ADVICE"
  PYTHON=$found
  log "Python 3.11: $PYTHON (found or fetched by uv)"
}

# --------------------------------------------------------------------------- the environment

# What keeps the venv at $VENV from running what its stamp says was installed, in a phrase, or
# nothing: its python does not start or is another version ($1, e.g. cp311), bert-tf is not
# the editable install of this checkout, or a requirement of bert-tf[$2] (Horovod too when $3 is
# 1) is missing or at a version outside its range. Reads the packages' metadata only (a tenth of
# a second; importing TensorFlow would take seconds on every run of demo.sh).
venv_problem() {
  local output
  [ -e "$VENV/bin/python" ] || { echo "$VENV/bin/python is missing"; return 0; }
  output=$("$VENV/bin/python" -I - "$ROOT" "$1" "$2" "$3" 2>&1 <<'PY'
"""Prints what the venv lacks of what the install put there; nothing when it has it all."""
import importlib.metadata as metadata
import json
import os
import sys
from urllib.parse import unquote, urlparse

root, tag, extras, with_horovod = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4]
here = "cp%d%d" % sys.version_info[:2]
if here != tag:
    sys.exit(f"its python is {here}, not {tag}")
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
try:
    dist = metadata.distribution("bert-tf")
except metadata.PackageNotFoundError:
    sys.exit("bert-tf is not installed in it")
url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
source = unquote(urlparse(url).path) if url.startswith("file:") else url
if not source or os.path.realpath(source) != os.path.realpath(root):
    sys.exit(f"its bert-tf is installed from {source or 'an unknown place'}, not {root}")
problems = []
requirements = [Requirement(line) for line in dist.requires or []]
if with_horovod == "1":
    requirements.append(Requirement("horovod"))
for requirement in requirements:
    if requirement.marker and not any(requirement.marker.evaluate({"extra": extra})
                                      for extra in extras + [""]):
        continue
    try:
        version = metadata.version(requirement.name)
    except metadata.PackageNotFoundError:
        problems.append(f"{requirement.name} is not installed")
        continue
    if not requirement.specifier.contains(version, prereleases=True):
        problems.append(f"{requirement.name} is {version}, not {requirement.specifier}")
if problems:
    sys.exit(", ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""))
PY
  ) && return 0
  [ -n "$output" ] || output="$VENV/bin/python does not run"
  case "$output" in
    *Traceback*|*"No such file"*|*"not found"*|*"cannot execute"*)
      output="$VENV/bin/python does not run ($(error_gist "$output"))" ;;
  esac
  echo "$output"
}

# Makes $VENV a venv of $PYTHON that runs: creates it; a venv whose python no longer starts (its
# interpreter moved or removed) gets new python links and keeps its packages; a venv of another
# Python version is made again (--clear: its packages are for that version). A folder that is
# not a venv is refused.
prepare_venv() {
  local tag
  if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ] && [ -n "$(ls -A "$VENV" 2>/dev/null)" ]; then
    die "$VENV exists and is not a virtual environment (no pyvenv.cfg): remove it, or set" \
      "BERT_VENV to another folder"
  fi
  if [ ! -f "$VENV/pyvenv.cfg" ]; then
    log "creating virtual environment $VENV with $PYTHON"
    "$PYTHON" -m venv "$VENV"
    return 0
  fi
  tag=$("$VENV/bin/python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])' 2>/dev/null) || tag=""
  if [ -z "$tag" ]; then
    log "the python of $VENV does not run: linking it to $PYTHON again (its packages are kept)"
    rm -f "$VENV/bin/python" "$VENV/bin/python3" "$VENV"/bin/python3.[0-9]*
    "$PYTHON" -m venv "$VENV"
  elif [ "$tag" != "$PY_TAG" ]; then
    log "$VENV is a $tag environment, not $PY_TAG: making it again with $PYTHON (venv --clear)"
    "$PYTHON" -m venv --clear "$VENV"
  fi
  "$VENV/bin/python" -c '' >/dev/null 2>&1 ||
    die "the python of $VENV does not run even after '$PYTHON -m venv $VENV': remove $VENV and rerun"
}

# --------------------------------------------------------------------------- the GPU build

CUDA_ADVICE="load a CUDA 12 toolkit (e.g. 'module load cuda/12.2') or set CUDA_HOME to one,\
 build the Dockerfile's image, or install the CPU build with BERT_TF_FLAVOR=cpu"

# What the folder $1 lacks of a CUDA toolkit, as a phrase; nothing when it has all.
toolkit_lacks() {
  local root=$1 missing=() lib
  [ -d "$root" ] || { echo "does not exist"; return 0; }
  [ -x "$root/bin/nvcc" ] || missing+=("bin/nvcc")
  [ -f "$root/include/cuda_runtime.h" ] || missing+=("include/cuda_runtime.h")
  for lib in lib64/libcudart_static.a lib64/libcudart.so lib/libcudart_static.a lib/libcudart.so \
             lib/x86_64-linux-gnu/libcudart_static.a lib/x86_64-linux-gnu/libcudart.so ""; do
    [ -n "$lib" ] || { missing+=("libcudart (lib64/ or lib/libcudart_static.a or libcudart.so)"); break; }
    [ -e "$root/$lib" ] && break
  done
  [ ${#missing[@]} -eq 0 ] || { local joined; joined=$(printf '%s, ' "${missing[@]}"); echo "lacks ${joined%, }"; }
}

# The CUDA toolkit Horovod's NCCL build compiles with: sets TOOLKIT_ROOT, TOOLKIT_FROM and
# TOOLKIT_VERSION, or fails in one line. A variable that is set decides alone (if its folder lacks
# a piece the install stops, so the build never uses another toolkit than the one named);
# otherwise the folder of the nvcc on PATH (symlinks followed), then /usr/local/cuda.
# TensorFlow 2.15.1 is built for CUDA 12: another version is refused unless BERT_CUDA_ANY_VERSION=1.
find_cuda_toolkit() {
  TOOLKIT_ROOT="" TOOLKIT_FROM=""
  local var nvcc_on_path i lacks candidates=() sources=() looked=""
  for var in HOROVOD_CUDA_HOME CUDA_HOME CUDA_PATH; do
    if [ -n "${!var:-}" ]; then candidates=("${!var}"); sources=("$var"); break; fi
  done
  if [ ${#candidates[@]} -eq 0 ]; then
    if nvcc_on_path=$(command -v nvcc 2>/dev/null); then
      candidates+=("$(dirname "$(dirname "$(readlink -f "$nvcc_on_path")")")")
      sources+=("nvcc on PATH, $nvcc_on_path")
    fi
    candidates+=(/usr/local/cuda); sources+=("the default")
  fi
  for i in "${!candidates[@]}"; do
    lacks=$(toolkit_lacks "${candidates[$i]}")
    if [ -z "$lacks" ]; then TOOLKIT_ROOT=${candidates[$i]}; TOOLKIT_FROM=${sources[$i]}; break; fi
    looked="${looked:+$looked; }${candidates[$i]} (${sources[$i]}) $lacks"
  done
  [ -n "$TOOLKIT_ROOT" ] || die "the GPU build needs a CUDA 12 toolkit (bin/nvcc, include/cuda_runtime.h," \
    "libcudart) and found none: $looked; $CUDA_ADVICE"
  TOOLKIT_VERSION=$("$TOOLKIT_ROOT/bin/nvcc" --version 2>/dev/null |
                 sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n 1) || true
  [ -n "$TOOLKIT_VERSION" ] || die "$TOOLKIT_ROOT/bin/nvcc --version ($TOOLKIT_FROM) names no" \
    "'release X.Y'; $CUDA_ADVICE"
  if [ "${TOOLKIT_VERSION%%.*}" != 12 ] && [ "${BERT_CUDA_ANY_VERSION:-0}" != 1 ]; then
    die "the CUDA toolkit at $TOOLKIT_ROOT ($TOOLKIT_FROM) is CUDA $TOOLKIT_VERSION, and TensorFlow" \
      "$TF_VERSION runs on CUDA 12: $CUDA_ADVICE (BERT_CUDA_ANY_VERSION=1 builds anyway, as a" \
      "build check only: kernels from a newer nvcc need a driver for that CUDA)"
  fi
}

# Horovod's build tools, checked before anything is downloaded (a build that fails on them
# fails after a 3 GB download otherwise). BUILD_PATH is the PATH the build runs with.
CMAKE_ADVICE="install cmake 3 (apt-get install cmake: 3.22 on Ubuntu 22.04, 3.28 on 24.04, 3.25 on\
 Debian 12), or pip's cmake 3 in a venv of its own ('python3 -m venv ~/cmake3 &&\
 ~/cmake3/bin/pip install \"cmake>=3.13,<4\"') named by HOROVOD_CMAKE=~/cmake3/bin/cmake"

# The cmake Horovod's setup.py runs: $HOROVOD_CMAKE, else the first cmake on the build's PATH
# (/usr/bin first). It must be 3.13 (Horovod's cmake_minimum_required) to 3.x: cmake 4 refuses the
# cmake_minimum_required(VERSION 2.8...) of Horovod's bundled Gloo. Sets CMAKE_LINE.
check_cmake() {
  local cmake from version minor
  if [ -n "${HOROVOD_CMAKE:-}" ]; then cmake=$HOROVOD_CMAKE from=HOROVOD_CMAKE
  else cmake=$(PATH="$BUILD_PATH" command -v cmake) || true; from="the cmake on PATH"; fi
  [ -n "$cmake" ] || die "Horovod $HOROVOD_VERSION's build needs cmake 3.13-3.x and there is no cmake on" \
    "PATH: $CMAKE_ADVICE"
  version=$("$cmake" --version 2>/dev/null | sed -n 's/^cmake version \([0-9][0-9]*\.[0-9][0-9]*[^ ]*\).*/\1/p' |
            head -n 1) || true
  [ -n "$version" ] || die "$cmake ($from) does not run or names no 'cmake version X.Y';" \
    "Horovod $HOROVOD_VERSION's build needs cmake 3.13-3.x: $CMAKE_ADVICE"
  minor=${version#*.} minor=${minor%%[!0-9]*}
  if [ "${version%%.*}" -gt 3 ]; then
    die "$cmake ($from) is cmake $version, and Horovod $HOROVOD_VERSION's bundled Gloo does not" \
      "configure with cmake 4 (it needs 3.13-3.x): $CMAKE_ADVICE"
  elif [ "${version%%.*}" -lt 3 ] || [ "$minor" -lt 13 ]; then
    die "$cmake ($from) is cmake $version, older than the 3.13 Horovod $HOROVOD_VERSION needs: $CMAKE_ADVICE"
  fi
  CMAKE_LINE="cmake: $cmake (cmake $version, from $from)"
}

# The C++ compiler Horovod's CMake picks: $CXX, else the first of c++ and g++ on the build's PATH.
# For CUDA code ($1 = cuda) nvcc gets $CUDAHOSTCXX instead when that is set: Horovod's CMakeLists
# sets CMAKE_CUDA_HOST_COMPILER to its C++ compiler, and CMake (3.25, 3.31, 4.4 tried) lets
# CUDAHOSTCXX override that. Sets HOST_CXX (the command, split into words) and HOST_CXX_FROM.
find_host_cxx() {
  local found
  HOST_CXX=() HOST_CXX_FROM=""
  if [ "$1" = cuda ] && [ -n "${CUDAHOSTCXX:-}" ]; then
    read -r -a HOST_CXX <<< "$CUDAHOSTCXX"; HOST_CXX_FROM=CUDAHOSTCXX
  elif [ -n "${CXX:-}" ]; then
    read -r -a HOST_CXX <<< "$CXX"; HOST_CXX_FROM=CXX
  elif found=$(PATH="$BUILD_PATH" command -v c++ || PATH="$BUILD_PATH" command -v g++); then
    HOST_CXX=("$found"); HOST_CXX_FROM="the $(basename "$found") on PATH"
  fi
  [ ${#HOST_CXX[@]} -gt 0 ] || die "Horovod $HOROVOD_VERSION's build needs a C++ compiler and found" \
    "none (CXX is not set, no c++ or g++ on PATH): apt-get install g++, or set CXX"
}

# The largest major version of the compiler family $2 (GCC or clang) that the guard in the
# toolkit header $1 lets through: '#if __GNUC__ > N' raises "unsupported GNU version"; clang's
# guard is '(__clang_major__ >= N)' in the block for plain clang. Nothing when not found.
header_compiler_limit() {
  local limit
  if [ "$2" = GCC ]; then
    sed -n 's/^#if __GNUC__ > \([0-9][0-9]*\)[[:space:]]*$/\1/p' "$1" | head -n 1
  else
    limit=$(sed -n '/^#if defined(__clang__) && !defined(__ibmxl_vrm__)/,/__clang_major__ >=/p' "$1" |
            sed -n 's/.*(__clang_major__ >= \([0-9][0-9]*\)).*/\1/p' | head -n 1)
    [ -z "$limit" ] || echo $((limit - 1))
  fi
}

# Whether the toolkit's nvcc takes the compiler Horovod's build gives it, read from the toolkit
# (include/crt/host_config.h), not from a table: nvcc stops with "unsupported GNU version" only
# when it compiles, after every download. nvcc's own -allow-unsupported-compiler, given through
# NVCC_APPEND_FLAGS or NVCC_PREPEND_FLAGS (nvcc reads both on every call), lets a newer compiler
# through. Sets HOST_LINE, or fails in one line.
check_host_compiler() {
  local header="" candidate macros family version limit described variable advice
  for candidate in "$TOOLKIT_ROOT/include/crt/host_config.h" "$TOOLKIT_ROOT"/targets/*/include/crt/host_config.h; do
    if [ -f "$candidate" ]; then header=$candidate; break; fi
  done
  find_host_cxx cuda
  macros=$(PATH="$BUILD_PATH" "${HOST_CXX[@]}" -dM -E -x c++ /dev/null 2>/dev/null) ||
    die "nvcc's host compiler for Horovod's build, '${HOST_CXX[*]}' ($HOST_CXX_FROM), does not run" \
      "(-dM -E failed): install g++, or set CUDAHOSTCXX to a C++ compiler"
  version=$(sed -n 's/^#define __clang_major__ \([0-9][0-9]*\)$/\1/p' <<< "$macros")
  family=clang
  if [ -z "$version" ]; then
    version=$(sed -n 's/^#define __GNUC__ \([0-9][0-9]*\)$/\1/p' <<< "$macros") family=GCC
  fi
  described="${HOST_CXX[*]} ($HOST_CXX_FROM, $family ${version:-of unknown version})"
  if [ -z "$version" ]; then HOST_LINE="host compiler: $described; not checked: neither GCC nor clang"; return 0; fi
  if [ -z "$header" ]; then
    HOST_LINE="host compiler: $described; not checked: $TOOLKIT_ROOT has no include/crt/host_config.h"; return 0
  fi
  limit=$(header_compiler_limit "$header" "$family")
  if [ -z "$limit" ]; then
    HOST_LINE="host compiler: $described; not checked: $header names no $family limit"; return 0
  fi
  if [ "$version" -le "$limit" ]; then
    HOST_LINE="host compiler: $described; CUDA $TOOLKIT_VERSION's nvcc takes $family up to $limit"; return 0
  fi
  for variable in NVCC_APPEND_FLAGS NVCC_PREPEND_FLAGS; do
    case " ${!variable:-} " in
      *" -allow-unsupported-compiler "* | *" --allow-unsupported-compiler "*)
        HOST_LINE="host compiler: $described, newer than the $family $limit CUDA $TOOLKIT_VERSION's nvcc"
        HOST_LINE+=" takes; going on, at your own risk, because $variable has -allow-unsupported-compiler"
        return 0 ;;
    esac
  done
  if [ "$family" = GCC ]; then
    if candidate=$(PATH="$BUILD_PATH" command -v "g++-$limit"); then advice="set CUDAHOSTCXX=$candidate"
    else advice="install g++-$limit (apt-get install g++-$limit) and set CUDAHOSTCXX=/usr/bin/g++-$limit"; fi
  else
    advice="set CUDAHOSTCXX to clang++ $limit or older, or to a g++ this nvcc takes"
  fi
  die "the CUDA $TOOLKIT_VERSION toolkit at $TOOLKIT_ROOT takes $family up to $limit ($header), and" \
    "Horovod's build would give nvcc ${HOST_CXX[*]}, $family $version ($HOST_CXX_FROM): $advice, or" \
    "use a later CUDA ${TOOLKIT_VERSION%%.*}.x toolkit whose host_config.h takes $family $version" \
    "(NVCC_APPEND_FLAGS=-allow-unsupported-compiler builds anyway, at your own risk)"
}
