"""--num_local_devices: several devices in one process without Horovod (in-graph towers,
runtime/towers.py), on two logical CPU devices.

Equivalence: 2 towers of B sequences at --learning_rate L/2 (per device, scaled x2 as under
Horovod) train the same weights as 1 device with 2B sequences at L, on the same records. The
tolerance is relative to how far the weights moved from their initial values, so it holds
whatever the CPU's float32 rounding is: the two runs may differ only by reduction order."""
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from optimization import is_training_state
from pretraining.runner import run
from test_finetuning import tiny_model  # noqa: F401  (a fixture)
from test_pretraining import make_flags, write_data

# Dropout off: a 2B batch and two B slices cannot draw the same masks.
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
BATCH = 4            # per device
RELATIVE = 1e-3      # |run A - run B| / |update from the initial weights|


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = write_data(tmp_path_factory.mktemp("local_devices"))
    from modeling import named_config
    named_config("tiny").replace(vocab_size=101, **NO_DROPOUT).to_json_file(
        str(root / "bert_config.json"))
    return root


def weights(path):
    """The model's weights (no optimizer or step state) of checkpoint `path`."""
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if not is_training_state(name) and name not in ("global_step", "micro_step")}


def assert_same_training(got_dir, want_dir, step):
    """The weights at `step` of both folders differ by < RELATIVE of the update from step 0
    (global L2 norms over all weights)."""
    initial = weights(os.path.join(want_dir, "model.ckpt-0"))
    want = weights(os.path.join(want_dir, f"model.ckpt-{step}"))
    got = weights(os.path.join(got_dir, f"model.ckpt-{step}"))
    assert got.keys() == want.keys() == initial.keys()
    update = np.sqrt(sum(np.sum((want[k] - initial[k]) ** 2) for k in want))
    apart = np.sqrt(sum(np.sum((got[k] - want[k]) ** 2) for k in want))
    assert update > 0
    assert apart < RELATIVE * update, (apart, update)


def train(data, folder, **overrides):
    settings = dict(num_train_steps=3, learning_rate=1e-3, seed=7, amp=False, use_xla=False)
    settings.update(overrides)
    return run(make_flags(data, folder, **settings))


def test_two_devices_of_batch_b_train_as_one_device_of_batch_2b(data, tmp_path):
    one = train(data, tmp_path / "one", train_batch_size=2 * BATCH, learning_rate=1e-3)
    two = train(data, tmp_path / "two", train_batch_size=BATCH, learning_rate=5e-4,
                num_local_devices=2)
    assert two["plan"]["local_devices"] == 2 and two["plan"]["ranks"] == 1
    assert two["plan"]["global_batch_size"] == one["plan"]["global_batch_size"] == 2 * BATCH
    assert two["plan"]["peak_learning_rate"] == pytest.approx(1e-3)
    assert_same_training(str(tmp_path / "two"), str(tmp_path / "one"), 3)
    # Google's names: no tower prefix anywhere in the checkpoint
    names = tf.train.load_checkpoint(str(tmp_path / "two" / "model.ckpt-3")) \
        .get_variable_to_shape_map()
    assert "bert/embeddings/word_embeddings" in names
    assert not [name for name in names if "tower" in name]
    assert names.keys() == tf.train.load_checkpoint(
        str(tmp_path / "one" / "model.ckpt-3")).get_variable_to_shape_map().keys()


def stopped_at(monkeypatch, step):
    """Makes the next run stop after optimizer step `step` of its schedule, as a preempted
    run does (checkpoint and input state saved), without changing its --num_train_steps (the
    learning-rate schedule)."""
    import pretraining.runner
    original = pretraining.runner.train_resuming

    def train_resuming(estimator, training_input, output_dir, max_steps, *args, **kwargs):
        return original(estimator, training_input, output_dir, step, *args, **kwargs)

    monkeypatch.setattr(pretraining.runner, "train_resuming", train_resuming)


# Accumulation 2 under float16 AMP (loss-scaled gradients). The initial loss scale is one
# neither layout overflows at: one device reduces twice as many rows per gradient as a tower,
# so at a scale near the limit (2**18 with these records) it may overflow and skip a step
# where the towers do not, a true difference of float16 sums, not of the towers.
FLOAT16_ACCUMULATION = dict(num_train_steps=4, num_accumulation_steps=2, amp=True,
                            amp_dtype="float16", init_loss_scale=2.0 ** 15)
