"""Flags of fine-tuning (`bert-glue`/run_classifier.py, `bert-squad`/run_squad.py; Google's and
NVIDIA's names), in the help groups `--help` lists them by."""
from absl import flags

from cli.flag_groups import DISTRIBUTED, INPUT, MODEL, OUTPUT, PRECISION, TRAINING, binders
from cli.nvidia_flags import CLASSIFIER, SQUAD, define_ignored


# Where NVIDIA's run_squad.py and run_classifier.py differ from each other, each command takes
# the default of NVIDIA's script of the same name.
SQUAD_DEFAULTS = dict(max_seq_length=384, learning_rate=5e-6, train_batch_size=8,
                      save_checkpoints_steps=5000, optimizer_type="adam")
CLASSIFIER_DEFAULTS = dict(max_seq_length=128, learning_rate=5e-5, train_batch_size=32,
                           save_checkpoints_steps=1000, optimizer_type="lamb")


def define_common_flags(flag_values=flags.FLAGS, defaults=None):
    """The flags both fine-tuning commands take; `defaults`: SQUAD_DEFAULTS or
    CLASSIFIER_DEFAULTS (NVIDIA's values for that command)."""
    d = dict(CLASSIFIER_DEFAULTS, **(defaults or {}))
    inp, model, train, speed, dist, out = binders(flag_values, INPUT, MODEL, TRAINING,
                                                  PRECISION, DISTRIBUTED, OUTPUT)
    inp.DEFINE_string("vocab_file", None, "vocab.txt (or SentencePiece .model) of the model.")
    model.DEFINE_string("bert_config_file", None, "bert_config.json of the model.")
    model.DEFINE_string("init_checkpoint", None, "Pre-trained (or fine-tuned) checkpoint to start "
                        "from (prefix or folder).")
    out.DEFINE_string("output_dir", None, "Checkpoints, records, predictions, results.")
    inp.DEFINE_bool("do_lower_case", True, "Lower-case input (uncased models).")
    train.DEFINE_bool("do_train", False, "Fine-tune on the training data, resuming a "
                      "checkpoint in --output_dir.")
    train.DEFINE_bool("do_predict", False, "Predict (and score when the data has answers/labels).")
    train.DEFINE_integer("train_batch_size", d["train_batch_size"],
                         "Examples per micro-batch per rank (per device with "
                         "--num_local_devices).")
    train.DEFINE_integer("predict_batch_size", 8, "Examples per prediction batch.")
    train.DEFINE_float("learning_rate", d["learning_rate"],
                       "Peak learning rate PER RANK, as in NVIDIA's scripts: under --horovod the "
                       "optimizer applies learning_rate x ranks (x devices with "
                       "--num_local_devices).")
    train.DEFINE_float("num_train_epochs", 3.0, "Epochs over the training set.")
    train.DEFINE_float("warmup_proportion", 0.1, "Fraction of the steps for linear warm-up.")
    inp.DEFINE_integer("max_seq_length", d["max_seq_length"],
                       "Sequence length (WordPiece tokens).")
    out.DEFINE_integer("save_checkpoints_steps", d["save_checkpoints_steps"],
                       "Checkpoint every N steps.")
    out.DEFINE_integer("keep_checkpoint_max", 2, "Checkpoints to keep.")
    train.DEFINE_integer("num_accumulation_steps", 1, "Micro-batches per optimizer step.")
    train.DEFINE_enum("optimizer_type", d["optimizer_type"], ["adam", "adamw", "lamb"],
                      "Google's AdamWeightDecay, the same with Adam's bias correction (adamw: "
                      "torch's AdamW) or NVLAMB (NVIDIA's defaults: lamb for GLUE, adam for "
                      "SQuAD).")
    dist.DEFINE_bool("horovod", False, "Data-parallel over Horovod ranks (horovodrun -np N).")
    dist.DEFINE_integer("num_local_devices", 1,
                        "Data-parallel over N GPUs of this machine in ONE process, without "
                        "Horovod (in-graph towers, one gradient average; N logical CPU devices "
                        "on a machine without GPU). --train_batch_size and --learning_rate stay "
                        "per device, as per rank under --horovod.")
    speed.DEFINE_bool("amp", True, "Automatic mixed precision (--amp_dtype compute; "
                      "NVIDIA's default: on; without a GPU, off unless given).")
    speed.DEFINE_enum("amp_dtype", "float16", ["float16", "bfloat16"], "Compute type under --amp.")
    speed.DEFINE_bool("use_xla", True, "Compile the step with XLA (NVIDIA's default: on; "
                      "without a GPU, off unless given).")
    speed.DEFINE_float("init_loss_scale", 2.0 ** 32,
                       "Initial dynamic loss scale (float16; NVIDIA's 2**32).")
    out.DEFINE_string("export_dir", None, "Write a SavedModel for serving here after training.")
    out.DEFINE_string("triton_model_repository", None,
                      "Also lay the SavedModel out as a Triton model repository here "
                      "(<dir>/<triton_model_name>/config.pbtxt, <version>/model.savedmodel).")
    out.DEFINE_bool("export_triton", False,
                    "NVIDIA's: export the model (the trained one, else --init_checkpoint) as "
                    "a Triton model in <output_dir>/triton_models/ (what "
                    "--triton_model_repository=<output_dir>/triton_models does).")
    out.DEFINE_string("triton_model_name", "bert", "Triton model name (NVIDIA's client "
                      "asks for 'bert').")
    out.DEFINE_integer("triton_model_version", 1, "Triton model version folder.")
    out.DEFINE_bool("triton_model_overwrite", False,
                    "Replace an existing Triton model of that name and version (otherwise "
                    "refused at start-up, before training).")
    out.DEFINE_integer("triton_max_batch_size", 8, "max_batch_size of config.pbtxt.")
    out.DEFINE_float("triton_dyn_batching_delay", 0.0,
                     "Dynamic batching queue delay in milliseconds (0 or less: static "
                     "batching, NVIDIA's default).")
    out.DEFINE_integer("triton_engine_count", 1, "Model instances (instance_group count).")
    out.DEFINE_bool("verbose_logging", False, "Log every trainable variable when the graph is "
                    "built; for SQuAD also the answer-alignment details.")
    train.DEFINE_integer("seed", 12345, "Seed of initialisation, data order and dropout.")
    out.DEFINE_string("dllog_path", None, "JSON-lines training log (rank 0).")
    out.DEFINE_integer("display_loss_steps", 10, "Log the step and show progress (loss, "
                       "sequences/s, ETA) every N optimizer steps.")


