"""Our own TensorFlow kernels for the serving graph: built from `finetuning/kernels/` on the
machine that runs them, once, and loaded into the process.

Why built here and not shipped: a kernel library must match the installed TensorFlow's
headers and C++ ABI, and its vector code the CPU. The sources compile in ~10 s (g++, the
flags `tf.sysconfig` gives); the library is kept in a cache folder keyed by a hash of the
sources, the flags, the TensorFlow version and the compiler (`$BERT_TF_OPS_CACHE`, else
`$XDG_CACHE_HOME/bert-tf/ops`, else `~/.cache/bert-tf/ops`), written under a temporary name
and renamed, so processes that build at once never load a half-written file.
`scripts/install.sh` builds it; a process that finds none builds it on first use.

Where it cannot be built (no g++, a read-only cache) or loaded, `library()` says why once, on
one line, and returns None: the serving graph then runs TensorFlow's own ops, as it did.
"""
import hashlib
import os
import subprocess
import sys
import tempfile

import tensorflow as tf

KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")

# Our kernels (kernels/vectors.h, packed_attention.h, layer_norm.h), compiled once per
# instruction set (the ops pick at run time the widest this CPU runs), and the ops'
# TensorFlow registration.
_VECTOR_UNITS = {
    "kernels_avx512.cc": ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mavx2",
                          "-mfma"],
    "kernels_avx2.cc": ["-mavx2", "-mfma"],
    "kernels_generic.cc": [],
    # int8 dense layers on AVX-512 VNNI, and the rows' quantization AMX's share (dense_vnni.h)
    "kernels_vnni.cc": ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mavx512vnni",
                        "-mavx2", "-mfma"],
    # the dense layers on AMX, bfloat16 and int8 (dense_amx.h), and bfloat16 on AVX512_BF16
    # (dense_dpbf16.h): used only where the CPU has them
    "kernels_amx.cc": ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mavx512bf16",
                       "-mamx-tile", "-mamx-bf16", "-mamx-int8", "-mavx2", "-mfma"],
}
# A compiler before GCC 11 / Clang 12 knows no AMX: then this unit stands in for
# kernels_amx.cc (its functions say no), the rest is built as ever, and a marker file beside
# the library (`amx_built`) tells the rewrite not to ask for the AMX ops.
_AMX_UNIT, _NO_AMX_UNIT = "kernels_amx.cc", "kernels_no_amx.cc"
_NO_AMX_SUFFIX = ".no_amx"
_OP_UNIT = "ops.cc"
_HEADERS = ("vectors.h", "packed_attention.h", "layer_norm.h", "activation.h", "dense.h",
            "dense_int8.h", "dense_amx.h", "dense_vnni.h", "dense_int8_avx2.h",
            "dense_dpbf16.h", "team.h")
_COMMON_FLAGS = ["-O3", "-fPIC", "-std=c++17", "-Wno-psabi", "-fno-math-errno"]
COMPILER = os.environ.get("CXX", "g++")
BUILD_TIMEOUT_SECONDS = 600

_loaded = {}


def allowed(switch):
    """Whether a rewrite putting our kernels in may run in this process: its environment
    switch (`switch`, e.g. BERT_PACKED_ATTENTION) not "0", and no GPU to run the graph (the
    kernels are the CPU's)."""
    return os.environ.get(switch, "1") != "0" and not tf.config.list_physical_devices("GPU")


def cache_folder():
    """Where built libraries are kept (see the module's docstring)."""
    chosen = os.environ.get("BERT_TF_OPS_CACHE")
    if chosen:
        return chosen
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "bert-tf", "ops")


