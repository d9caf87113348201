"""BERT pre-training with tf.estimator: NVLAMB, AMP, XLA, gradient accumulation, Horovod.

    python run_pretraining.py --bert_config_file=bert_config.json \
        --input_files_dir=data/training --eval_files_dir=data/test --output_dir=out \
        --do_train --train_batch_size=64 --max_seq_length=128 --max_predictions_per_seq=20 \
        --num_train_steps=7038 --num_warmup_steps=2000 --learning_rate=7.5e-4 --amp --use_xla
    horovodrun -np 8 python run_pretraining.py --horovod ...   # peak rate 8 x 7.5e-4 = 6e-3
    python run_pretraining.py --dry_run --dry_run_ranks=8 ...  # print the plan, run nothing
"""
import sys

from absl import app, flags

from pretraining.flags import define_flags

define_flags()


def main(_):
    if flags.FLAGS.dry_run:  # the plan only: no TensorFlow, no data
        from pretraining.plan import plan_line, pretraining_plan
        print(plan_line(pretraining_plan(flags.FLAGS, flags.FLAGS.dry_run_ranks)))
        return 0
    if flags.FLAGS.use_xla:
        from training.xla_env import enable_cpu_xla
        enable_cpu_xla()  # before TensorFlow is imported
    from pretraining.runner import main as run_main
    return run_main(flags.FLAGS)


if __name__ == "__main__":
    flags.mark_flags_as_required(["bert_config_file", "output_dir"])
    sys.exit(app.run(main))
