"""What a GPU run learns of its node before TensorFlow computes anything, proven on a CPU:
the GPUs' memory from the driver's own tool (nvidia-smi, faked here by a recorded answer),
NVIDIA's containers counting as a GPU expectation, XLA pointed at the venv's CUDA tools
ahead of an older system CUDA, whether XLA is used anywhere when --nouse_xla is given, and
XLA's clusters counted in the graph a session executes."""
import os
import stat
import subprocess
import sys
import types

import pytest

from runtime import devices, speed_defaults, xla_env
from training import xla_evidence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# `nvidia-smi --query-gpu=index,uuid,memory.total --format=csv,noheader,nounits` on an
# 8 x H100 80GB HBM3 node (values as the driver prints them: MiB).
SMI_H100 = "\n".join(f"{i}, GPU-{i:08d}-aaaa-bbbb-cccc-000000000000, 81559" for i in range(8))


def _smi(text, fail=False):
    def run(command, **kwargs):
        assert command[:2] == ["nvidia-smi", "--query-gpu=index,uuid,memory.total"]
        if fail:
            raise FileNotFoundError("nvidia-smi")
        return types.SimpleNamespace(stdout=text)
    return run


def test_gpu_memory_comes_from_nvidia_smi_in_tensorflows_order():
    mib = 81559 * 1024 ** 2
    assert devices.smi_memory(2, {}, _smi(SMI_H100)) == [mib, mib]
    # CUDA_VISIBLE_DEVICES=5,2 (or a UUID): TensorFlow's GPU 0 is physical GPU 5
    smi = SMI_H100.replace("5, GPU-00000005-aaaa-bbbb-cccc-000000000000, 81559",
                           "5, GPU-00000005-aaaa-bbbb-cccc-000000000000, 40000")
    assert devices.smi_memory(2, {"CUDA_VISIBLE_DEVICES": "5,2"}, _smi(smi)) == \
        [40000 * 1024 ** 2, mib]
    assert devices.smi_memory(1, {"CUDA_VISIBLE_DEVICES": "GPU-00000005-aaaa-bbbb-cccc-"
                                                         "000000000000"}, _smi(smi)) == \
        [40000 * 1024 ** 2]
    assert devices.smi_memory(2, {}, _smi("", fail=True)) == [None, None]


def test_the_phase_batches_follow_the_memory_the_driver_reports():
    """A GPU NVIDIA has no table for (an H100 PCIe's name carries no memory) takes the batch
    of the published GPU of the most memory up to its own; unknown memory, a small batch."""
    from pretraining import published_speed
    known = 81559 * 1024 ** 2
    assert published_speed.phase_batch("NVIDIA H100 PCIe", known, "fp16", 128)[0] == 64
    assert published_speed.phase_batch("NVIDIA H100 PCIe", known, "fp16", 512)[0] == 16
    assert published_speed.phase_batch("NVIDIA L40S", 48 * 10 ** 9, "fp16", 512)[0] == 16
    assert published_speed.phase_batch("NVIDIA H100 PCIe", None, "fp16", 128)[0] == 8
    assert published_speed.phase_batch("NVIDIA H100 PCIe", None, "fp16", 512)[0] == 2


def test_a_container_of_nvidias_images_expects_a_gpu(tmp_path):
    no_nodes = str(tmp_path / "nvidia[0-9]*")
    for value in ("all", "0,1", "GPU-00000005-aaaa"):
        assert devices.gpu_expected({"NVIDIA_VISIBLE_DEVICES": value}, no_nodes) == \
            f"NVIDIA_VISIBLE_DEVICES={value}"
    for value in ("", "void", "none", "VOID"):
        assert devices.gpu_expected({"NVIDIA_VISIBLE_DEVICES": value}, no_nodes) is None
    # CUDA_VISIBLE_DEVICES hiding every GPU wins over the container's variable
    assert devices.gpu_expected({"NVIDIA_VISIBLE_DEVICES": "all",
                                 "CUDA_VISIBLE_DEVICES": "-1"}, no_nodes) is None


def test_a_training_command_in_a_gpu_container_without_gpus_stops_in_one_line(tmp_path):
    """Our image run without --gpus: NVIDIA_VISIBLE_DEVICES=all, no /dev/nvidia*, a CPU-only
    TensorFlow here: the command stops naming why, instead of training on the CPU."""
    env = dict(os.environ, NVIDIA_VISIBLE_DEVICES="all")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "run_pretraining.py"),
         f"--bert_config_file={tmp_path / 'none.json'}", f"--input_files_dir={tmp_path}",
         f"--output_dir={tmp_path / 'out'}", "--do_train"],
        capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert lines and lines[-1].startswith("error: a GPU was expected (NVIDIA_VISIBLE_DEVICES="
                                          "all) but TensorFlow sees none: "), result.stderr
    assert "Traceback" not in result.stderr


def _fake_cuda(folder, version):
    """A CUDA tools folder as nvidia-cuda-nvcc-cu12 lays it out: bin/ptxas (printing its
    version) and nvvm/libdevice."""
    (folder / "bin").mkdir(parents=True)
    (folder / "nvvm" / "libdevice").mkdir(parents=True)
    ptxas = folder / "bin" / "ptxas"
    ptxas.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {version}'\n")
    ptxas.chmod(ptxas.stat().st_mode | stat.S_IXUSR)
    return folder


