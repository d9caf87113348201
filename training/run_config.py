"""The Estimator RunConfig: checkpoints (rank 0 only), XLA, seeds, session settings.

XLA as NVIDIA's BERT sets it on GPUs: auto-clustering (`global_jit_level` ON_1) and, for
pre-training, Grappler's memory optimizer off (`RewriterConfig.NO_MEM_OPT`: its swapping and
recomputation rewrites are made for the graph TensorFlow runs itself, and NVIDIA turns them
off under XLA); lazy compilation off is an environment flag (`runtime.xla_env`). On a CPU the
memory optimizer stays as TensorFlow has it (what this project's CPU measurements ran).
"""
import os

import tensorflow as tf
from absl import logging
from tensorflow.core.protobuf import rewriter_config_pb2

from runtime.xla_env import XLA_CPU_FLAG

tf1 = tf.compat.v1


def make_run_config(model_dir, workers, save_checkpoints_steps=1000, keep_checkpoint_max=5,
                    use_xla=False, seed=None, log_step_count_steps=None,
                    xla_memory_optimizer_off=False):
    """A RunConfig where only the chief writes checkpoints and summaries.
    `xla_memory_optimizer_off`: NVIDIA's pre-training setting under XLA on GPUs (above).

    Other ranks get a private temporary model_dir and no checkpointing: their state equals
    rank 0's after the initial broadcast and every allreduce, and two processes writing one
    folder's event files and checkpoints would clash.
    """
    session_config = workers.session_config()
    if use_xla:
        on_gpu = bool(getattr(workers, "gpus", None))
        if XLA_CPU_FLAG not in os.environ.get("TF_XLA_FLAGS", "") and not on_gpu:
            logging.warning("--use_xla on the CPU needs TF_XLA_FLAGS=%s before TensorFlow "
                            "starts (entry points set it); XLA may stay off", XLA_CPU_FLAG)
        session_config.graph_options.optimizer_options.global_jit_level = \
            tf1.OptimizerOptions.ON_1
        if on_gpu and xla_memory_optimizer_off:
            session_config.graph_options.rewrite_options.memory_optimization = \
                rewriter_config_pb2.RewriterConfig.NO_MEM_OPT
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
