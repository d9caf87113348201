"""GPU first contact, as far as a CPU machine shows it (runtime/devices.py, runtime/xla_env.py,
runtime/distributed.py, training/run_config.py):

* no silent CPU: on a node that looks like a GPU node (/dev/nvidia0 in a private mount
  namespace, tests/fake_gpu.py) the training commands stop in one line naming the cause
  (here: this venv's TensorFlow is the CPU-only build), and with --allow_cpu they run on the
  CPU and say so in the plan line;
* NVIDIA's XLA settings on GPU runs: lazy compilation off in the environment the process gets,
  Grappler's memory optimizer off in the session config; the CPU's XLA flag only on CPU runs;
* a Horovod rank sees only its own GPU in its eager context, as in its sessions; its own is
  the local rank's among all the node's GPUs, or the one GPU Slurm bound it
  (--gpus-per-task=1), which its CPU affinity follows; any other count is refused in one line
  whose advice fits;
* the devices named in the plan line (GPU name, compute capability, memory), from faked
  device lists.
"""
import json
import os
import subprocess
import sys
import types

import pytest
import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

import fake_gpu
from runtime import affinity, devices, distributed
from runtime.gpu_binding import rank_gpu
from runtime.devices import GpuInfo, check_devices, gpu_expected, no_gpu_cause
from test_pretraining import command_line, data  # noqa: F401  (module fixture)
from training.run_config import make_run_config
from reporting.errors import UsageError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
A100 = GpuInfo(0, "NVIDIA A100-SXM4-80GB", (8, 0), 80 * 1024 ** 3)


@pytest.fixture
def gpu_node():
    """A function wrapping a command to run where /dev/nvidia0 exists."""
    why = fake_gpu.unavailable()
    if why:
        pytest.skip(why)
    return lambda scratch, args: fake_gpu.command(scratch, args)


def run(args, **kwargs):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_XLA_FLAGS", None)   # conftest's CPU flag: the command decides
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=600, **kwargs)


def error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_gpu_expected_from_device_nodes_and_cuda_visible_devices(tmp_path):
    nodes = str(tmp_path / "nvidia[0-9]*")
    assert gpu_expected({}, nodes) is None
    (tmp_path / "nvidiactl").write_text("")           # the control node alone is no GPU
    assert gpu_expected({}, nodes) is None
    (tmp_path / "nvidia0").write_text("")
    assert gpu_expected({}, nodes) == f"{tmp_path}/nvidia0 exists"
    assert gpu_expected({"CUDA_VISIBLE_DEVICES": ""}, nodes) is None      # all hidden
    assert gpu_expected({"CUDA_VISIBLE_DEVICES": "-1"}, nodes) is None
    assert gpu_expected({"CUDA_VISIBLE_DEVICES": "2,3"}, str(tmp_path / "none*")) == \
        "CUDA_VISIBLE_DEVICES=2,3"


def test_the_cause_is_named_in_the_order_that_decides_it():
    cpu_build = no_gpu_cause()   # this venv holds tensorflow-cpu
    assert "CPU-only build" in cpu_build and "tensorflow-cpu 2.15.1" in cpu_build
    assert "BERT_TF_FLAVOR=gpu bash scripts/install.sh" in cpu_build

    def loads(missing):
        return lambda library: (f"{os.path.basename(library)}: cannot open shared object file"
                                if os.path.basename(library) in missing else None)

    no_driver = no_gpu_cause(True, loads({"libcuda.so.1", "libcudnn.so.8"}), lambda name: None)
    assert no_driver.startswith("the NVIDIA driver's libcuda.so.1 does not load") and \
        "docker run --gpus all" in no_driver
    no_cudnn = no_gpu_cause(True, loads({"libcudnn.so.8", "libcufft.so.11"}), lambda name: None)
    assert no_cudnn.startswith("CUDA libraries not found: libcufft.so.11, libcudnn.so.8")
    assert "nvidia-cudnn-cu12 nvidia-cufft-cu12" in no_cudnn
    assert "nvidia-smi" in no_gpu_cause(True, loads(set()), lambda name: None)


