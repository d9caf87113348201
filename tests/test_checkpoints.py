"""init_from_checkpoint: weights only, logged, shape mismatches refused with a clear line."""
import numpy as np
import pytest
import tensorflow as tf
from absl import logging as absl_logging

from modeling import BertModel, named_config
from modeling.checkpoints import (CheckpointError, init_from_checkpoint, is_model_variable,
                                  resolve_checkpoint)

tf1 = tf.compat.v1


def _graph_with_slots(config, seed):
    """A BERT graph plus optimizer-like state, as a training checkpoint holds it."""
    tf1.set_random_seed(seed)
    model = BertModel(config, False, tf.zeros([1, 4], tf.int32))
    kernel = [v for v in tf1.global_variables() if v.name == "bert/pooler/dense/kernel:0"][0]
    with tf1.variable_scope("bert/pooler/dense"):
        tf1.get_variable("kernel/adam_m", kernel.shape, initializer=tf1.ones_initializer(),
                         trainable=False)
    tf1.train.get_or_create_global_step()
    return model


@pytest.fixture()
def saved(tmp_path):
    config = named_config("tiny").replace(vocab_size=40)
    with tf.Graph().as_default():
        _graph_with_slots(config, seed=1)
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            session.run(tf1.assign(tf1.train.get_global_step(), 777))
            prefix = tf1.train.Saver().save(session, str(tmp_path / "run" / "model.ckpt"), 777)
            values = {v.name: session.run(v) for v in tf1.global_variables()}
    return config, prefix, values


def test_is_model_variable():
    assert is_model_variable("bert/encoder/layer_0/attention/self/query/kernel")
    assert is_model_variable("cls/predictions/output_bias")
    for name in ("bert/pooler/dense/kernel/adam_m", "bert/pooler/dense/kernel/adam_v",
                 "bert/pooler/dense/kernel/lamb_m", "global_step", "micro_step", "loss_scale",
                 "bert/pooler/dense/kernel/accum"):
        assert not is_model_variable(name), name


def test_loads_weights_only_and_logs_each_variable(saved, caplog):
    config, prefix, values = saved
    with tf.Graph().as_default():
        _graph_with_slots(config, seed=2)
        extra = tf1.get_variable("output_weights", [3, config.hidden_size])  # a new head
        with caplog.at_level("INFO"):
            absl_logging.use_python_logging()
            initialised, fresh = init_from_checkpoint(resolve_checkpoint(str(prefix.rsplit("/", 1)[0])))
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            for variable in tf1.trainable_variables():
                got = session.run(variable)
                if variable is extra:
                    assert "output_weights" in fresh
                    continue
                np.testing.assert_array_equal(got, values[variable.name])
            # run state is not taken from the checkpoint
            assert session.run(tf1.train.get_global_step()) == 0
            slot = [v for v in tf1.global_variables() if v.name.endswith("adam_m:0")][0]
            assert set(np.unique(session.run(slot))) == {1.0}
    assert "bert/pooler/dense/kernel" in initialised and len(initialised) == len(values) - 2
    log = caplog.text
    assert "INIT_FROM_CKPT bert/embeddings/word_embeddings" in log
    assert "fresh          output_weights" in log


def test_shape_mismatch_names_checkpoint_and_variable(saved):
    config, prefix, _ = saved
    with tf.Graph().as_default():
        BertModel(config.replace(vocab_size=41), False, tf.zeros([1, 4], tf.int32))
        with pytest.raises(CheckpointError) as info:
            init_from_checkpoint(prefix)
    message = str(info.value)
    assert message.startswith(prefix) and "bert/embeddings/word_embeddings" in message
    assert "[40, 64]" in message and "[41, 64]" in message


def test_missing_checkpoint_is_one_clear_line(tmp_path):
    with pytest.raises(CheckpointError, match=r"nowhere/model\.ckpt: no such checkpoint"):
        resolve_checkpoint(str(tmp_path / "nowhere" / "model.ckpt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="directory holds no checkpoint"):
        resolve_checkpoint(str(tmp_path / "empty"))


def test_a_folder_without_checkpoint_index_resolves_to_its_one_checkpoint(saved, tmp_path):
    """Google's released folders and `hf2tf`'s output hold `bert_model.ckpt.*` and no
    `checkpoint` index file: the folder means that checkpoint; two are ambiguous."""
    _, prefix, _ = saved
    released = tmp_path / "uncased_L-2_H-64_A-4"
    released.mkdir()
    for path in tf.io.gfile.glob(prefix + ".*"):
        suffix = path[len(prefix):]
        tf.io.gfile.copy(path, str(released / f"bert_model.ckpt{suffix}"))
    assert resolve_checkpoint(str(released)) == str(released / "bert_model.ckpt")
    for path in tf.io.gfile.glob(prefix + ".*"):
        tf.io.gfile.copy(path, str(released / f"other.ckpt{path[len(prefix):]}"))
    with pytest.raises(CheckpointError, match=r"2 checkpoints and no 'checkpoint' index file"):
        resolve_checkpoint(str(released))
