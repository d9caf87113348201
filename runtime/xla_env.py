"""XLA on the CPU: the environment switch TensorFlow needs before it starts.

TensorFlow honours XLA auto-clustering (`global_jit_level`) on the CPU only when
`TF_XLA_FLAGS` contains `--tf_xla_cpu_global_jit`, and it reads that variable once, when it
is imported. Entry points therefore call `enable_cpu_xla()` after parsing flags and before
importing TensorFlow. (On GPUs the session setting alone is enough.) This module must not
import TensorFlow.
"""
import os
import sys

XLA_CPU_FLAG = "--tf_xla_cpu_global_jit"


def enable_cpu_xla():
    """Adds the CPU JIT flag to TF_XLA_FLAGS. Returns False if TensorFlow was already
    imported without it (then XLA stays off on the CPU for this process)."""
    flags = os.environ.get("TF_XLA_FLAGS", "")
    if XLA_CPU_FLAG in flags:
        return True
    os.environ["TF_XLA_FLAGS"] = (flags + " " + XLA_CPU_FLAG).strip()
    return "tensorflow" not in sys.modules
