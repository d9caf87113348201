"""XLA's environment flags, which TensorFlow reads once, when it is imported.

Entry points call `prepare_xla_environment()` after parsing flags and before importing
TensorFlow, with whether the run is on GPUs:
- on a CPU, TensorFlow honours XLA auto-clustering (`global_jit_level`) only when
  `TF_XLA_FLAGS` contains `--tf_xla_cpu_global_jit`; on GPUs that flag is not wanted (it would
  also cluster the CPU's ops), and NVIDIA's scripts do not set it;
- on GPUs, lazy compilation off, as NVIDIA's `setup_xla_flags` sets it for every BERT script
  ("causes memory fragmentation for bert leading to OOM"); the session's settings are
  `training.run_config`'s;
- on GPUs, XLA pointed at the CUDA of TensorFlow's own pip packages where the venv holds
  them (`use_venv_cuda`). XLA compiles its GPU kernels with `ptxas` and `libdevice`, and
  looks for `ptxas` on PATH first, then in /usr/local/cuda, and only then beside
  TensorFlow (tsl's CandidateCudaRoots, PreferPtxasFromPath): a node whose PATH or
  /usr/local/cuda holds an older CUDA than the 12.2 TensorFlow 2.15 is built for then fails
  to compile, and with it every run (the optimizer's update is XLA-compiled by default).
  The venv's `nvidia-cuda-nvcc-cu12` (brought by `tensorflow[and-cuda]`) holds `bin/ptxas`
  and `nvvm/libdevice` of the right version: its `bin` goes first on PATH and its folder
  becomes `--xla_gpu_cuda_data_dir`, unless the user set that flag.
This module must not import TensorFlow.
"""
import importlib.util
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


CUDA_DATA_DIR_FLAG = "--xla_gpu_cuda_data_dir"


def venv_cuda_dir():
    """The folder of the pip package nvidia-cuda-nvcc-cu12 when it holds XLA's tools
    (bin/ptxas, nvvm/libdevice), else None. Found without importing it or TensorFlow."""
    try:
        spec = importlib.util.find_spec("nvidia.cuda_nvcc")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (os.access(os.path.join(folder, "bin", "ptxas"), os.X_OK)
                and os.path.isdir(os.path.join(folder, "nvvm", "libdevice"))):
            return folder
    return None


def use_venv_cuda(environ=None, folder=None):
    """Points XLA at the venv's CUDA tools (module docstring): its bin first on PATH, its
    folder as --xla_gpu_cuda_data_dir in XLA_FLAGS unless XLA_FLAGS names one. Returns the
    folder, or None when the venv has none (a system CUDA is then XLA's, as before)."""
    environ = os.environ if environ is None else environ
    folder = folder or venv_cuda_dir()
    if not folder:
        return None
    tools = os.path.join(folder, "bin")
    path = [entry for entry in environ.get("PATH", "").split(os.pathsep) if entry]
    environ["PATH"] = os.pathsep.join([tools] + [entry for entry in path if entry != tools])
    flags = environ.get("XLA_FLAGS", "")
    if CUDA_DATA_DIR_FLAG not in flags:
        environ["XLA_FLAGS"] = f"{flags} {CUDA_DATA_DIR_FLAG}={folder}".strip()
    return folder


def prepare_xla_environment(use_xla, on_gpu):
    """TF_XLA_FLAGS for a run: NVIDIA's lazy compilation off on GPUs and XLA pointed at the
    venv's CUDA tools; the CPU JIT flag only for a CPU run that uses XLA. A flag the user
    already set is left as it is."""
    if on_gpu:
        _add_flag(LAZY_COMPILATION_OFF)
        use_venv_cuda()
    elif use_xla:
        enable_cpu_xla()
