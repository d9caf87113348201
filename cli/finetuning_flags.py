"""Flags of fine-tuning (`bert-glue`/run_classifier.py, `bert-squad`/run_squad.py; Google's and
NVIDIA's names), in the help groups `--help` lists them by. Their defaults are the job's own
(`finetuning.options`: where NVIDIA's run_squad.py and run_classifier.py differ, each command
takes the default of NVIDIA's script of the same name), which the parsed flags become
(`cli.flag_options.options_from_flags`)."""
from absl import flags

from cli.flag_groups import (DISTRIBUTED, INPUT, MODEL, OUTPUT, PRECISION, START_OVER_HELP,
                              TRAINING, binders)
from cli.nvidia_flags import CLASSIFIER, SQUAD, define_ignored
from finetuning.options import ClassifierOptions, SquadOptions


def define_common_flags(flag_values=flags.FLAGS, options=ClassifierOptions):
    """The flags both fine-tuning commands take, with the defaults of `options`
    (ClassifierOptions or SquadOptions: NVIDIA's values for that command)."""
    inp, model, train, speed, dist, out = binders(flag_values, INPUT, MODEL, TRAINING,
                                                  PRECISION, DISTRIBUTED, OUTPUT)
    inp.DEFINE_string("vocab_file", options.vocab_file,
                      "vocab.txt (or SentencePiece .model) of the model.")
    model.DEFINE_string("bert_config_file", options.bert_config_file,
                        "bert_config.json of the model.")
    model.DEFINE_string("init_checkpoint", options.init_checkpoint,
                        "Pre-trained (or fine-tuned) checkpoint to start from (prefix or folder).")
    out.DEFINE_string("output_dir", options.output_dir,
                      "Checkpoints, records, predictions, results.")
    inp.DEFINE_bool("do_lower_case", options.do_lower_case, "Lower-case input (uncased models).")
    train.DEFINE_bool("do_train", options.do_train, "Fine-tune on the training data, resuming a "
                      "checkpoint in --output_dir.")
    train.DEFINE_bool("do_predict", options.do_predict,
                      "Predict (and score when the data has answers/labels).")
    train.DEFINE_integer("train_batch_size", options.train_batch_size,
                         "Examples per micro-batch per rank (per device with --num_local_devices).")
    train.DEFINE_integer("predict_batch_size", options.predict_batch_size,
                         "Examples per prediction batch.")
    train.DEFINE_float("learning_rate", options.learning_rate,
                       "Peak learning rate PER RANK, as in NVIDIA's scripts: under --horovod the "
                       "optimizer applies learning_rate x ranks (x devices with "
                       "--num_local_devices).")
    train.DEFINE_float("num_train_epochs", options.num_train_epochs,
                       "Epochs over the training set.")
    train.DEFINE_float("warmup_proportion", options.warmup_proportion,
                       "Fraction of the steps for linear warm-up.")
    inp.DEFINE_integer("max_seq_length", options.max_seq_length,
                       "Sequence length (WordPiece tokens).")
    out.DEFINE_integer("save_checkpoints_steps", options.save_checkpoints_steps,
                       "Checkpoint every N steps.")
    out.DEFINE_integer("keep_checkpoint_max", options.keep_checkpoint_max, "Checkpoints to keep.")
    out.DEFINE_bool("start_over", options.start_over, START_OVER_HELP)
    train.DEFINE_integer("num_accumulation_steps", options.num_accumulation_steps,
                         "Micro-batches per optimizer step.")
    train.DEFINE_enum("optimizer_type", options.optimizer_type, ["adam", "adamw", "lamb"],
                      "Google's AdamWeightDecay, the same with Adam's bias correction (adamw: "
                      "torch's AdamW) or NVLAMB. Default adam for GLUE and SQuAD (NVIDIA's "
                      "GLUE default lamb moves each tensor by ~learning_rate x its norm: at "
                      "fine-tuning rates the model ends at the majority class; "
                      "docs/finetuning.md).")
    dist.DEFINE_bool("horovod", options.horovod,
                     "Data-parallel over Horovod ranks (horovodrun -np N).")
    dist.DEFINE_integer("num_local_devices", options.num_local_devices,
                        "Data-parallel over N GPUs of this machine in ONE process, without "
                        "Horovod (in-graph towers, one gradient average; N logical CPU devices "
                        "on a machine without GPU). --train_batch_size and --learning_rate stay "
                        "per device, as per rank under --horovod.")
    dist.DEFINE_bool("allow_cpu", options.allow_cpu,
                     "Run on the CPU where a GPU is expected (/dev/nvidia* or "
                     "CUDA_VISIBLE_DEVICES) but TensorFlow sees none; without it such a run "
                     "stops at start-up naming the cause (CPU-only TensorFlow, CUDA libraries "
                     "not found).")
    speed.DEFINE_bool("amp", options.amp, "Automatic mixed precision (--amp_dtype compute; "
                      "NVIDIA's default: on; without a GPU, off unless given).")
    speed.DEFINE_enum("amp_dtype", options.amp_dtype, ["float16", "bfloat16"],
                      "Compute type under --amp.")
    speed.DEFINE_bool("use_xla", options.use_xla,
                      "Compile the step with XLA (NVIDIA's default: on; "
                      "without a GPU, off unless given).")
    speed.DEFINE_float("init_loss_scale", options.init_loss_scale,
                       "Initial dynamic loss scale (float16; NVIDIA's 2**32).")
    out.DEFINE_string("export_dir", options.export_dir,
                      "Write a SavedModel for serving here after training.")
    out.DEFINE_string("triton_model_repository", options.triton_model_repository,
                      "Also lay the SavedModel out as a Triton model repository here "
                      "(<dir>/<triton_model_name>/config.pbtxt, <version>/model.savedmodel).")
    out.DEFINE_bool("export_triton", options.export_triton,
                    "NVIDIA's: export the model (the trained one, else --init_checkpoint) as "
                    "a Triton model in <output_dir>/triton_models/ (what "
                    "--triton_model_repository=<output_dir>/triton_models does).")
    out.DEFINE_string("triton_model_name", options.triton_model_name,
                      "Triton model name (NVIDIA's client asks for 'bert').")
    out.DEFINE_integer("triton_model_version", options.triton_model_version,
                       "Triton model version folder.")
    out.DEFINE_bool("triton_model_overwrite", options.triton_model_overwrite,
                    "Replace an existing Triton model of that name and version (otherwise "
                    "refused at start-up, before training).")
    out.DEFINE_integer("triton_max_batch_size", options.triton_max_batch_size,
                       "max_batch_size of config.pbtxt.")
    out.DEFINE_float("triton_dyn_batching_delay", options.triton_dyn_batching_delay,
                     "Dynamic batching queue delay in milliseconds (0 or less: static "
                     "batching, NVIDIA's default).")
    out.DEFINE_integer("triton_engine_count", options.triton_engine_count,
                       "Model instances (instance_group count).")
    out.DEFINE_bool("verbose_logging", options.verbose_logging,
                    "Log every trainable variable when the graph is "
                    "built; for SQuAD also the answer-alignment details.")
    train.DEFINE_integer("seed", options.seed, "Seed of initialisation, data order and dropout.")
    out.DEFINE_string("dllog_path", options.dllog_path, "JSON-lines training log (rank 0).")
    out.DEFINE_integer("display_loss_steps", options.display_loss_steps,
                       "Log the step and show progress (loss, "
                       "sequences/s, ETA) every N optimizer steps.")