def test_xla_takes_the_venvs_ptxas_before_an_older_system_one(tmp_path, monkeypatch):
    system = _fake_cuda(tmp_path / "usr-local-cuda-11.8", "11.8")
    venv = _fake_cuda(tmp_path / "site-packages" / "nvidia" / "cuda_nvcc", "12.2")
    environ = {"PATH": f"{system / 'bin'}:/usr/bin"}
    assert xla_env.use_venv_cuda(environ, str(venv)) == str(venv)
    assert environ["PATH"].split(":")[0] == str(venv / "bin")
    assert environ["XLA_FLAGS"] == f"--xla_gpu_cuda_data_dir={venv}"
    found = subprocess.run(["ptxas"], capture_output=True, text=True,
                           env={"PATH": environ["PATH"]}).stdout
    assert "release 12.2" in found
    # a data dir the user chose stays; no venv tools: nothing changes
    chosen = {"PATH": "/usr/bin", "XLA_FLAGS": "--xla_gpu_cuda_data_dir=/opt/cuda"}
    xla_env.use_venv_cuda(chosen, str(venv))
    assert chosen["XLA_FLAGS"] == "--xla_gpu_cuda_data_dir=/opt/cuda"
    monkeypatch.setattr(xla_env, "venv_cuda_dir", lambda: None)
    untouched = {"PATH": "/usr/bin"}
    assert xla_env.use_venv_cuda(untouched) is None and untouched == {"PATH": "/usr/bin"}


def test_the_venvs_cuda_tools_are_found_as_the_pip_package_installs_them(tmp_path):
    """nvidia-cuda-nvcc-cu12 12.2.140 (TensorFlow 2.15.1's) installs nvidia/cuda_nvcc/bin/ptxas
    and nvidia/cuda_nvcc/nvvm/libdevice/libdevice.10.bc into site-packages, without an
    __init__ in nvidia/ (a namespace package): found on sys.path, not imported."""
    site = tmp_path / "site"
    venv = _fake_cuda(site / "nvidia" / "cuda_nvcc", "12.2")
    (venv / "__init__.py").write_text("")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from runtime import xla_env; "
            "print(xla_env.venv_cuda_dir())")
    found = subprocess.run([sys.executable, "-c", code, str(site)], capture_output=True,
                           text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
    assert found.stdout.strip() == str(venv), found.stderr


@pytest.mark.parametrize("given, use_xla, gpu, env, fused", [
    ({"use_xla"}, False, True, "", False),      # --nouse_xla on a GPU: no XLA anywhere
    ({"use_xla"}, False, False, "", False),     # --nouse_xla on a CPU: the same
    (set(), True, True, "", True),              # NVIDIA's default on a GPU
    (set(), True, False, "", True),             # the CPU turned the default off: update fused
    ({"use_xla"}, True, False, "", True),
    (set(), True, True, "0", False),            # BERT_FUSED_OPTIMIZER=0 turns it off
])
def test_the_fused_optimizer_update_follows_nouse_xla(given, use_xla, gpu, env, fused,
                                                      monkeypatch):
    monkeypatch.setenv("BERT_FUSED_OPTIMIZER", env)
    options = types.SimpleNamespace(amp=False, amp_dtype="float16", use_xla=use_xla,
                                    given=given)
    speed = speed_defaults.resolve(options, gpu=gpu)
    assert speed.fused_update is fused


def _graph(*ops):
    import tensorflow as tf
    graph = tf.compat.v1.GraphDef()
    for index, op in enumerate(ops):
        graph.node.add(name=f"n{index}", op=op)
    return graph


def test_xla_clusters_and_the_matmuls_left_outside_are_counted():
    """The partition graphs of a session run (one per device): `_XlaCompile` per cluster, the
    matmuls TensorFlow's own kernels still run under any of their names."""
    clustered = [_graph("_XlaCompile", "_XlaRun", "_XlaMerge", "_MklMatMul"),
                 _graph("_XlaCompile", "_XlaRun", "Identity")]
    assert xla_evidence.count_executed(clustered) == (2, 1)
    plain = [_graph("_MklFusedMatMul", "BatchMatMulV2", "_MklBatchMatMulV2", "Einsum", "Relu")]
    assert xla_evidence.count_executed(plain) == (0, 4)
    compiled = xla_evidence.evidence(12, 11, 36)
    assert compiled["compiled"] and compiled["matmuls_in_xla"] == 25
    assert xla_evidence.describe(compiled) == ("XLA compiled the step: 12 clusters, 25 of 36 "
                                               "matmuls inside them")
    little = xla_evidence.evidence(3, 30, 36)  # a few element-wise clusters beside the model
    assert not little["compiled"]
    assert xla_evidence.describe(little).startswith("XLA clustered little: 3 clusters, 6 of 36")
    none = xla_evidence.evidence(0, 36, 36)
    assert not none["compiled"]
    assert xla_evidence.describe(none) == ("no XLA cluster in the step (its 36 matmuls run on "
                                           "TensorFlow's kernels)")
