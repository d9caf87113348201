"""The devices a run will use, and no silent fall-back to the CPU on a GPU machine.

A GPU node can leave TensorFlow without a GPU in two common ways: a virtualenv built on a
login node holds the CPU-only TensorFlow (`tensorflow-cpu`), or the CUDA libraries or the
driver TensorFlow needs do not load on the node (a container started without `--gpus`, a
missing module). TensorFlow then places everything on the CPU; its one warning is hidden by
`TF_CPP_MIN_LOG_LEVEL=2`, and pre-training exits 0 days later having trained at a hundredth
of the speed. So a training process that should have a GPU (`gpu_expected`: a device node
/dev/nvidia<N>, CUDA_VISIBLE_DEVICES naming devices, or a container of NVIDIA's that was
meant to get GPUs: NVIDIA_VISIBLE_DEVICES) and sees none stops at start-up with
one line that names the cause (`no_gpu_cause`), unless the user asks for the CPU
(`--allow_cpu`). Every run says which devices it uses (`describe`): the GPUs' names,
compute capabilities and memory, or "CPU". The memory comes from the driver (NVIDIA's
management library, pip `nvidia-ml-py`, else `nvidia-smi`): TensorFlow does not say it.

`gpu_expected` must not import TensorFlow (commands call it before TensorFlow starts, to set
XLA's environment: `runtime.xla_env`); the other functions import it when called.
"""
import ctypes
import dataclasses
import glob
import importlib.metadata
import os
import subprocess
from typing import List, Optional, Tuple

from absl import logging

from reporting.errors import UsageError

GPU_DEVICE_NODES = "/dev/nvidia[0-9]*"
GIB = 1024 ** 3
# The CUDA libraries TensorFlow 2.15 opens when it starts its GPU devices (by the soname
# its CUDA 12 / cuDNN 8 build links), with the pip package of `tensorflow[and-cuda]` that
# ships each one.
TENSORFLOW_CUDA_LIBRARIES = (
    ("libcudart.so.12", "nvidia-cuda-runtime-cu12"),
    ("libcublas.so.12", "nvidia-cublas-cu12"),
    ("libcublasLt.so.12", "nvidia-cublas-cu12"),
    ("libcufft.so.11", "nvidia-cufft-cu12"),
    ("libcusolver.so.11", "nvidia-cusolver-cu12"),
    ("libcusparse.so.12", "nvidia-cusparse-cu12"),
    ("libcudnn.so.8", "nvidia-cudnn-cu12"),
)
DRIVER_LIBRARY = "libcuda.so.1"
GPU_INSTALL = "BERT_TF_FLAVOR=gpu bash scripts/install.sh"


# NVIDIA_VISIBLE_DEVICES values with which NVIDIA's container runtime gives a container no
# GPU (unset and "void": a plain container; "none": the driver's tools but no device).
NO_CONTAINER_GPU = ("", "void", "none")


