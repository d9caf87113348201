"""Several devices in one process without Horovod: in-graph towers, one gradient average.

`--num_local_devices=N` trains on N local devices (GPUs; on a machine without a GPU, N
logical CPU devices, which is how the tests run it) in ONE process. Each session run reads one
batch of N x `--train_batch_size` sequences, splits it into N equal slices ([N*b, ...] ->
N x [b, ...]), builds the model once per slice under `tf.device` (a "tower"; all towers share
the same variables), and trains on the mean of the towers' losses. The gradient of that mean is
the average of the towers' gradients; with `colocate_gradients_with_ops` (optimization.train_op)
each tower's backward pass runs on its own device and only the sum into each variable's
gradient happens on the variable's device. That average is exactly what Horovod's allreduce
would produce for N ranks with those slices, so the learning rate, global batch and
accumulation arithmetic are the Horovod path's with N x ranks replicas.

Why towers and not `tf.distribute.MirroredStrategy` (Estimator's `train_distribute`): this
code's training op is one graph-mode op with state of its own — float32 accumulation buffers
advanced under `tf.cond`, loss-scale variables updated from the finite check, NVLAMB's
`lamb_step`, the `micro_step` counter that seeds dropout and positions a resumed input. Under
MirroredStrategy the model_fn runs once per replica in replica context and every one of these
variables becomes a MirroredVariable whose assignments must be written as cross-replica
`merge_call`s (or with aggregation modes) inside `tf.cond` branches — a rewrite of
optimization/ for one launcher, and the Estimator's support for it is deprecated and untested
in TF 2.x. Towers leave the training op as it is: it sees one loss and one set of variables, so
accumulation, AMP and loss scaling, skip-on-overflow, checkpoints (Google's variable names: the
towers add name scopes for ops, never variable scopes) and resume are the single-device ones.
The price: the weights live on the first device (the others read them each micro-batch), which
on one box with NVLink/PCIe is the cost of the broadcast MirroredStrategy would make anyway.

Losses: each tower's loss is the mean over its slice, and the towers' mean of those equals the
loss of the whole batch when every example weighs the same (BERT's next-sentence loss; its
masked-LM loss when every sequence has the same number of predictions); otherwise it is the
same per-replica average Horovod and gradient accumulation make.
"""
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


def build_towers(devices, features, build):
    """Calls `build(tower_features, tower_index)` once per device, under `tf.device(device)`,
    with the variables shared: tower 0 creates them (on its device), the others reuse them by
    name. Returns the list of what `build` returned.

    The towers get the op name scopes tower_0, tower_1, ...; variable names are unchanged, so
    checkpoints are those of a single-device run."""
    outputs = []
    for index, (device, part) in enumerate(zip(devices, split_batch(features, len(devices)))):
        with tf.device(device), \
                tf1.variable_scope(tf1.get_variable_scope(), reuse=True if index else None), \
                tf1.name_scope(f"tower_{index}"):
            outputs.append(build(part, index))
    return outputs


def tower_mean(values):
    """Mean of the towers' scalars (float32): the loss whose gradient is their average."""
    values = [tf.cast(value, tf.float32) for value in values]
    return values[0] if len(values) == 1 else tf.add_n(values) / float(len(values))