def test_check_devices_refuses_or_warns_only_where_a_gpu_is_expected(caplog):
    assert check_devices(expected=None, gpus=[]) == []                  # a CPU machine
    assert check_devices(expected="/dev/nvidia0 exists", gpus=[A100]) == [A100]
    with pytest.raises(UsageError) as refused:
        check_devices(expected="/dev/nvidia0 exists", gpus=[], cause=lambda: "CAUSE")
    assert str(refused.value) == ("a GPU was expected (/dev/nvidia0 exists) but TensorFlow "
                                  "sees none: CAUSE; or pass --allow_cpu to train on the CPU")
    assert check_devices(True, expected="/dev/nvidia0 exists", gpus=[], cause=lambda: "C") == []
    assert "--allow_cpu: this run computes on the CPU" in caplog.text


@pytest.mark.slow  # a minute or more: its file starts early (conftest.py)
def test_training_commands_on_a_gpu_node_without_gpu_stop_in_one_line(gpu_node, data,  # noqa
                                                                       tmp_path):
    pretrain = run(gpu_node(tmp_path / "ns1", command_line(data, tmp_path / "out")))
    glue = run(gpu_node(tmp_path / "ns2", [
        sys.executable, "run_classifier.py", "--task_name=SST-2", f"--data_dir={tmp_path}",
        f"--vocab_file={tmp_path}/vocab.txt", f"--bert_config_file={data}/bert_config.json",
        f"--output_dir={tmp_path}/glue", "--do_train"]))
    for result in (pretrain, glue):
        assert result.returncode == 1, result.stderr[-2000:]
        [line] = error_lines(result.stderr)
        assert line == (
            "error: a GPU was expected (/dev/nvidia0 exists) but TensorFlow sees none: this "
            "TensorFlow (tensorflow-cpu 2.15.1) is a CPU-only build: install the GPU build "
            "(BERT_TF_FLAVOR=gpu bash scripts/install.sh, or pip install "
            "'tensorflow[and-cuda]==2.15.1'); or pass --allow_cpu to train on the CPU"), line
        assert "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "out" / "model.ckpt-0.index")


def plan_of(stderr):
    [line] = [line for line in stderr.splitlines() if line.startswith("plan: ")]
    return json.loads(line[len("plan: "):])


@pytest.mark.slow  # a minute or more: its file starts early (conftest.py)
def test_allow_cpu_trains_on_the_cpu_and_the_plan_says_so(gpu_node, data, tmp_path):  # noqa
    args = command_line(data, tmp_path / "out") + ["--allow_cpu", "--num_train_steps=1"]
    result = run(gpu_node(tmp_path / "ns", args))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "a GPU was expected (/dev/nvidia0 exists) but TensorFlow sees none" in result.stderr
    assert "--allow_cpu: this run computes on the CPU" in result.stderr
    plan = plan_of(result.stderr)
    # NVIDIA's GPU defaults (--amp, --use_xla) are a CPU run's: float32, and said so
    assert plan["devices"] == "CPU" and plan["precision"] == "fp32"
    assert "without a GPU this run computes in float32 without XLA" in result.stderr
    # a plain CPU machine: the same plan, no warning
    plain = run(command_line(data, tmp_path / "plain") + ["--num_train_steps=1"])
    assert plain.returncode == 0 and plan_of(plain.stderr)["devices"] == "CPU"
    assert "GPU was expected" not in plain.stderr


XLA_ENV_PROBE = """
import os, sys
from absl import flags
from cli.nvidia_flags import start_training_command
from pretraining.options import PretrainingOptions
flags.FLAGS([sys.argv[0]])
start_training_command(flags.FLAGS, PretrainingOptions.of(use_xla=True))
print(os.environ.get("TF_XLA_FLAGS", ""))
"""


def test_xla_environment_is_nvidias_on_gpus_and_the_cpu_flag_only_on_cpus(gpu_node, tmp_path):
    on_gpu = run(gpu_node(tmp_path / "ns", [sys.executable, "-c", XLA_ENV_PROBE]))
    on_cpu = run([sys.executable, "-c", XLA_ENV_PROBE])
    assert on_gpu.returncode == 0 and on_cpu.returncode == 0, on_gpu.stderr + on_cpu.stderr
    gpu_flags, cpu_flags = on_gpu.stdout.split(), on_cpu.stdout.split()
    assert gpu_flags == ["--tf_xla_enable_lazy_compilation=false"], gpu_flags
    assert cpu_flags == ["--tf_xla_cpu_global_jit"], cpu_flags


def stub_workers(gpus):
    return types.SimpleNamespace(gpus=gpus, is_chief=True,
                                 session_config=lambda: tf.compat.v1.ConfigProto())


