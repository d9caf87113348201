"""What in-graph towers (--num_local_devices, runtime/towers.py) move between devices, counted
on two logical CPU devices.

Every tensor crossing devices in a TensorFlow step is a _Send/_Recv pair of the step's
partition graphs (_HostSend/_HostRecv for host memory). One session run of a micro-batch
with FULL_TRACE and output_partition_graphs gives both: the partition graphs say which
tensors are sent from which device to which, the step stats say which of them were computed
in this run (a tensor of a branch not taken is "dead": a flag crosses, no data) and their
shapes. The model is a tiny BERT (~590 KB of float32 weights) fed 2 x 2 sequences of 16
tokens (~1 KB of inputs), so the weights' and gradients' bytes dwarf everything else.

What the towers must move, from the variables' sizes alone (an independent reference: the
sum of their float32 bytes, W):
* a micro-batch inside an accumulation window: tower 1's slice of the batch and a few
  scalars, no weight and no gradient;
* the micro-batch closing a window (every micro-batch without accumulation): tower 1's
  gradient sum to the variables' device (W) and the updated weights back (W).
Before this, every micro-batch moved every weight out to tower 1 and every gradient back
(~W each way inside a window too: 608,752 and 600,220 bytes measured, against 849 and 0).
"""
import collections

import numpy as np
import pytest
import tensorflow as tf

from optimization import is_training_state

tf1 = tf.compat.v1

DEVICES = ("/device:CPU:0", "/device:CPU:1")
BATCH, SEQ, PREDICTIONS = 4, 16, 3     # the whole micro-batch: 2 sequences per tower
SCALARS = 256                          # bytes of scalars a micro-batch may move (loss scale, step)


def tower_graph(accumulation):
    """The pre-training model_fn's TRAIN graph over two towers: (graph, spec, placeholders)."""
    from modeling import named_config
    from pretraining.model_fn import make_model_fn
    from training.settings import TrainingSettings
    config = named_config("tiny").replace(vocab_size=101, hidden_dropout_prob=0.0,
                                          attention_probs_dropout_prob=0.0)
    settings = TrainingSettings(config, devices=DEVICES, num_accumulation_steps=accumulation,
                                learning_rate=1e-3, num_warmup_steps=0, seed=3)
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(1)
        kinds = {"input_ids": ([BATCH, SEQ], tf.int32), "input_mask": ([BATCH, SEQ], tf.int32),
                 "segment_ids": ([BATCH, SEQ], tf.int32),
                 "masked_lm_positions": ([BATCH, PREDICTIONS], tf.int32),
                 "masked_lm_ids": ([BATCH, PREDICTIONS], tf.int32),
                 "masked_lm_weights": ([BATCH, PREDICTIONS], tf.float32),
                 "next_sentence_labels": ([BATCH, 1], tf.int32)}
        with tf.device(DEVICES[0]):   # where the input pipeline's batches arrive
            features = {key: tf1.placeholder(dtype, shape, name=key)
                        for key, (shape, dtype) in kinds.items()}
        spec = make_model_fn(settings)(features, None, tf.estimator.ModeKeys.TRAIN)
    return graph, spec, features


def batches(count):
    rng = np.random.default_rng(5)
    return [{"input_ids": rng.integers(1, 101, [BATCH, SEQ]),
             "input_mask": np.ones([BATCH, SEQ]), "segment_ids": np.zeros([BATCH, SEQ]),
             "masked_lm_positions": rng.integers(1, SEQ, [BATCH, PREDICTIONS]),
             "masked_lm_ids": rng.integers(1, 101, [BATCH, PREDICTIONS]),
             "masked_lm_weights": np.ones([BATCH, PREDICTIONS]),
             "next_sentence_labels": rng.integers(0, 2, [BATCH, 1])} for _ in range(count)]


def session_config():
    from runtime.towers import session_device_count
    return tf1.ConfigProto(allow_soft_placement=True, device_count=session_device_count(DEVICES))


def tensor_bytes(description):
    return (int(np.prod([dim.size for dim in description.shape.dim]))
            * tf.as_dtype(description.dtype).size)


def bytes_between_devices(metadata):
    """{(from device, to device): bytes} of the tensors this run sent between devices."""
    computed = {}
    for device in metadata.step_stats.dev_stats:
        for node in device.node_stats:
            for output in node.output:
                computed[(device.device, node.node_name, output.slot)] = \
                    tensor_bytes(output.tensor_description)
    moved = collections.Counter()
    for partition in metadata.partition_graphs:
        for node in partition.node:
            if not node.op.endswith("Send"):   # _Send, _HostSend
                continue
            source, _, slot = node.input[0].partition(":")
            sender = node.attr["send_device"].s.decode()
            receiver = node.attr["recv_device"].s.decode()
            if sender != receiver:
                # absent from the step stats: not computed this run (a dead branch's tensor)
                moved[(sender[-5:], receiver[-5:])] += computed.get(
                    (sender, source, int(slot or 0)), 0)
    return moved