def gpu_expected(environ=None, device_nodes=GPU_DEVICE_NODES) -> Optional[str]:
    """Why this process should see a GPU ("/dev/nvidia0 exists", "CUDA_VISIBLE_DEVICES=0,1",
    "NVIDIA_VISIBLE_DEVICES=all"), or None. CUDA_VISIBLE_DEVICES set to "" or "-1" hides
    every GPU: then none is expected. NVIDIA_VISIBLE_DEVICES is set by NVIDIA's CUDA images
    (this project's among them) for the container runtime: a container of such an image
    started without `--gpus` has no /dev/nvidia* and would otherwise train on the CPU."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        visible = visible.strip()
        if not visible or visible.split(",")[0].strip() == "-1":
            return None
        return f"CUDA_VISIBLE_DEVICES={visible}"
    nodes = sorted(glob.glob(device_nodes))
    if nodes:
        return f"{nodes[0]} exists"
    container = environ.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if container.lower() not in NO_CONTAINER_GPU:
        return f"NVIDIA_VISIBLE_DEVICES={container}"
    return None


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    """One GPU as TensorFlow numbers it (GPU:<index>), with what a user needs to know of it."""
    index: int
    name: str
    compute_capability: Optional[Tuple[int, int]] = None
    memory_bytes: Optional[int] = None

    def describe(self):
        """"NVIDIA A100-SXM4-80GB (compute capability 8.0, 79.2 GiB)"."""
        facts = []
        if self.compute_capability:
            facts.append("compute capability %d.%d" % tuple(self.compute_capability))
        if self.memory_bytes:
            facts.append(f"{self.memory_bytes / GIB:.1f} GiB")
        return self.name + (f" ({', '.join(facts)})" if facts else "")


def describe(gpus: List[GpuInfo], per="process"):
    """The devices of a process (or of each rank, per="rank") in a few words: "CPU", or
    "GPU 0: NVIDIA A100-SXM4-80GB (compute capability 8.0, 79.2 GiB)", or for several GPUs
    of one kind "GPUs 0-3: 4 x NVIDIA ... (...)"."""
    if not gpus:
        return "CPU"
    kinds = {gpu.describe() for gpu in gpus}
    if len(gpus) == 1:
        return f"GPU {gpus[0].index}: {gpus[0].describe()}"
    indexes = [gpu.index for gpu in gpus]
    numbers = (f"{indexes[0]}-{indexes[-1]}" if indexes == list(range(indexes[0], indexes[-1] + 1))
               else ",".join(map(str, indexes)))
    if len(kinds) == 1:
        return f"GPUs {numbers}: {len(gpus)} x {gpus[0].describe()}"
    return "GPUs " + "; ".join(f"{gpu.index}: {gpu.describe()}" for gpu in gpus)


def _nvml_memory(count, environ=None):
    """Total memory of TensorFlow's GPU 0..count-1 from NVIDIA's management library (pip
    `nvidia-ml-py`), or Nones where it is absent or fails. NVML numbers GPUs physically;
    CUDA_VISIBLE_DEVICES (indexes or UUIDs) says which physical GPU is TensorFlow's i-th."""
    environ = os.environ if environ is None else environ
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:  # not installed, or no driver library: memory unknown, said as such
        return [None] * count
    try:
        memory = []
        for chosen in _visible_choice(environ, count):
            try:
                handle = (pynvml.nvmlDeviceGetHandleByIndex(int(chosen)) if chosen.isdigit()
                          else pynvml.nvmlDeviceGetHandleByUUID(chosen))
                memory.append(int(pynvml.nvmlDeviceGetMemoryInfo(handle).total))
            except Exception:
                memory.append(None)
        return memory
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _visible_choice(environ, count):
    """The physical GPU (an index or a UUID, as nvidia-smi and NVML name it) of TensorFlow's
    GPU 0..count-1: CUDA_VISIBLE_DEVICES's entries in order, else the indexes themselves."""
    visible = [part.strip() for part in environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if part.strip()]
    return [visible[index] if index < len(visible) else str(index) for index in range(count)]


def smi_memory(count, environ=None, run=subprocess.run):
    """Total memory of TensorFlow's GPU 0..count-1 from `nvidia-smi` (the driver's own tool,
    on every GPU node), or Nones where it is absent or fails."""
    environ = os.environ if environ is None else environ
    try:
        listed = run(["nvidia-smi", "--query-gpu=index,uuid,memory.total",
                      "--format=csv,noheader,nounits"], capture_output=True, text=True,
                     timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return [None] * count
    by_name = {}
    for line in listed.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) == 3 and cells[2].isdigit():
            by_name[cells[0]] = by_name[cells[1]] = int(cells[2]) * 1024 ** 2  # MiB
    return [by_name.get(chosen) for chosen in _visible_choice(environ, count)]


def gpu_memory(count, environ=None):
    """Total memory of TensorFlow's GPU 0..count-1 from the driver: NVML, else nvidia-smi."""
    memory = _nvml_memory(count, environ) if environ is not None else _nvml_memory(count)
    if count and all(value is None for value in memory):
        memory = smi_memory(count, environ)
    return memory


