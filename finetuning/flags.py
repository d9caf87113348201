"""Flags of run_classifier.py and run_squad.py (Google's and NVIDIA's names)."""
from absl import flags

from training.flag_binding import bind as _binder


def define_common_flags(flag_values=flags.FLAGS):
    f = _binder(flag_values)
    f.DEFINE_string("vocab_file", None, "vocab.txt (or SentencePiece .model) of the model.")
    f.DEFINE_string("bert_config_file", None, "bert_config.json of the model.")
    f.DEFINE_string("init_checkpoint", None, "Pre-trained (or fine-tuned) checkpoint.")
    f.DEFINE_string("output_dir", None, "Checkpoints, records, predictions, results.")
    f.DEFINE_bool("do_lower_case", True, "Lower-case input (uncased models).")
    f.DEFINE_bool("do_train", False, "Fine-tune.")
    f.DEFINE_bool("do_predict", False, "Predict (and score when the data has answers/labels).")
    f.DEFINE_integer("train_batch_size", 32, "Examples per micro-batch per rank.")
    f.DEFINE_integer("predict_batch_size", 8, "Examples per prediction batch.")
    f.DEFINE_float("learning_rate", 5e-5,
                   "Peak learning rate PER RANK, as in NVIDIA's scripts: under --horovod the "
                   "optimizer applies learning_rate x ranks.")
    f.DEFINE_float("num_train_epochs", 3.0, "Epochs over the training set.")
    f.DEFINE_float("warmup_proportion", 0.1, "Fraction of the steps for linear warm-up.")
    f.DEFINE_integer("max_seq_length", 128, "Sequence length (WordPiece tokens).")
    f.DEFINE_integer("save_checkpoints_steps", 1000, "Checkpoint every N steps.")
    f.DEFINE_integer("keep_checkpoint_max", 2, "Checkpoints to keep.")
    f.DEFINE_integer("num_accumulation_steps", 1, "Micro-batches per optimizer step.")
    f.DEFINE_enum("optimizer_type", "adam", ["adam", "lamb"], "AdamWeightDecay or NVLAMB.")
    f.DEFINE_bool("horovod", False, "Data-parallel over Horovod ranks.")
    f.DEFINE_bool("amp", False, "Automatic mixed precision (--amp_dtype compute).")
    f.DEFINE_enum("amp_dtype", "float16", ["float16", "bfloat16"], "Compute type under --amp.")
    f.DEFINE_bool("use_xla", False, "Compile with XLA.")
    f.DEFINE_float("init_loss_scale", 2.0 ** 32,
                   "Initial dynamic loss scale (float16; NVIDIA's 2**32).")
    f.DEFINE_string("export_dir", None, "Write a SavedModel for serving here after training.")
    f.DEFINE_string("triton_model_repository", None,
                    "Also lay the SavedModel out as a Triton model repository here.")
    f.DEFINE_integer("seed", 12345, "Seed of initialisation, data order and dropout.")
    f.DEFINE_string("dllog_path", None, "JSON-lines training log (rank 0).")
    f.DEFINE_integer("display_loss_steps", 10, "Log every N optimizer steps.")


def define_classifier_flags(flag_values=flags.FLAGS):
    define_common_flags(flag_values)
    f = _binder(flag_values)
    f.DEFINE_string("task_name", None, "GLUE task: cola, sst-2, mrpc, sts-b, qqp, mnli, qnli, "
                    "rte, wnli.")
    f.DEFINE_string("data_dir", None, "Folder with the task's train/dev/test .tsv files.")
    f.DEFINE_bool("do_eval", False, "Evaluate on the dev set.")
    f.DEFINE_integer("eval_batch_size", 8, "Examples per evaluation batch.")


def define_squad_flags(flag_values=flags.FLAGS):
    define_common_flags(flag_values)
    f = _binder(flag_values)
    f.DEFINE_string("train_file", None, "SQuAD json for training.")
    f.DEFINE_string("predict_file", None, "SQuAD json to predict (scored if it has answers).")
    f.DEFINE_integer("doc_stride", 128, "Stride of the sliding window over long contexts.")
    f.DEFINE_integer("max_query_length", 64, "Question tokens kept.")
    f.DEFINE_integer("n_best_size", 20, "Candidates per question in nbest_predictions.json.")
    f.DEFINE_integer("max_answer_length", 30, "Longest answer in WordPiece tokens.")
    f.DEFINE_bool("version_2_with_negative", False, "SQuAD 2.0: questions may have no answer.")
    f.DEFINE_float("null_score_diff_threshold", 0.0,
                   "SQuAD 2.0: predict no answer when null score - best score exceeds this.")
    f.DEFINE_bool("verbose_logging", False, "Log answer-alignment details.")
