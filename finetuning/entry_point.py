"""The `main` of run_classifier.py and run_squad.py (this module must not import TensorFlow:
XLA on the CPU needs its environment flag set before TensorFlow starts)."""
import sys

from absl import flags


def make_main(task_class_name):
    """absl `main` that runs the driver with `finetuning.tasks.<task_class_name>`."""
    def main(_):
        if flags.FLAGS.use_xla:
            from training.xla_env import enable_cpu_xla
            enable_cpu_xla()  # before TensorFlow is imported
        from finetuning import tasks
        from finetuning.driver import main as driver_main
        return driver_main(getattr(tasks, task_class_name).from_flags, flags.FLAGS)
    return main


def run(task_class_name):
    from absl import app
    flags.mark_flags_as_required(["vocab_file", "bert_config_file", "output_dir"])
    sys.exit(app.run(make_main(task_class_name)))
