"""Test-only: a pause after every micro-batch, asked for by BERT_TEST_MICRO_BATCH_SECONDS
(tests/test_preemption.py's script_env sets it)."""
import os
import time

import tensorflow as tf

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


def micro_batch_delay_for_tests():
    """The delay BERT_TEST_MICRO_BATCH_SECONDS asks for (None: unset or not a positive number)."""
    try:
        seconds = float(os.environ.get("BERT_TEST_MICRO_BATCH_SECONDS", ""))
    except ValueError:
        return None
    return seconds if seconds > 0 else None
