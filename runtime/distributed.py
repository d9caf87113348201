"""One view of the job's workers, with or without Horovod.

With `--horovod`, each process is one rank: it is pinned to its local GPU (and its threads
to that GPU's CPU socket, runtime/affinity.py), gradients are
averaged with ring-allreduce (float16-compressed under AMP), variables are broadcast from
rank 0 at start, and only rank 0 writes checkpoints, summaries and logs. Without it, the same
object describes a single worker, so the rest of the code never branches on Horovod itself.

With `num_local_devices` N > 1 (no Horovod), the single worker trains N in-graph towers on
this machine's GPUs (or N logical CPU devices without a GPU; runtime/towers.py says why
towers and not MirroredStrategy): `devices` lists them, and `replicas` (ranks x devices) is
what the learning rate and the global batch scale with, as the number of Horovod ranks does.

Devices: a process that should have a GPU and has none stops here, before anything is built
(`runtime.devices.check_devices`; `allow_cpu` lets it run on the CPU), and `describe_devices`
names what each run uses. A Horovod rank sees only its own GPU, in its eager context as in its
sessions (`_restrict_to_rank_gpu`): both then number it GPU:0, as they must in one process.
Which GPU is its own follows its launcher's binding (runtime/gpu_binding.py): the local
rank's among all the node's GPUs, or the one GPU Slurm's --gpus-per-task=1 leaves it; its
threads are pinned by that physical GPU.
"""
import os
import socket

import tensorflow as tf
from absl import logging

from reporting.console import SHOW
from reporting.errors import UsageError
from runtime.affinity import pin_to_gpu
from runtime.devices import check_devices, describe
from runtime.gpu_binding import rank_gpu
from runtime.threads import choose_threads
from runtime.towers import local_devices, session_device_count

tf1 = tf.compat.v1


