"""Flags of NVIDIA's TF1 BERT scripts that mean nothing here: accepted, so NVIDIA's command
lines run unchanged, and named in one warning line when given.

Our commands parse strictly (absl): a flag nobody defines stops the command in one line. But
NVIDIA's `run_pretraining.py`, `run_squad.py` and `run_classifier.py` define flags for
machinery this project does not have (TPU host loops, TF-TRT, its Triton client), and their
scripts pass some of them (`run_glue.sh` passes `--doc_stride` to run_classifier.py).
Every flag those scripts define is either implemented (in the commands' own flag modules)
or defined here, with the reason it is ignored.
"""
from absl import logging

from cli.flag_groups import bind

GROUP = "Accepted for NVIDIA's command lines (ignored)"

# name: (kind, NVIDIA's default, why it means nothing here)
IGNORED = {
    "iterations_per_loop": (
        "integer", 1000, "steps per TPU host loop; tf.estimator on GPUs and CPUs runs no "
                         "such loop"),
    "use_trt": (
        "bool", False, "TF-TRT rewrite of the inference graph: the SavedModel serves as it "
                       "is (for TensorRT, serve it with Triton's TensorRT backend)"),
    "report_loss": (
        "bool", True, "the loss is always reported (progress line, log file, dllog)"),
    "triton_server_url": (
        "string", "localhost:8001", "the server NVIDIA's Triton client script talks to; "
                                    "exporting needs no server"),
    "doc_stride": (
        "integer", 64, "a stride over long SQuAD documents; classification reads each "
                       "example whole (run_glue.sh passes it)"),
}
PRETRAINING = ("iterations_per_loop", "report_loss")
SQUAD = ("iterations_per_loop", "use_trt", "triton_server_url")
CLASSIFIER = ("iterations_per_loop", "use_trt", "doc_stride", "triton_server_url")


def define_ignored(flag_values, names):
    """Defines the IGNORED flags `names` on `flag_values`, in their own help group."""
    group = bind(flag_values, GROUP)
    for name in names:
        kind, default, why = IGNORED[name]
        getattr(group, f"DEFINE_{kind}")(name, default, f"NVIDIA's flag; ignored: {why}.")


def ignored_flags(flag_values):
    """Names of the flags `flag_values`'s command accepts only for NVIDIA's command lines.

    Read from the definitions (the flags `define_ignored` put in GROUP), never from IGNORED:
    IGNORED says why a name may be ignored by some command, not that this command ignores
    it. `--doc_stride` is ignored by run_classifier.py and used by run_squad.py, and
    warning about every IGNORED name given told each run_squad.sh run that its stride was
    ignored, while it changes the answers.
    """
    return [name for name in flag_values
            if flag_values[name].name == name
            and getattr(flag_values[name], "help_group", None) == GROUP]


def warn_ignored(flag_values):
    """One warning line per ignored flag given on the command line; returns their names."""
    given = [name for name in ignored_flags(flag_values) if flag_values[name].present]
    for name in given:
        logging.warning("--%s is NVIDIA's and ignored here: %s", name, IGNORED[name][2])
    return given


def start_training_command(flag_values, options):
    """What the training commands do after parsing and before TensorFlow starts: one warning
    per ignored NVIDIA flag given, and XLA's environment flags for the run (`options`, the
    job's options; NVIDIA's default --use_xla only where there is a GPU:
    runtime.speed_defaults), GPU or CPU (`runtime.xla_env`)."""
    from runtime.speed_defaults import gpu_visible, resolve
    from runtime.xla_env import prepare_xla_environment
    warn_ignored(flag_values)
    on_gpu = gpu_visible()
    prepare_xla_environment(resolve(options, gpu=on_gpu).use_xla, on_gpu)
