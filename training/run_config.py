"""The Estimator RunConfig: checkpoints (rank 0 only), XLA, seeds, session settings."""
import os

import tensorflow as tf
from absl import logging

from runtime.xla_env import XLA_CPU_FLAG

tf1 = tf.compat.v1


def make_run_config(model_dir, workers, save_checkpoints_steps=1000, keep_checkpoint_max=5,
                    use_xla=False, seed=None, log_step_count_steps=None):
    """A RunConfig where only the chief writes checkpoints and summaries.

    Other ranks get a private temporary model_dir and no checkpointing: their state equals
    rank 0's after the initial broadcast and every allreduce, and two processes writing one
    folder's event files and checkpoints would clash.
    """
    session_config = workers.session_config()
    if use_xla:
        if (XLA_CPU_FLAG not in os.environ.get("TF_XLA_FLAGS", "")
                and not tf.config.list_physical_devices("GPU")):
            logging.warning("--use_xla on the CPU needs TF_XLA_FLAGS=%s before TensorFlow "
                            "starts (entry points set it); XLA may stay off", XLA_CPU_FLAG)
        session_config.graph_options.optimizer_options.global_jit_level = \
            tf1.OptimizerOptions.ON_1
    chief = workers.is_chief
    return tf.estimator.RunConfig(
        model_dir=model_dir if workers.is_chief else None,
        tf_random_seed=seed,
        session_config=session_config,
        save_checkpoints_steps=save_checkpoints_steps if chief else None,
        save_checkpoints_secs=None,
        save_summary_steps=save_checkpoints_steps if chief else None,
        keep_checkpoint_max=keep_checkpoint_max,
        log_step_count_steps=log_step_count_steps)
