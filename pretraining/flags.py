"""Command-line flags of run_pretraining.py (NVIDIA's TF1 BERT names)."""
from absl import flags

from training.flag_binding import bind


def define_flags(flag_values=flags.FLAGS):
    """Defines the flags on `flag_values` (tests pass a fresh `flags.FlagValues()`)."""
    f = bind(flag_values)
    f.DEFINE_string("bert_config_file", None, "bert_config.json of the model to train.")
    f.DEFINE_string("input_files_dir", None,
                    "Training TFRecords: a directory, a glob, or a comma-separated list.")
    f.DEFINE_string("eval_files_dir", None, "Evaluation TFRecords (same forms).")
    f.DEFINE_string("output_dir", None, "Checkpoints and logs; a checkpoint here is resumed.")
    f.DEFINE_string("init_checkpoint", None,
                    "Weights only (phase 1 -> phase 2, Google's BERT); optimizer state starts "
                    "fresh. Ignored when --output_dir already holds a checkpoint.")
    f.DEFINE_enum("optimizer_type", "lamb", ["lamb", "adam"], "NVLAMB or AdamWeightDecay.")
    f.DEFINE_integer("max_seq_length", 128, "Must equal the records' sequence length.")
    f.DEFINE_integer("max_predictions_per_seq", 20,
                     "Must equal the records' prediction count (static records); the most "
                     "tokens masked per sequence (dynamic-masking records).")
    f.DEFINE_float("masked_lm_prob", None,
                   "Dynamic-masking records only: share of the real tokens masked (default "
                   "0.15). Static records are masked already: refused with them.")
    f.DEFINE_bool("do_whole_word_mask", None,
                  "Dynamic-masking records only: mask whole words (a word's pieces together) "
                  "instead of single tokens (default: single tokens). Refused with static "
                  "records.")
    f.DEFINE_bool("do_train", False, "Train.")
    f.DEFINE_bool("do_eval", False, "Evaluate on --eval_files_dir after training.")
    f.DEFINE_integer("train_batch_size", 32, "Sequences per micro-batch per rank.")
    f.DEFINE_integer("eval_batch_size", 8, "Sequences per evaluation batch.")
    f.DEFINE_float("learning_rate", 5e-5,
                   "Peak learning rate PER RANK, as in NVIDIA's BERT: under --horovod the "
                   "optimizer applies learning_rate x ranks (7.5e-4 on 8 GPUs = 6e-3).")
    f.DEFINE_float("weight_decay_rate", 0.01, "Decoupled weight decay.")
    f.DEFINE_integer("num_train_steps", 100000, "Optimizer steps (global_step) to reach.")
    f.DEFINE_integer("num_warmup_steps", 10000, "Linear warm-up steps.")
    f.DEFINE_integer("save_checkpoints_steps", 1000, "Checkpoint every N optimizer steps.")
    f.DEFINE_integer("keep_checkpoint_max", 5, "Checkpoints to keep.")
    f.DEFINE_integer("display_loss_steps", 1, "Log every N optimizer steps.")
    f.DEFINE_integer("max_eval_steps", 100, "Evaluation batches.")
    f.DEFINE_integer("num_accumulation_steps", 1, "Micro-batches per optimizer step.")
    f.DEFINE_bool("allreduce_post_accumulation", False,
                  "One allreduce per optimizer step instead of one per micro-batch.")
    f.DEFINE_bool("horovod", False, "Data-parallel over Horovod ranks (horovodrun -np N).")
    f.DEFINE_bool("amp", False, "Automatic mixed precision: --amp_dtype compute, float32 weights.")
    f.DEFINE_enum("amp_dtype", "float16", ["float16", "bfloat16"],
                  "Compute type under --amp (float16 uses dynamic loss scaling).")
    f.DEFINE_bool("use_xla", False, "Compile the step with XLA.")
    f.DEFINE_float("init_loss_scale", 2.0 ** 32,
                   "Initial dynamic loss scale (float16; NVIDIA's 2**32, halved per "
                   "overflow, doubled after 1000 good steps).")
    f.DEFINE_enum("lamb_layer_adaptation", "all", ["all", "weights"],
                  "LAMB trust ratio on every variable (all: NVIDIA's BERT) or not on "
                  "LayerNorm and biases (weights: tfa/Model Garden LAMB).")
    f.DEFINE_integer("max_consecutive_skips", 100,
                     "Stop with an error after this many optimizer steps in a row skipped "
                     "for non-finite gradients (0: never).")
    f.DEFINE_integer("phase", None, "Phase number (1: seq 128, 2: seq 512), a label in the "
                     "plan and logs; the run scripts set it.")
    f.DEFINE_bool("dry_run", False,
                  "Print the run's plan (effective batch, learning rate, steps) as one JSON "
                  "line and exit: nothing is read or trained.")
    f.DEFINE_integer("dry_run_ranks", 1, "Ranks the --dry_run plan assumes (the GPUs).")
    f.DEFINE_string("dllog_path", None, "JSON-lines log of every logged step (rank 0).")
    f.DEFINE_integer("seed", 12345, "Seed of initialisation, data order and dropout.")
    f.DEFINE_float("peak_tflops", 0.0,
                   "Peak TFLOP/s of one device for the MFU estimate (0: look up the GPU).")
    f.DEFINE_integer("shuffle_buffer", 1000, "Record shuffle window of the input pipeline.")
    f.DEFINE_bool("skip_bad_records", False,
                  "Skip and count training records that cannot be read or parsed or hold "
                  "out-of-range values (a truncated or corrupt file loses its rest), instead "
                  "of stopping at the first one; for corpora too large to check beforehand.")
    f.DEFINE_integer("max_bad_records", 1000,
                     "With --skip_bad_records: stop when more records than this were "
                     "skipped (over all ranks).")
    f.DEFINE_bool("reset_data_position", False,
                  "Resume a checkpoint whose data settings (ranks, --train_batch_size, --seed, "
                  "--shuffle_buffer, input files; recorded in --output_dir/data_order.json) "
                  "differ from this run's, restarting the data order from its beginning at "
                  "the checkpoint's step: examples already trained on may be seen again. "
                  "Without it such a resume stops with an error.")