def _compiler_version():
    try:
        done = subprocess.run([COMPILER, "--version"], capture_output=True, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.splitlines()[0] if done.returncode == 0 and done.stdout else None


def library_path():
    """(the path the library has or will have for these sources and this TensorFlow, None)
    or (None, why not) where no compiler answers."""
    version = _compiler_version()
    if version is None:
        return None, f"no C++ compiler ({COMPILER}) on PATH"
    digest = hashlib.sha256()
    for name in sorted(_VECTOR_UNITS) + [_OP_UNIT, _NO_AMX_UNIT, *_HEADERS]:
        with open(os.path.join(KERNELS, name), "rb") as source:
            digest.update(name.encode() + b"\0" + source.read())
    digest.update(repr((_VECTOR_UNITS, _COMMON_FLAGS, tf.sysconfig.get_compile_flags(),
                        tf.__version__, version)).encode())
    return os.path.join(cache_folder(), f"bert_tf_ops_{digest.hexdigest()[:16]}.so"), None


def build(path):
    """Compiles the kernels into the library `path` (its units in parallel). Returns None, or
    the compiler's last line of complaint. A compiler without AMX builds the rest
    (`_NO_AMX_UNIT`) and leaves the marker file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(path), prefix=".build-") as scratch:
        def compile_command(unit, flags):
            return [COMPILER, *_COMMON_FLAGS, *flags, "-c", os.path.join(KERNELS, unit),
                    "-o", os.path.join(scratch, unit + ".o")]

        commands = {unit: compile_command(unit, flags) for unit, flags in _VECTOR_UNITS.items()}
        commands[_OP_UNIT] = compile_command(_OP_UNIT, tf.sysconfig.get_compile_flags())
        failures = _run_all(commands)
        if set(failures) == {_AMX_UNIT}:
            commands[_AMX_UNIT] = compile_command(_NO_AMX_UNIT, [])
            failures = _run_all({_AMX_UNIT: commands[_AMX_UNIT]})
            with open(path + _NO_AMX_SUFFIX, "w", encoding="utf-8") as marker:
                marker.write("built without AMX: the compiler knows no -mamx-tile\n")
        if failures:
            return next(iter(failures.values()))
        written = os.path.join(scratch, "library.so")
        link = [COMPILER, "-shared", "-o", written,
                *[command[-1] for command in commands.values()], *tf.sysconfig.get_link_flags()]
        done = subprocess.run(link, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return ((done.stdout + done.stderr).strip().splitlines() or ["link failed"])[-1]
        os.replace(written, path)
    return None


def _run_all(commands):
    """Runs {unit: compiler command} at once; {unit: its last line of complaint} of those
    that failed."""
    running = {unit: subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True) for unit, command in commands.items()}
    failures = {}
    for unit, process in running.items():
        try:
            output, _ = process.communicate(timeout=BUILD_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
            output += f"\ntimed out after {BUILD_TIMEOUT_SECONDS} s"
        if process.returncode != 0:
            failures[unit] = (output.strip().splitlines() or ["failed"])[-1]
    return failures


def amx_built():
    """Whether the loaded library has the dense layers on AMX (its compiler knew AMX)."""
    return library() is not None and _loaded.get("amx", False)


def library():
    """The loaded kernel library (a module with `bert_packed_attention` and
    `bert_add_layer_norm`), or None where it cannot be had (why, said once on stderr)."""
    if "module" in _loaded:
        return _loaded["module"]
    module, why = None, None
    path, why = library_path()
    if path is not None:
        try:
            if not os.path.exists(path):
                why = build(path)
            if why is None:
                module = tf.load_op_library(path)
                _loaded["amx"] = not os.path.exists(path + _NO_AMX_SUFFIX)
        except (OSError, tf.errors.OpError) as err:
            why = f"{err.__class__.__name__}: {str(err).strip().splitlines()[0]}"
    if module is None:
        print(f"note: serving without our kernels ({why}); TensorFlow's ops serve attention "
              "and layer norms instead", file=sys.stderr)
    _loaded["module"] = module
    return module


if __name__ == "__main__":  # python -m finetuning.custom_ops: build now (scripts/install.sh)
    sys.exit(0 if library() is not None else 1)