class Workers:
    """rank/size/local_rank and the Horovod hooks, or a single-worker stand-in for them;
    `devices`: this process's tower devices (empty: one device, no towers)."""

    def __init__(self, use_horovod=False, num_local_devices=1, allow_cpu=False):
        self.use_horovod = bool(use_horovod)
        num_local_devices = int(num_local_devices)
        if num_local_devices < 1:
            raise UsageError(f"--num_local_devices must be at least 1, got {num_local_devices}")
        if self.use_horovod and num_local_devices > 1:
            raise UsageError("--horovod runs one device per rank: pass --horovod (horovodrun "
                             "-np N) or --num_local_devices=N (one process), not both")
        # Before anything initialises TensorFlow's devices (listing them does not).
        self.gpus = check_devices(allow_cpu)
        # Without a GPU, the towers are logical CPU devices, which can only be made before
        # TensorFlow initialises its devices.
        self.devices = local_devices(num_local_devices) if num_local_devices > 1 else []
        self.gpu_index = 0   # this rank's GPU among those it sees (Horovod: set below)
        if self.use_horovod:
            try:
                import horovod.tensorflow as hvd
            except ImportError as err:
                raise RuntimeError(
                    "--horovod needs Horovod built against this TensorFlow: "
                    f"bash scripts/install.sh ({err})") from None
            hvd.init()
            self._hvd = hvd
            self.rank, self.size, self.local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
            # One line a rank (its log file): where each rank ran, for checking a multi-host
            # layout after the fact. HOROVOD_HOSTNAME is the host as horovodrun's -H names it.
            logging.info("rank %d of %d on host %s: local rank %d of %d, cross rank %d of %d",
                         self.rank, self.size,
                         os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname(),
                         self.local_rank, hvd.local_size(), hvd.cross_rank(), hvd.cross_size())
            self._restrict_to_rank_gpu()
        else:
            self._hvd = None
            self.rank, self.size, self.local_rank = 0, 1, 0
        self._threads_logged = False
        self._pin_cpus()

    def _restrict_to_rank_gpu(self):
        """This rank's eager context sees only its own GPU, as its sessions do
        (`session_config`: visible_device_list = that GPU's index). Two views of one process
        that map TensorFlow's GPU:0 to different physical GPUs fail ("mapped to multiple
        devices"): without this an eager op on rank k >= 1 (the bad-record scan after an
        input failure) would map GPU:0 to physical GPU 0 while the session maps it to GPU k."""
        if not self.gpus:
            return
        self.gpu_index = rank_gpu(self.local_rank, self._hvd.local_size(), len(self.gpus))
        if self.gpu_index != self.local_rank:
            logging.info("local rank %d: its launcher bound it one GPU (%s): that one",
                         self.local_rank, os.environ.get("CUDA_VISIBLE_DEVICES"))
        physical = tf.config.list_physical_devices("GPU")
        try:
            tf.config.set_visible_devices([physical[self.gpu_index]], "GPU")
        except RuntimeError:  # devices already initialised (a test process): left as they are
            logging.warning("rank %d: TensorFlow's devices were initialised before Horovod; "
                            "its eager ops may see other GPUs than its sessions", self.rank)

    def used_gpus(self):
        """The GPUs this process computes on: its rank's GPU, its towers' GPUs, or GPU 0."""
        if not self.gpus:
            return []
        if self.use_horovod:
            return [self.gpus[self.gpu_index]]
        return self.gpus[:self.num_devices]

    def describe_devices(self):
        """What the run computes on, for its plan line: "CPU", this process's GPUs, or under
        Horovod "8 ranks, one GPU each; rank 0: GPU 0: NVIDIA ... (...)"."""
        mine = describe(self.used_gpus())
        if not self.use_horovod:
            return mine
        each = "one GPU each" if self.gpus else "on CPUs"
        return f"{self.size} rank(s), {each}; rank {self.rank}: {mine}"

    @property
    def num_devices(self):
        """Devices (towers) of this process: 1 unless --num_local_devices."""
        return max(1, len(self.devices))

    def log_towers(self, global_batch):
        """With towers, one console line: which devices, and the global batch they make."""
        if self.num_devices > 1:
            logging.info("%d devices in one process (in-graph towers, no Horovod): %s; "
                         "global batch %d", self.num_devices, ", ".join(self.devices),
                         global_batch, extra=SHOW)

    @property
    def replicas(self):
        """Model replicas over the job (ranks x towers): what the learning rate and the
        global batch scale with."""
        return self.size * self.num_devices

    def _pin_cpus(self):
        """Runs this process's threads on the CPUs of its GPU's socket, as NVIDIA's scripts
        do; early, so the threads TensorFlow starts later inherit it. A process driving
        several GPUs (towers) spans their sockets and is left alone."""
        if not self.gpus:
            logging.debug("no GPU: CPU affinity left alone")
            return
        if self.num_devices > 1:
            logging.debug("%d tower devices: CPU affinity left alone", self.num_devices)
            return
        pin_to_gpu(self.gpu_index)

    @property
    def is_chief(self):
        return self.rank == 0

    def allreduce_fn(self, compression=None):
        """callable(grad) -> grad averaged over ranks, or None for a single worker.

        ``compression``: None (float32 on the wire) or "fp16" (only for loss-scaled
        float16 gradients: ``training.settings.gradient_compression`` says when)."""
        if not self.use_horovod:
            return None
        if compression not in (None, "fp16"):
            raise ValueError(f"compression must be None or 'fp16', got {compression!r}")
        hvd = self._hvd
        compression = hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none
        return lambda grad: hvd.allreduce(grad, op=hvd.Average, compression=compression)

    def hooks(self):
        """Session hooks every rank runs: the initial broadcast from rank 0."""
        if not self.use_horovod:
            return []
        return [self._hvd.BroadcastGlobalVariablesHook(0)]

    def allreduce_mean(self, value):
        """Averages a scalar over ranks (e.g. for logging); identity for one worker."""
        if not self.use_horovod:
            return value
        return self._hvd.allreduce(value, op=self._hvd.Average)

    def sum_over_ranks(self, value):
        """Sums a scalar over ranks (e.g. flags every rank must agree on); identity for one
        worker. Every rank must evaluate it in the same session runs."""
        if not self.use_horovod:
            return value
        return self._hvd.allreduce(value, op=self._hvd.Sum)

    def session_config(self):
        """ConfigProto pinning this rank to its own GPU (if any). TensorFlow then reserves
        that GPU's memory up front (no allow_growth): growing it piecemeal fragments memory
        and slows the first steps, and no other process shares a training GPU."""
        config = tf1.ConfigProto(allow_soft_placement=True)
        if self.use_horovod and self.gpus:
            config.gpu_options.visible_device_list = str(self.gpu_index)
        for kind, count in session_device_count(self.devices).items():
            config.device_count[kind] = count  # towers on logical CPU devices
        # The cores allotted to this rank, not the whole machine (runtime.threads).
        intra, inter, why = choose_threads(self.local_size(), bool(self.gpus))
        config.intra_op_parallelism_threads = intra
        config.inter_op_parallelism_threads = inter
        if not self._threads_logged:
            logging.info("%s", why)
            self._threads_logged = True
        return config

    def local_size(self):
        return self._hvd.local_size() if self.use_horovod else 1