def traced_run(session, fetches, feed):
    metadata = tf1.RunMetadata()
    options = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE,
                             output_partition_graphs=True)
    values = session.run(fetches, feed_dict=feed, options=options, run_metadata=metadata)
    return values, bytes_between_devices(metadata)


def feed_of(features, batch):
    return {features[key]: value for key, value in batch.items()}


@pytest.mark.parametrize("accumulation", [2, 1])
def test_weights_and_gradients_cross_devices_once_per_accumulation_window(accumulation):
    graph, spec, features = tower_graph(accumulation)
    with graph.as_default():
        weight_bytes = sum(v.shape.num_elements() * 4 for v in tf1.trainable_variables())
        boundary = tf1.get_collection("bert_is_optimizer_step")[0]
        creator = tf1.train.ChiefSessionCreator(scaffold=spec.scaffold, config=session_config())
        runs = []
        with tf1.train.MonitoredSession(session_creator=creator) as session:
            for batch in batches(2 * accumulation):
                (_, closed), moved = traced_run(session, [spec.train_op, boundary],
                                                feed_of(features, batch))
                runs.append((bool(closed), moved))
    # tower 1's half of the batch (as fed: int64/float64 arrays arrive as int32/float32)
    slice_bytes = sum(np.prod(value.shape) * 4 // 2 for value in batches(1)[0].values())
    assert weight_bytes > 400 * slice_bytes   # the model's bytes dwarf the inputs'
    out, back = ("CPU:0", "CPU:1"), ("CPU:1", "CPU:0")
    assert [closed for closed, _ in runs] == [(i + 1) % accumulation == 0
                                              for i in range(2 * accumulation)]
    for closed, moved in runs:
        if not closed:   # inside a window: the inputs and a few scalars, nothing else
            assert moved[out] <= slice_bytes + SCALARS, (moved, weight_bytes)
            assert moved[back] <= SCALARS, (moved, weight_bytes)
        else:            # the window's end: one gradient sum in, one weight refresh out
            assert weight_bytes <= moved[back] <= weight_bytes + SCALARS, (moved, weight_bytes)
            assert (weight_bytes <= moved[out]
                    <= weight_bytes + slice_bytes + SCALARS), (moved, weight_bytes)


@pytest.mark.slow  # a minute or more: its file starts early (conftest.py)
def test_a_checkpoint_taken_mid_window_holds_each_towers_sums_and_resumes_exactly(tmp_path):
    """Accumulation 2: a checkpoint after micro-batch 3 of 6 (one window applied, one half
    full) holds tower 1's partial sums under gradient_accumulation/tower_1/ (training state,
    no local copy of a weight, every weight under Google's name); a session restored from
    it (the towers' copies then initialised from the restored weights) finishes the run with
    the uninterrupted run's weights, bit for bit."""
    graph, spec, features = tower_graph(2)
    data = batches(6)
    prefix = str(tmp_path / "model.ckpt")
    with graph.as_default():
        trainable = tf1.trainable_variables()
        with tf1.train.SingularMonitoredSession(scaffold=spec.scaffold,
                                                config=session_config()) as session:
            for index, batch in enumerate(data):
                session.run(spec.train_op, feed_dict=feed_of(features, batch))
                if index == 2:
                    spec.scaffold.saver.save(session.raw_session(), prefix)
            whole = session.run(trainable)
        with tf1.train.SingularMonitoredSession(scaffold=spec.scaffold, config=session_config(),
                                                checkpoint_filename_with_path=prefix) as session:
            for batch in data[3:]:
                session.run(spec.train_op, feed_dict=feed_of(features, batch))
            resumed = session.run(trainable)
        names = {v.op.name for v in trainable}
    reader = tf.train.load_checkpoint(prefix)
    saved = reader.get_variable_to_shape_map()
    assert reader.get_tensor("gradient_accumulation/local_step") == 1
    towers = sorted(name for name in saved if "tower" in name)
    assert towers == sorted(f"gradient_accumulation/tower_1/{name}/accum" for name in names)
    assert all(is_training_state(name) for name in towers)
    assert all(reader.get_tensor(name).any() for name in towers)   # a half-full window
    assert names <= set(saved) and not [name for name in saved if "local_copy" in name]
    for got, want, variable in zip(resumed, whole, trainable):
        np.testing.assert_array_equal(got, want, err_msg=variable.op.name)