def define_classifier_flags(flag_values=flags.FLAGS):
    options = ClassifierOptions
    define_common_flags(flag_values, options)
    define_ignored(flag_values, CLASSIFIER)
    inp, train = binders(flag_values, INPUT, TRAINING)
    inp.DEFINE_string("task_name", options.task_name,
                      "GLUE task: cola, sst-2, mrpc, sts-b, qqp, mnli, qnli, rte, wnli.")
    inp.DEFINE_string("data_dir", options.data_dir,
                      "Folder with the task's train/dev/test .tsv files.")
    train.DEFINE_bool("do_eval", options.do_eval, "Evaluate on the dev set (dev.tsv): metrics in "
                      "<output_dir>/eval_results.txt.")
    train.DEFINE_integer("eval_batch_size", options.eval_batch_size,
                         "Examples per evaluation batch.")


def define_squad_flags(flag_values=flags.FLAGS):
    options = SquadOptions
    define_common_flags(flag_values, options)
    define_ignored(flag_values, SQUAD)
    inp, out = binders(flag_values, INPUT, OUTPUT)
    inp.DEFINE_string("train_file", options.train_file, "SQuAD json for training.")
    inp.DEFINE_string("predict_file", options.predict_file,
                      "SQuAD json to predict (scored if it has answers).")
    inp.DEFINE_integer("doc_stride", options.doc_stride,
                       "Stride of the sliding window over long contexts.")
    inp.DEFINE_integer("max_query_length", options.max_query_length, "Question tokens kept.")
    out.DEFINE_integer("n_best_size", options.n_best_size,
                       "Candidates per question in nbest_predictions.json.")
    out.DEFINE_integer("max_answer_length", options.max_answer_length,
                       "Longest answer in WordPiece tokens.")
    inp.DEFINE_bool("version_2_with_negative", options.version_2_with_negative,
                    "SQuAD 2.0: questions may have no answer.")
    out.DEFINE_float("null_score_diff_threshold", options.null_score_diff_threshold,
                     "SQuAD 2.0: predict no answer when null score - best score exceeds this.")
    inp.DEFINE_string("eval_script", options.eval_script,
                      "An evaluation script such as SQuAD's evaluate-v1.1.py, run on "
                      "predictions.json after predicting (NVIDIA's flag): its exact_match and "
                      "f1 are logged beside the built-in official metric's.")
    inp.DEFINE_integer("num_eval_iterations", options.num_eval_iterations,
                       "Predict only the first N x --predict_batch_size questions "
                       "(NVIDIA's flag, for profiling).")