def test_session_config_under_xla_is_nvidias_on_gpus(tmp_path):
    no_mem_opt = rewriter_config_pb2.RewriterConfig.NO_MEM_OPT
    jit = tf.compat.v1.OptimizerOptions.ON_1
    gpu = make_run_config(str(tmp_path), stub_workers([A100]), use_xla=True,
                          xla_memory_optimizer_off=True).session_config.graph_options
    assert gpu.optimizer_options.global_jit_level == jit
    assert gpu.rewrite_options.memory_optimization == no_mem_opt
    # fine-tuning (NVIDIA sets only the JIT there), a CPU run, and no XLA: memory optimizer as is
    for workers, xla, off in ((stub_workers([A100]), True, False), (stub_workers([]), True, True),
                              (stub_workers([A100]), False, True)):
        options = make_run_config(str(tmp_path), workers, use_xla=xla,
                                  xla_memory_optimizer_off=off).session_config.graph_options
        assert options.rewrite_options.memory_optimization != no_mem_opt
        assert (options.optimizer_options.global_jit_level == jit) == xla


@pytest.fixture
def faked_gpus(monkeypatch):
    """TensorFlow lists 4 A100s; set_visible_devices calls are recorded, not made."""
    return fake_gpu_list(monkeypatch, 4)


def fake_gpu_list(monkeypatch, count):
    """TensorFlow lists `count` A100s; set_visible_devices calls are recorded, not made;
    CPU affinity left alone; no CUDA_VISIBLE_DEVICES, no Slurm step."""
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_GPUS_ON_NODE"):
        monkeypatch.delenv(name, raising=False)
    physical = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU")
                for i in range(count)]
    calls = []
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: physical if kind == "GPU" else [])
    monkeypatch.setattr(tf.config.experimental, "get_device_details",
                        lambda device: {"device_name": A100.name, "compute_capability": (8, 0)})
    monkeypatch.setattr(tf.config, "set_visible_devices",
                        lambda chosen, kind=None: calls.append((list(chosen), kind)))
    monkeypatch.setattr(devices, "_nvml_memory", lambda count: [A100.memory_bytes] * count)
    monkeypatch.setattr(distributed, "pin_to_gpu", lambda gpu_index: None)
    monkeypatch.setattr(distributed, "check_devices",
                        lambda allow_cpu: check_devices(allow_cpu, expected="faked"))
    return physical, calls