def visible_gpus() -> List[GpuInfo]:
    """The GPUs TensorFlow lists for this process (no device is initialised by asking)."""
    import tensorflow as tf
    physical = tf.config.list_physical_devices("GPU")
    memory = gpu_memory(len(physical)) if physical else []
    gpus = []
    for index, device in enumerate(physical):
        try:
            details = tf.config.experimental.get_device_details(device)
        except Exception:  # details are a nicety; the device is what counts
            details = {}
        capability = details.get("compute_capability")
        gpus.append(GpuInfo(index, details.get("device_name") or device.name,
                            tuple(capability) if capability else None, memory[index]))
    return gpus


def _site_library(name):
    """The path of CUDA library `name` inside a pip `nvidia-*` package, or None."""
    try:
        import nvidia  # the namespace package of NVIDIA's pip wheels
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        found = glob.glob(os.path.join(root, "*", "lib", name))
        if found:
            return found[0]
    return None


def _loads(library):
    """None when `library` (a soname or a path) loads, else why not."""
    try:
        ctypes.CDLL(library)
        return None
    except OSError as err:
        return str(err)


def _package_version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def no_gpu_cause(built_with_cuda=None, loads=_loads, site_library=_site_library):
    """Why TensorFlow lists no GPU here, as a clause of one line with what to do.

    In the order that decides it: a TensorFlow built without CUDA; the NVIDIA driver's
    library not loading (no driver on the node, or a container started without its GPUs);
    CUDA libraries of TensorFlow's build missing. When all of these load, the reason is
    TensorFlow's own (in the log file); `nvidia-smi` tells whether the node sees its GPUs."""
    if built_with_cuda is None:
        import tensorflow as tf
        built_with_cuda = tf.test.is_built_with_cuda()
    if not built_with_cuda:
        package = next((f"{name} {version}" for name in ("tensorflow-cpu", "tensorflow")
                        for version in [_package_version(name)] if version), "TensorFlow")
        return (f"this TensorFlow ({package}) is a CPU-only build: install the GPU build "
                f"({GPU_INSTALL}, or pip install 'tensorflow[and-cuda]==2.15.1')")
    problem = loads(DRIVER_LIBRARY)
    if problem is not None:
        return (f"the NVIDIA driver's {DRIVER_LIBRARY} does not load ({problem}): no driver "
                "on this node, or a container started without its GPUs (docker run --gpus all)")
    missing = []
    for library, package in TENSORFLOW_CUDA_LIBRARIES:
        path = site_library(library)
        if loads(path or library) is not None:
            missing.append((library, package))
    if missing:
        names = ", ".join(library for library, _ in missing)
        packages = " ".join(sorted({package for _, package in missing}))
        return (f"CUDA libraries not found: {names} (TensorFlow 2.15 needs CUDA 12.2 and cuDNN "
                f"8: pip install {packages}, or {GPU_INSTALL})")
    return ("the driver and CUDA libraries load, yet TensorFlow found no usable GPU: check "
            "`nvidia-smi` and TensorFlow's reason in the log file")


def check_devices(allow_cpu=False, expected=None, gpus=None, cause=None):
    """The GPUs this process has (`visible_gpus`), after refusing a silent CPU run: where a GPU
    is `expected` (default: `gpu_expected()`) and TensorFlow lists none, UsageError naming
    the cause (`no_gpu_cause`), or with `allow_cpu` one warning and an empty list."""
    expected = gpu_expected() if expected is None else expected
    gpus = visible_gpus() if gpus is None else gpus
    if gpus or not expected:
        return gpus
    why = cause() if cause is not None else no_gpu_cause()
    message = f"a GPU was expected ({expected}) but TensorFlow sees none: {why}"
    if not allow_cpu:
        raise UsageError(f"{message}; or pass --allow_cpu to train on the CPU")
    logging.warning("%s; --allow_cpu: this run computes on the CPU", message)
    return gpus
