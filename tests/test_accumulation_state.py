"""A checkpoint without accumulation state resumed by a run that accumulates
(`resilience.accumulation_state`): the weights and the other state restored as saved, the
missing buffers and counter empty, and the next checkpoint whole. (End to end, through
run_pretraining.py: tests/test_resume_position.py, accumulation 1 -> 2 on purpose and on a
job requeued on fewer ranks.)"""
import numpy as np
import pytest
import tensorflow as tf

from modeling.checkpoints import CheckpointError, refuse_other_model
from resilience.accumulation_state import (FillingSaver, absent_accumulation_state,
                                           is_accumulation_state)

tf1 = tf.compat.v1


def _variables(accumulate):
    """A weight, an optimizer slot and, with `accumulate`, its buffer and the counter; all
    initialised to values a restore must overwrite (or, for the new state, not)."""
    weight = tf1.get_variable("layer/kernel", [2, 3], initializer=tf1.constant_initializer(-1.0))
    slot = tf1.get_variable("layer/kernel/lamb_m", [2, 3], trainable=False,
                            initializer=tf1.constant_initializer(-1.0))
    made = [weight, slot]
    if accumulate:
        made.append(tf1.get_variable("layer/kernel/accum", [2, 3], trainable=False,
                                     initializer=tf1.zeros_initializer()))
        made.append(tf1.get_variable("gradient_accumulation/local_step", [], tf.int64,
                                     trainable=False, initializer=tf1.zeros_initializer()))
    return made


def test_missing_accumulation_state_starts_empty_and_the_rest_is_restored(tmp_path):
    for folder in ("old", "new", "full"):
        (tmp_path / folder).mkdir()
    saved_weight = np.arange(6, dtype=np.float32).reshape(2, 3)
    with tf.Graph().as_default():
        weight, slot = _variables(accumulate=False)
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            session.run([weight.assign(saved_weight), slot.assign(saved_weight * 2)])
            old = tf1.train.Saver().save(session, str(tmp_path / "old" / "model.ckpt"),
                                         global_step=2)

    with tf.Graph().as_default():
        made = _variables(accumulate=True)
        absent = absent_accumulation_state(tf1.global_variables(), old)
        assert [variable.op.name for variable in absent] == [
            "layer/kernel/accum", "gradient_accumulation/local_step"]
        # the whole graph is "another training setup" to the check; without the absent state
        # it is this one
        with pytest.raises(CheckpointError, match="local_step is not in the checkpoint \\(and 1 more\\)"):
            refuse_other_model(str(tmp_path / "old"), tf1.global_variables(), checkpoint=old)
        refuse_other_model(str(tmp_path / "old"), made[:2], checkpoint=old)
        saver = FillingSaver(absent, keep_checkpoint_max=3)
        saver.build()
        bump = [made[2].assign_add(tf.ones([2, 3])), made[3].assign_add(1)]
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            session.run(bump)  # not zero before the restore: the restore must empty them
            saver.restore(session, old)
            weight, slot, buffer, count = session.run(made)
            new = saver.save(session, str(tmp_path / "new" / "model.ckpt"), global_step=4)
    np.testing.assert_array_equal(weight, saved_weight)
    np.testing.assert_array_equal(slot, saved_weight * 2)
    assert not buffer.any() and count == 0
    reader = tf.train.load_checkpoint(new)
    assert set(reader.get_variable_to_shape_map()) == {
        "layer/kernel", "layer/kernel/lamb_m", "layer/kernel/accum",
        "gradient_accumulation/local_step"}

    # a checkpoint holding the state is restored whole, as by the default Saver
    with tf.Graph().as_default():
        made = _variables(accumulate=True)
        assert absent_accumulation_state(tf1.global_variables(), new) == []
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            session.run(made[2].assign_add(tf.ones([2, 3])))
            tf1.train.Saver().save(session, str(tmp_path / "full" / "model.ckpt"))
        saver = FillingSaver(made[2:], keep_checkpoint_max=3)
        saver.build()
        with tf1.Session() as session:
            saver.restore(session, str(tmp_path / "full" / "model.ckpt"))
            assert session.run(made[2]).tolist() == [[1.0] * 3] * 2


def test_only_accumulation_state_may_be_missing():
    assert is_accumulation_state("bert/encoder/layer_0/output/dense/kernel/accum")
    assert is_accumulation_state("gradient_accumulation/tower_1/bert/pooler/dense/bias/accum")
    assert is_accumulation_state("gradient_accumulation/local_step")
    for name in ("bert/pooler/dense/bias", "bert/pooler/dense/bias/lamb_m", "global_step",
                 "loss_scale/loss_scale", "micro_step"):
        assert not is_accumulation_state(name), name