def fake_horovod(monkeypatch, rank, local_rank, size=8, local_size=4):
    hvd = types.SimpleNamespace(
        init=lambda: None, rank=lambda: rank, size=lambda: size, local_rank=lambda: local_rank,
        local_size=lambda: local_size, cross_rank=lambda: rank // local_size,
        cross_size=lambda: size // local_size)
    package = types.ModuleType("horovod")
    package.tensorflow = hvd
    monkeypatch.setitem(sys.modules, "horovod", package)
    monkeypatch.setitem(sys.modules, "horovod.tensorflow", hvd)


def test_a_horovod_rank_sees_its_own_gpu_eagerly_as_in_its_sessions(faked_gpus, monkeypatch):
    physical, calls = faked_gpus
    fake_horovod(monkeypatch, rank=5, local_rank=1)
    workers = distributed.Workers(use_horovod=True)
    [(eager_visible, kind)] = calls
    session_visible = workers.session_config().gpu_options.visible_device_list
    assert kind == "GPU" and eager_visible == [physical[1]] and session_visible == "1"
    assert workers.describe_devices() == (
        "8 rank(s), one GPU each; rank 5: GPU 1: NVIDIA A100-SXM4-80GB (compute capability "
        "8.0, 80.0 GiB)")
    fake_horovod(monkeypatch, rank=4, local_rank=4, local_size=5)
    with pytest.raises(UsageError, match="Horovod local rank 4 of 5 on this node sees 4 GPUs"):
        distributed.Workers(use_horovod=True)


def test_a_rank_slurm_bound_one_gpu_computes_on_it_and_is_pinned_by_it(monkeypatch):
    """srun --gpus-per-task=1 (or --gpu-bind=single:1) leaves each task one GPU: local rank 2
    of 4 sees physical GPU 3 alone (CUDA_VISIBLE_DEVICES=3, as slurmd sets it:
    tests/test_slurm_steps.py). That GPU is the rank's: TensorFlow's GPU 0 in its eager view
    and its sessions, and its threads go to GPU 3's CPUs. (Before, every local rank >= 1
    stopped: "Horovod local rank 2 but this node has 1 GPU(s) visible".)"""
    physical, calls = fake_gpu_list(monkeypatch, 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "4")
    # nvidia-smi sees the node's 4 GPUs; each hangs off its own CPUs
    gpus = [(str(i), f"GPU-{i}", f"00000000:{0x1a + i:02X}:00.0") for i in range(4)]
    pinned = []
    monkeypatch.setattr(distributed, "pin_to_gpu", affinity.pin_to_gpu)
    monkeypatch.setattr(affinity, "nvidia_smi_gpus", lambda: gpus)
    monkeypatch.setattr(affinity, "device_cpus", lambda bus, sysfs: [10 * int(bus[5:7], 16)])
    monkeypatch.setattr(affinity.os, "sched_getaffinity", lambda pid: set(range(300)))
    monkeypatch.setattr(affinity, "set_process_affinity", pinned.append)
    fake_horovod(monkeypatch, rank=6, local_rank=2, local_size=4)
    workers = distributed.Workers(use_horovod=True)
    assert calls == [([physical[0]], "GPU")]
    assert workers.session_config().gpu_options.visible_device_list == "0"
    assert workers.describe_devices().endswith("rank 6: GPU 0: NVIDIA A100-SXM4-80GB "
                                               "(compute capability 8.0, 80.0 GiB)")
    assert pinned == [[10 * (0x1a + 3)]]   # physical GPU 3's CPUs


@pytest.mark.parametrize("local_rank, local_size, visible, environ, expected", [
    (3, 4, 4, {}, 3),                                           # horovodrun: all of them
    (3, 4, 8, {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, 3),
    (3, 4, 1, {"CUDA_VISIBLE_DEVICES": "GPU-5b1e"}, 0),         # bound by UUID
    (1, 2, 1, {},
     "Horovod local rank 1 of 2 on this node, which shows this rank 1 GPU (CUDA_VISIBLE_DEVICES "
     "unset) that every rank on the node would share: start one rank a node (GPUS_PER_NODE=1 "
     "with run.sub or srun, -H HOST:1 with horovodrun)"),
    (1, 4, 2, {"CUDA_VISIBLE_DEVICES": "2,3"},
     "Horovod local rank 1 of 4 on this node sees 2 GPUs (CUDA_VISIBLE_DEVICES=2,3): a rank "
     "must see either one GPU, its own (srun --gpus-per-task=1 or --gpu-bind=single:1), or at "
     "least one GPU per rank on the node (4); if the node has only 2, start 2 ranks a node "
     "(GPUS_PER_NODE=2)"),
    # CUDA_VISIBLE_DEVICES=0 for every rank of a step that has one GPU on the node
    (0, 2, 1, {"CUDA_VISIBLE_DEVICES": "0", "SLURM_GPUS_ON_NODE": "1"},
     "Horovod local rank 0 of 2 on this node: Slurm gave the step 1 GPU(s) on this node "
     "(SLURM_GPUS_ON_NODE) for 2 ranks; ask for 2 a node (sbatch --gpus-per-node=2 or "
     "--gres=gpu:2), or start 1 rank(s) a node (GPUS_PER_NODE=1)"),
], ids=["all", "more_than_ranks", "bound_by_uuid", "one_gpu_shared", "two_of_four",
        "step_too_small"])
def test_which_gpu_is_a_ranks_own_or_why_none_is(local_rank, local_size, visible, environ,
                                                  expected):
    if isinstance(expected, int):
        assert rank_gpu(local_rank, local_size, visible, environ) == expected
    else:
        with pytest.raises(UsageError) as refused:
            rank_gpu(local_rank, local_size, visible, environ)
        assert str(refused.value) == expected


def test_the_plan_names_the_gpus_of_one_process_and_of_its_towers(faked_gpus):
    assert distributed.Workers().describe_devices() == (
        "GPU 0: NVIDIA A100-SXM4-80GB (compute capability 8.0, 80.0 GiB)")
    assert distributed.Workers(num_local_devices=4).describe_devices() == (
        "GPUs 0-3: 4 x NVIDIA A100-SXM4-80GB (compute capability 8.0, 80.0 GiB)")
    assert devices.describe([GpuInfo(0, "A"), GpuInfo(2, "B", (7, 0))]) == \
        "GPUs 0: A; 2: B (compute capability 7.0)"

