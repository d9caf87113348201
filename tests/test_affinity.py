"""runtime/affinity.py: the kernel's CPU lists, the GPU a rank uses, and the CPUs it is
pinned to, on a fake sysfs tree (no GPU needed)."""
import os
import threading

import pytest

from runtime import affinity

BUS = "0000:3b:00.0"
GPUS = [("0", "GPU-aaaa", "00000000:1A:00.0"), ("1", "GPU-bbbb", "00000000:3B:00.0"),
        ("2", "GPU-cccc", "00000000:88:00.0"), ("3", "GPU-dddd", "00000000:AF:00.0")]


def fake_sysfs(root, bus=BUS, local_cpulist=None, numa_node=None, nodes=None):
    device = root / "bus" / "pci" / "devices" / bus
    device.mkdir(parents=True)
    if local_cpulist is not None:
        (device / "local_cpulist").write_text(local_cpulist + "\n")
    if numa_node is not None:
        (device / "numa_node").write_text(f"{numa_node}\n")
    for node, cpulist in (nodes or {}).items():
        folder = root / "devices" / "system" / "node" / f"node{node}"
        folder.mkdir(parents=True)
        (folder / "cpulist").write_text(cpulist + "\n")
    return str(root)


@pytest.mark.parametrize("text, cpus", [
    ("0-3,8-11\n", [0, 1, 2, 3, 8, 9, 10, 11]),
    ("5", [5]),
    ("0,2-3,2", [0, 2, 3]),
    ("", []),
    ("\n", []),
])
def test_parse_cpulist(text, cpus):
    assert affinity.parse_cpulist(text) == cpus


def test_format_cpulist_is_the_inverse():
    assert affinity.format_cpulist([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert affinity.parse_cpulist(affinity.format_cpulist([4, 5, 9])) == [4, 5, 9]


def test_nvidia_smi_bus_id_to_sysfs_name():
    assert affinity.sysfs_bus_id("00000000:3B:00.0") == BUS
    assert affinity.sysfs_bus_id("0001:AF:00.0") == "0001:af:00.0"


def test_device_cpus_prefers_local_cpulist(tmp_path):
    sysfs = fake_sysfs(tmp_path, local_cpulist="0-3,8-11", numa_node=1, nodes={1: "4-7"})
    assert affinity.device_cpus(BUS, sysfs) == [0, 1, 2, 3, 8, 9, 10, 11]


def test_device_cpus_falls_back_to_the_numa_node(tmp_path):
    sysfs = fake_sysfs(tmp_path, local_cpulist="", numa_node=1, nodes={0: "0-3", 1: "4-7"})
    assert affinity.device_cpus(BUS, sysfs) == [4, 5, 6, 7]


@pytest.mark.parametrize("numa_node", [-1, None])
def test_device_cpus_unknown(tmp_path, numa_node):
    sysfs = fake_sysfs(tmp_path, numa_node=numa_node, nodes={0: "0-3"})
    assert affinity.device_cpus(BUS, sysfs) == []
    assert affinity.device_cpus("0000:00:00.0", sysfs) == []      # no such device


def test_choose_cpus_respects_the_jobs_cpuset():
    assert affinity.choose_cpus([0, 1, 2, 3, 8, 9], {2, 3, 4, 8}) == [2, 3, 8]
    assert affinity.choose_cpus([0, 1], {4, 5}) is None          # disjoint: leave alone
    assert affinity.choose_cpus([], {0, 1}) is None


def test_visible_gpu_follows_cuda_visible_devices():
    assert affinity.visible_gpu(1, GPUS) == GPUS[1]
    assert affinity.visible_gpu(1, GPUS, "2,3") == GPUS[3]
    assert affinity.visible_gpu(0, GPUS, "GPU-cccc,GPU-aaaa") == GPUS[2]
    assert affinity.visible_gpu(2, GPUS, "0,1") is None           # fewer visible than ranks
    assert affinity.visible_gpu(0, GPUS, "MIG-1234") is None      # cannot tell
    assert affinity.visible_gpu(0, []) is None                    # no GPU at all


def test_pin_to_gpu_pins_the_ranks_socket(tmp_path, monkeypatch):
    sysfs = fake_sysfs(tmp_path, local_cpulist="8-15")
    applied = []
    monkeypatch.setattr(affinity, "nvidia_smi_gpus", lambda: GPUS)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")
    monkeypatch.setattr(affinity.os, "sched_getaffinity", lambda pid: set(range(12)))
    monkeypatch.setattr(affinity, "set_process_affinity", applied.append)
    # local rank 0 uses GPU 1 (bus 3b): its socket's CPUs 8-15, of which the job may use 8-11
    assert affinity.pin_to_gpu(0, sysfs) == [8, 9, 10, 11]
    assert applied == [[8, 9, 10, 11]]
    # local rank 1 uses GPU 2, whose device sysfs does not describe: nothing changes
    assert affinity.pin_to_gpu(1, sysfs) is None
    assert applied == [[8, 9, 10, 11]]


def test_pin_to_gpu_without_gpus_is_a_no_op(tmp_path, monkeypatch):
    monkeypatch.setattr(affinity, "nvidia_smi_gpus", lambda: [])
    monkeypatch.setattr(affinity, "set_process_affinity",
                        lambda cpus: pytest.fail("affinity changed without a GPU"))
    assert affinity.pin_to_gpu(0, str(tmp_path)) is None


def test_nvidia_smi_absent_means_no_gpus(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert affinity.nvidia_smi_gpus() == []


def test_set_process_affinity_reaches_threads_already_running():
    original = os.sched_getaffinity(0)
    target = {min(original)}
    started, stop = threading.Event(), threading.Event()
    seen = {}

    def worker():
        started.set()
        stop.wait(10)
        seen["cpus"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=worker)
    thread.start()
    started.wait(10)
    try:
        affinity.set_process_affinity(target)
        assert os.sched_getaffinity(0) == target
    finally:
        stop.set()
        thread.join()
        affinity.set_process_affinity(original)
    assert seen["cpus"] == target
    assert os.sched_getaffinity(0) == original


def test_workers_leave_affinity_alone_without_a_gpu():
    from runtime.distributed import Workers
    before = os.sched_getaffinity(0)
    Workers(use_horovod=False)
    assert os.sched_getaffinity(0) == before