TOWERS = dict(FLOAT16_ACCUMULATION, train_batch_size=BATCH, learning_rate=5e-4,
              num_local_devices=2)


@pytest.mark.slow
def test_float16_accumulation_on_two_devices_trains_as_one_device(data, tmp_path):
    towers = train(data, tmp_path / "towers", **TOWERS)
    assert towers["plan"]["global_batch_size"] == BATCH * 2 * 2
    assert towers["plan"]["precision"] == "fp16"
    train(data, tmp_path / "one", **dict(FLOAT16_ACCUMULATION, train_batch_size=2 * BATCH,
                                         learning_rate=1e-3))
    assert_same_training(str(tmp_path / "towers"), str(tmp_path / "one"), 4)
    # the same checkpoint names plus tower 1's accumulation buffers (training state)
    names = {folder: set(tf.train.load_checkpoint(str(tmp_path / folder / "model.ckpt-4"))
                         .get_variable_to_shape_map()) for folder in ("towers", "one")}
    extra = names["towers"] - names["one"]
    assert names["one"] <= names["towers"]
    assert extra == {f"gradient_accumulation/tower_1/{name[:-len('/accum')]}/accum"
                     for name in names["one"] if name.endswith("/accum")}
    assert all(is_training_state(name) for name in extra)


@pytest.mark.slow
def test_two_devices_stopped_and_resumed_reach_the_uninterrupted_weights(data, tmp_path):
    """Stopped at step 2 (of 4, mid-schedule) and resumed, the towers under float16 AMP and
    accumulation 2 reach the uninterrupted run's weights, loss scale and counters."""
    train(data, tmp_path / "whole", **TOWERS)
    with pytest.MonkeyPatch.context() as patch:
        stopped_at(patch, 2)
        train(data, tmp_path / "resumed", **TOWERS)
    assert tf.train.latest_checkpoint(str(tmp_path / "resumed")).endswith("model.ckpt-2")
    train(data, tmp_path / "resumed", **TOWERS)
    assert_same_training(str(tmp_path / "resumed"), str(tmp_path / "whole"), 4)
    reader = {folder: tf.train.load_checkpoint(str(tmp_path / folder / "model.ckpt-4"))
              for folder in ("whole", "resumed")}
    for name in ("micro_step", "loss_scale/skipped_steps", "loss_scale/loss_scale",
                 "global_step"):
        assert reader["whole"].get_tensor(name) == reader["resumed"].get_tensor(name), name
    # micro_step counts the process's micro-batches (all towers at once): windows of 2
    skipped = int(reader["whole"].get_tensor("loss_scale/skipped_steps"))
    assert reader["whole"].get_tensor("micro_step") == (4 + skipped) * 2


def test_tower_ops_run_on_their_devices_and_share_variables():
    """Graph only: tower 1's forward and backward ops are placed on the second device, it
    reads no trained weight but its local copies (non-saved local variables on that device),
    and no variable is created twice."""
    from modeling import named_config
    from pretraining.model_fn import make_model_fn
    from training.settings import TrainingSettings
    devices = ("/device:CPU:0", "/device:CPU:1")
    settings = TrainingSettings(named_config("tiny").replace(vocab_size=101, **NO_DROPOUT),
                                devices=devices)
    graph = tf.Graph()
    with graph.as_default():
        batch, seq, predictions = 2 * BATCH, 16, 3
        features = {
            "input_ids": tf.ones([batch, seq], tf.int32),
            "input_mask": tf.ones([batch, seq], tf.int32),
            "segment_ids": tf.zeros([batch, seq], tf.int32),
            "masked_lm_positions": tf.ones([batch, predictions], tf.int32),
            "masked_lm_ids": tf.ones([batch, predictions], tf.int32),
            "masked_lm_weights": tf.ones([batch, predictions], tf.float32),
            "next_sentence_labels": tf.zeros([batch, 1], tf.int32),
        }
        make_model_fn(settings)(features, None, tf.estimator.ModeKeys.TRAIN)
        names = [v.op.name for v in tf.compat.v1.global_variables()]
        assert len(names) == len(set(names))
        assert not [name for name in names if "tower" in name or "bert_1" in name]
        tower1 = [op for op in graph.get_operations() if op.name.startswith("tower_1/")]
        backward = [op for op in graph.get_operations()
                    if "gradients" in op.name and "tower_1/" in op.name]
        assert tower1 and backward
        for op in tower1 + backward:
            if op.type not in ("ReadVariableOp", "Const", "NoOp"):
                assert op.device.endswith("CPU:1"), (op.name, op.device)
        trained = {v.op.name for v in tf.compat.v1.trainable_variables()}
        reads = [op for op in tower1 if op.type in ("ReadVariableOp", "ResourceGather")]
        assert reads and not [op.name for op in reads if op.inputs[0].op.name in trained]
        copies = tf.compat.v1.local_variables()
        assert sorted(v.op.name for v in copies) == sorted(
            f"tower_1/local_copy/{name}" for name in trained)
        assert all(v.device.endswith("CPU:1") for v in copies)


