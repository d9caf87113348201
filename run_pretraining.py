"""BERT pre-training with tf.estimator: NVLAMB, AMP, XLA, gradient accumulation, Horovod.

    python run_pretraining.py --bert_config_file=bert_config.json \
        --input_files_dir=data/training --eval_files_dir=data/test --output_dir=out \
        --do_train --train_batch_size=64 --max_seq_length=128 --max_predictions_per_seq=20 \
        --num_train_steps=7038 --num_warmup_steps=2000 --learning_rate=6e-3 --amp --use_xla
    horovodrun -np 8 python run_pretraining.py --horovod ...
"""
import sys

from absl import app, flags

from pretraining.flags import define_flags

define_flags()


def main(_):
    if flags.FLAGS.use_xla:
        from training.xla_env import enable_cpu_xla
        enable_cpu_xla()  # before TensorFlow is imported
    from pretraining.runner import main as run_main
    return run_main(flags.FLAGS)


if __name__ == "__main__":
    flags.mark_flags_as_required(["bert_config_file", "output_dir"])
    sys.exit(app.run(main))
