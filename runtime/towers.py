"""Several devices in one process without Horovod: in-graph towers, one gradient average.

`--num_local_devices=N` trains on N local devices (GPUs; on a machine without a GPU, N
logical CPU devices, which is how the tests run it) in ONE process. Each session run reads one
batch of N x `--train_batch_size` sequences, splits it into N equal slices ([N*b, ...] ->
N x [b, ...]) and builds the model once per slice under `tf.device` (a "tower"). The trained
("master") variables live on the first device, where tower 0 reads them; tower k >= 1 reads a
local copy of each on its own device (`LocalWeights`). Each tower differentiates its own loss
on its own device, scaled by 1/N (optimization.tower_gradients), so the sum of the towers'
gradients is the gradient of the towers' mean loss: the average Horovod's allreduce would
produce for N ranks with those slices, so the learning rate, global batch and accumulation
arithmetic are the Horovod path's with N x ranks replicas.

What crosses devices, and when (tests/test_tower_traffic.py counts it): inside an accumulation
window each tower adds its gradients into float32 buffers on its own device, so a micro-batch
moves only the towers' input slices and a few scalars. The micro-batch closing a window sums
the towers' buffers onto the first device ((N-1) x the gradient bytes into it), the optimizer
steps there, and the copies are refreshed from the updated masters ((N-1) x the weight bytes
out of it). Without accumulation that happens every micro-batch, as it must.

Why towers and not `tf.distribute.MirroredStrategy` (Estimator's `train_distribute`): this
code's training op is one graph-mode op with state of its own — float32 accumulation buffers
advanced under `tf.cond`, loss-scale variables updated from the finite check, NVLAMB's
`lamb_step`, the `micro_step` counter that seeds dropout and positions a resumed input. Under
MirroredStrategy the model_fn runs once per replica in replica context and every one of these
variables becomes a MirroredVariable whose assignments must be written as cross-replica
`merge_call`s (or with aggregation modes) inside `tf.cond` branches — a rewrite of
optimization/ for one launcher, and the Estimator's support for it is deprecated and untested
in TF 2.x. With towers the training op keeps one finite check, one loss scale, one optimizer
and one set of counters; it only takes the towers' (device, loss, copies) to differentiate
each tower where it runs and to keep one set of accumulation buffers per tower. Checkpoints
keep Google's variable names (the towers add name scopes for ops, never variable scopes; the
copies are local variables the Saver does not see, initialised from the masters after a
restore); the towers' buffers are saved as `gradient_accumulation/tower_<k>/<var>/accum`, so
a run resumed from a checkpoint taken mid-window finishes that window exactly.

The price: every window's end funnels through the first device: (N-1) x the gradient bytes in
and (N-1) x the weight bytes out, where Horovod's ring allreduce moves 2(N-1)/N x the gradient
bytes through each GPU. With NVIDIA's accumulation (128-512 micro-batches a window) that is
noise (BERT-large on 8 A100s: ~63 ms of NVLink per window); without accumulation (fine-tuning)
on PCIe it is ~0.8 s per step for BERT-large on 8 GPUs, and Horovod is the better launcher
(docs/pretraining.md, "Several GPUs without Horovod", has the arithmetic). Memory: each
device k >= 1 holds a float32 copy of the weights and its own float32 buffers.

Losses: each tower's loss is the mean over its slice, and the towers' mean of those equals the
loss of the whole batch when every example weighs the same (BERT's next-sentence loss; its
masked-LM loss when every sequence has the same number of predictions); otherwise it is the
same per-replica average Horovod and gradient accumulation make.
"""
import dataclasses

import tensorflow as tf
from absl import logging

from reporting.errors import UsageError

tf1 = tf.compat.v1


def local_devices(count):
    """Names of the devices of `count` towers: ["/device:GPU:0", ...] on a machine with GPUs;
    without a GPU, `count` logical CPU devices ["/device:CPU:0", ...] (created here, see
    `split_cpu`). UsageError (one line) when the machine has GPUs but fewer than `count`."""
    count = int(count)
    if count < 1:
        raise UsageError(f"--num_local_devices must be at least 1, got {count}")
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        if count > len(gpus):
            raise UsageError(f"--num_local_devices={count} but this machine has {len(gpus)} "
                             "GPU(s) visible (CUDA_VISIBLE_DEVICES)")
        return [f"/device:GPU:{index}" for index in range(count)]
    if count > 1:
        split_cpu(count)
    return [f"/device:CPU:{index}" for index in range(count)]