def test_bad_values_are_one_line_errors(data, tmp_path, repo_root):
    """--horovod with towers, and (on a GPU machine) more devices than GPUs, are refused in one
    line before anything is written."""
    args = [sys.executable, "run_pretraining.py", f"--bert_config_file={data}/bert_config.json",
            f"--input_files_dir={data}/train", f"--output_dir={tmp_path}/out", "--do_train",
            "--num_local_devices=2", "--horovod"]
    result = subprocess.run(args, cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: --horovod runs one device per rank: pass --horovod (horovodrun "
                      "-np N) or --num_local_devices=N (one process), not both"], result.stderr
    from reporting.errors import UsageError
    from runtime import towers
    with pytest.raises(UsageError, match="at least 1"):
        towers.local_devices(0)
    # a machine with two GPUs (stand-ins: only their number is read)
    listed = tf.config.list_physical_devices
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(towers.tf.config, "list_physical_devices",
                      lambda kind=None: ["gpu0", "gpu1"] if kind == "GPU" else listed(kind))
        assert towers.local_devices(2) == ["/device:GPU:0", "/device:GPU:1"]
        with pytest.raises(UsageError) as raised:
            towers.local_devices(3)
    assert str(raised.value) == ("--num_local_devices=3 but this machine has 2 GPU(s) visible "
                                 "(CUDA_VISIBLE_DEVICES)")


@pytest.mark.slow
def test_fine_tuning_on_two_devices_trains_as_one_device(shared_data, tiny_model, tmp_path,
                                                         repo_root):
    """run_squad.py --num_local_devices=2 in a fresh process (the logical CPU devices are made
    at start-up, before TensorFlow initialises its devices): the same weights as one device
    with twice the batch. SQuAD, not GLUE: Google's classifier head has a fixed dropout of 0.1
    whose masks no split of the batch can reproduce."""
    from test_finetuning import run_cli, split_squad
    from modeling import BertConfig
    paths = split_squad(shared_data, str(tmp_path), fraction=0.1)
    config = BertConfig.from_json_file(str(tiny_model / "bert_config.json"))
    config.replace(**NO_DROPOUT).to_json_file(str(tmp_path / "bert_config.json"))
    common = [f"--vocab_file={tiny_model / 'vocab.txt'}",
              f"--bert_config_file={tmp_path / 'bert_config.json'}", "--do_train",
              f"--train_file={paths['train']}", "--max_seq_length=64", "--doc_stride=32",
              "--max_query_length=16", "--num_train_epochs=1", "--noamp", "--nouse_xla"]
    stdout = run_cli("run_squad.py", repo_root, *common, "--train_batch_size=8",
                     "--learning_rate=1e-3", "--num_local_devices=2",
                     f"--output_dir={tmp_path / 'two'}")
    assert "2 devices in one process" in stdout + open(tmp_path / "two" / "run_squad.log").read()
    run_cli("run_squad.py", repo_root, *common, "--train_batch_size=16",
            "--learning_rate=2e-3", f"--output_dir={tmp_path / 'one'}")
    last = tf.train.latest_checkpoint(str(tmp_path / "one"))
    step = int(last.rsplit("-", 1)[1])
    assert step > 1 and tf.train.latest_checkpoint(str(tmp_path / "two")).endswith(f"-{step}")
    assert_same_training(str(tmp_path / "two"), str(tmp_path / "one"), step)
