"""Fine-tune BERT on a GLUE task (Google's run_classifier.py flags).

    python run_classifier.py --task_name=MRPC --data_dir=glue/MRPC --vocab_file=vocab.txt \
        --bert_config_file=bert_config.json --init_checkpoint=bert_model.ckpt \
        --do_train --do_eval --max_seq_length=128 --train_batch_size=32 \
        --learning_rate=2e-5 --num_train_epochs=3 --output_dir=out [--export_dir=export]
"""
from finetuning.entry_point import run
from finetuning.flags import define_classifier_flags

define_classifier_flags()

if __name__ == "__main__":
    run("ClassifierTask")
