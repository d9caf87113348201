"""Test-only pauses: after every micro-batch (BERT_TEST_MICRO_BATCH_SECONDS, which
tests/test_preemption.py's script_env sets), and in the middle of each checkpoint write
(BERT_TEST_CHECKPOINT_PAUSE_SECONDS: tests/test_multihost.py kills rank 0 there)."""
import os
import time

import tensorflow as tf
from absl import logging

from reporting.console import SHOW

tf1 = tf.compat.v1


class MicroBatchDelayHook(tf1.train.SessionRunHook):
    """Test-only: sleeps `seconds` after every micro-batch (BERT_TEST_MICRO_BATCH_SECONDS).
    The preemption tests signal a run after its step 2 and need it still running when the
    signal arrives; on a fast CPU a tiny model's 9 steps end in about 2 s, about the signal's
    way through the launchers (and ssh), so its landing became a race. A sleep changes no
    computation: the weights stay bit for bit those of an undelayed run."""

    def __init__(self, seconds):
        self.seconds = seconds

    def after_run(self, run_context, run_values):
        time.sleep(self.seconds)


class CheckpointWritePause(tf1.train.CheckpointSaverListener):
    """Test-only: between the input states' write and the model's (a checkpoint's two
    halves, training.resume), says so in one line and sleeps `seconds`, so a test can kill
    the chief while a checkpoint is half written, at any CPU's speed."""

    def __init__(self, seconds):
        self.seconds = seconds

    def before_save(self, session, global_step_value):
        logging.warning("test pause: the checkpoint of step %d is half written", global_step_value,
                        extra=SHOW)
        time.sleep(self.seconds)


def _seconds(name):
    """The positive number of seconds the variable `name` asks for, else None."""
    try:
        seconds = float(os.environ.get(name, ""))
    except ValueError:
        return None
    return seconds if seconds > 0 else None


def micro_batch_delay_for_tests():
    """The delay BERT_TEST_MICRO_BATCH_SECONDS asks for (None: unset or not a positive number)."""
    return _seconds("BERT_TEST_MICRO_BATCH_SECONDS")


def checkpoint_pause_for_tests():
    """The pause BERT_TEST_CHECKPOINT_PAUSE_SECONDS asks for (None: unset or not positive)."""
    return _seconds("BERT_TEST_CHECKPOINT_PAUSE_SECONDS")