def split_cpu(count):
    """Makes the CPU `count` logical devices for this process's eager context (listed by
    `tf.config.list_logical_devices`). Only possible before TensorFlow initialises its devices;
    after that the eager view keeps what it had, which is harmless here: the Estimator's graph
    sessions get their CPU devices from `session_device_count` in their ConfigProto, not from
    this context."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError:  # devices already initialised (e.g. in a test process)
        logging.debug("logical CPU devices already initialised: sessions get %d CPU devices "
                      "from their ConfigProto", count)


def session_device_count(devices):
    """{"CPU": N} for a session whose N towers are logical CPU devices, else {}: a graph
    session only creates the CPU devices its ConfigProto.device_count asks for."""
    cpus = [device for device in devices if device and "CPU" in device.upper()]
    return {"CPU": len(cpus)} if len(cpus) > 1 else {}


def split_batch(features, count):
    """Splits each feature [count*b, ...] along its first axis into `count` slices [b, ...].
    Returns `count` dicts with the keys of `features`. The batch must be static and divisible
    (training batches are: the input pipeline drops the remainder)."""
    slices = [{} for _ in range(count)]
    for key, value in features.items():
        batch = value.shape[0] if value.shape.rank else None
        if batch is None or batch % count:
            raise ValueError(f"feature {key!r} of shape {value.shape} cannot be split into "
                             f"{count} equal tower batches")
        for tower, piece in zip(slices, tf.split(value, count, axis=0)):
            tower[key] = piece
    return slices


@dataclasses.dataclass(frozen=True)
class BuiltTower:
    """One tower as `build_towers` made it: its `device`, what `build` returned
    (`outputs`), and `reads`: the local copies this tower reads in place of the trained
    variables, by the variable's name (empty for tower 0, which reads the variables)."""
    device: str
    outputs: object
    reads: dict


class LocalWeights:
    """Custom getter of tower k >= 1: each variable the tower asks for is looked up (or
    created by tower 0) as usual, and the tower gets, instead, a copy of it on its own
    device, made once per variable (`reads`: variable name -> copy).

    The copies are local variables (GraphKeys.LOCAL_VARIABLES), so the Saver never sees them
    and checkpoints keep Google's names and nothing else; the Estimator's local init op runs
    after a restore or the variables' initialisation, so each copy starts as its variable's
    value then. The training op overwrites them after every applied update
    (`optimization.tower_gradients.refresh_local_weights`)."""

    def __init__(self, device, index):
        self.device = device
        self.index = index
        self.reads = {}

    def __call__(self, getter, name, *args, **kwargs):
        variable = getter(name, *args, **kwargs)
        key = variable.op.name
        copy = self.reads.get(key)
        if copy is None:
            # outside the model's control dependencies and name scopes: a plain variable
            with tf.init_scope():
                # the initial value: read on the variable's device, after a restore (local
                # variables are initialised after the others)
                with tf.device(variable.device), \
                        tf1.name_scope(f"tower_{self.index}_local_copy_init/"):
                    value = variable.read_value()
                with tf.device(self.device), tf1.name_scope(f"tower_{self.index}/local_copy/"):
                    copy = tf1.Variable(value, name=key, trainable=False, use_resource=True,
                                        collections=[tf1.GraphKeys.LOCAL_VARIABLES])
            self.reads[key] = copy
        return copy


def build_towers(devices, features, build):
    """Calls `build(tower_features, tower_index)` once per device, under `tf.device(device)`.
    Tower 0 creates the variables on its device and reads them; tower k >= 1 reads local
    copies of them on its own device (`LocalWeights`). Returns a `BuiltTower` per device.

    The towers get the op name scopes tower_0, tower_1, ...; the variables' names are
    unchanged, so checkpoints hold the weights of a single-device run under the same names."""
    built = []
    for index, (device, part) in enumerate(zip(devices, split_batch(features, len(devices)))):
        local = LocalWeights(device, index) if index else None
        with tf.device(device), \
                tf1.variable_scope(tf1.get_variable_scope(), reuse=True if index else None,
                                   custom_getter=local), \
                tf1.name_scope(f"tower_{index}"):
            outputs = build(part, index)
        built.append(BuiltTower(device, outputs, dict(local.reads) if local else {}))
    return built


def tower_mean(values):
    """Mean of the towers' scalars (float32): the loss the run reports (the training op
    differentiates each tower's own loss, `build_towers`)."""
    values = [tf.cast(value, tf.float32) for value in values]
    return values[0] if len(values) == 1 else tf.add_n(values) / float(len(values))