def define_classifier_flags(flag_values=flags.FLAGS):
    define_common_flags(flag_values, CLASSIFIER_DEFAULTS)
    define_ignored(flag_values, CLASSIFIER)
    inp, train = binders(flag_values, INPUT, TRAINING)
    inp.DEFINE_string("task_name", None, "GLUE task: cola, sst-2, mrpc, sts-b, qqp, mnli, qnli, "
                      "rte, wnli.")
    inp.DEFINE_string("data_dir", None, "Folder with the task's train/dev/test .tsv files.")
    train.DEFINE_bool("do_eval", False, "Evaluate on the dev set (dev.tsv): metrics in "
                      "<output_dir>/eval_results.txt.")
    train.DEFINE_integer("eval_batch_size", 8, "Examples per evaluation batch.")


def define_squad_flags(flag_values=flags.FLAGS):
    define_common_flags(flag_values, SQUAD_DEFAULTS)
    define_ignored(flag_values, SQUAD)
    inp, out = binders(flag_values, INPUT, OUTPUT)
    inp.DEFINE_string("train_file", None, "SQuAD json for training.")
    inp.DEFINE_string("predict_file", None, "SQuAD json to predict (scored if it has answers).")
    inp.DEFINE_integer("doc_stride", 128, "Stride of the sliding window over long contexts.")
    inp.DEFINE_integer("max_query_length", 64, "Question tokens kept.")
    out.DEFINE_integer("n_best_size", 20, "Candidates per question in nbest_predictions.json.")
    out.DEFINE_integer("max_answer_length", 30, "Longest answer in WordPiece tokens.")
    inp.DEFINE_bool("version_2_with_negative", False, "SQuAD 2.0: questions may have no answer.")
    out.DEFINE_float("null_score_diff_threshold", 0.0,
                     "SQuAD 2.0: predict no answer when null score - best score exceeds this.")
    inp.DEFINE_string("eval_script", None,
                      "An evaluation script such as SQuAD's evaluate-v1.1.py, run on "
                      "predictions.json after predicting (NVIDIA's flag): its exact_match and "
                      "f1 are logged beside the built-in official metric's.")
    inp.DEFINE_integer("num_eval_iterations", None,
                       "Predict only the first N x --predict_batch_size questions "
                       "(NVIDIA's flag, for profiling).")
