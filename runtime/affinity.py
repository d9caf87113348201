"""Pins a rank's CPU threads to the CPUs of its GPU's NUMA node (socket).

Host-side work of a rank (input pipeline, kernel launches, Horovod's background thread)
runs fastest on the socket the GPU hangs off: memory copies to the GPU then stay on that
socket's PCIe root and memory. The kernel publishes, for every PCI device, the CPUs local
to it (/sys/bus/pci/devices/<bus id>/local_cpulist, or its numa_node's cpulist); the GPU's
bus id comes from nvidia-smi. Without a GPU, or without that information, nothing changes.
"""
import os
import subprocess

from absl import logging


def parse_cpulist(text):
    """The kernel's list format ("0-3,8-11", "5", "") -> sorted CPU numbers."""
    cpus = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return sorted(cpus)


def sysfs_bus_id(bus_id):
    """nvidia-smi's "00000000:3B:00.0" -> sysfs's "0000:3b:00.0" (16-bit PCI domain)."""
    domain, rest = bus_id.strip().lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def _read(path):
    try:
        with open(path, encoding="ascii") as reader:
            return reader.read().strip()
    except OSError:
        return None


def device_cpus(bus_id, sysfs="/sys"):
    """CPUs local to PCI device `bus_id` (sysfs form), or [] when sysfs does not say."""
    device = os.path.join(sysfs, "bus", "pci", "devices", bus_id)
    cpus = parse_cpulist(_read(os.path.join(device, "local_cpulist")) or "")
    if cpus:
        return cpus
    node = _read(os.path.join(device, "numa_node"))
    if node is None or int(node) < 0:          # -1: a machine without NUMA information
        return []
    path = os.path.join(sysfs, "devices", "system", "node", f"node{int(node)}", "cpulist")
    return parse_cpulist(_read(path) or "")


def choose_cpus(local, allowed):
    """The GPU's local CPUs this process may use (a job's cpuset stays respected), or None
    to leave the affinity alone when they do not overlap."""
    chosen = sorted(set(local) & set(allowed))
    return chosen or None


def visible_gpu(gpu_index, gpus, cuda_visible_devices=None):
    """The (index, uuid, bus id) row of nvidia-smi's `gpus` that this rank's TensorFlow uses:
    GPU number `gpu_index` among those CUDA_VISIBLE_DEVICES (indices or UUIDs) leaves
    visible (the local rank's, or 0 for a rank Slurm bound one GPU: runtime/gpu_binding.py),
    or None when that cannot be told (e.g. MIG devices)."""
    if cuda_visible_devices is not None:
        wanted = [item.strip() for item in cuda_visible_devices.split(",") if item.strip()]
        by_key = {key: gpu for gpu in gpus for key in gpu[:2]}
        gpus = [by_key.get(item) for item in wanted]
    if gpu_index >= len(gpus):
        return None
    return gpus[gpu_index]


def nvidia_smi_gpus():
    """[(index, uuid, pci bus id)] from nvidia-smi, [] when it is absent or fails."""
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return [tuple(field.strip() for field in line.split(","))
            for line in result.stdout.splitlines() if line.count(",") == 2]


def set_process_affinity(cpus):
    """Applies to every thread of the process: threads started earlier (TensorFlow's, Horovod's
    background thread) as well as later ones, which inherit it."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:                        # the thread ended meanwhile
            pass


def pin_to_gpu(gpu_index, sysfs="/sys"):
    """Pins this process to the local CPUs of its GPU, number `gpu_index` among those it sees;
    returns them, or None if left alone."""
    gpus = nvidia_smi_gpus()
    gpu = visible_gpu(gpu_index, gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if gpu is None:
        logging.debug("CPU affinity left alone: no GPU %d visible to nvidia-smi", gpu_index)
        return None
    local = device_cpus(sysfs_bus_id(gpu[2]), sysfs)
    cpus = choose_cpus(local, os.sched_getaffinity(0))
    if cpus is None:
        logging.debug("CPU affinity left alone: GPU %s has no known local CPUs this process "
                      "may use", gpu[2])
        return None
    set_process_affinity(cpus)
    logging.info("GPU %s (nvidia-smi's %s): pinned to CPUs %s", gpu[2], gpu[0],
                 format_cpulist(cpus))
    return cpus


def format_cpulist(cpus):
    """[0, 1, 2, 3, 8] -> "0-3,8" (for logs)."""
    ranges, start = [], None
    for index, cpu in enumerate(cpus):
        if start is None:
            start = cpu
        if index + 1 == len(cpus) or cpus[index + 1] != cpu + 1:
            ranges.append(str(start) if start == cpu else f"{start}-{cpu}")
            start = None
    return ",".join(ranges)
