"""XLA's environment flags, which TensorFlow reads once, when it is imported.

Entry points call `prepare_xla_environment()` after parsing flags and before importing
TensorFlow, with whether the run is on GPUs:
- on a CPU, TensorFlow honours XLA auto-clustering (`global_jit_level`) only when
  `TF_XLA_FLAGS` contains `--tf_xla_cpu_global_jit`; on GPUs that flag is not wanted (it would
  also cluster the CPU's ops), and NVIDIA's scripts do not set it;
- on GPUs, lazy compilation off, as NVIDIA's `setup_xla_flags` sets it for every BERT script
  ("causes memory fragmentation for bert leading to OOM"); the session's settings are
  `training.run_config`'s.
This module must not import TensorFlow.
"""
import os
import sys

XLA_CPU_FLAG = "--tf_xla_cpu_global_jit"
LAZY_COMPILATION_OFF = "--tf_xla_enable_lazy_compilation=false"


def _add_flag(flag):
    flags = os.environ.get("TF_XLA_FLAGS", "")
    if flag.split("=")[0] not in flags:
        os.environ["TF_XLA_FLAGS"] = (flags + " " + flag).strip()


def enable_cpu_xla():
    """Adds the CPU JIT flag to TF_XLA_FLAGS. Returns False if TensorFlow was already
    imported without it (then XLA stays off on the CPU for this process)."""
    if XLA_CPU_FLAG in os.environ.get("TF_XLA_FLAGS", ""):
        return True
    _add_flag(XLA_CPU_FLAG)
    return "tensorflow" not in sys.modules


def prepare_xla_environment(use_xla, on_gpu):
    """TF_XLA_FLAGS for a run: NVIDIA's lazy compilation off on GPUs; the CPU JIT flag only
    for a CPU run that uses XLA. A flag the user already set is left as it is."""
    if on_gpu:
        _add_flag(LAZY_COMPILATION_OFF)
    elif use_xla:
        enable_cpu_xla()
