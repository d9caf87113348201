"""Fine-tune BERT on SQuAD v1.1/v2.0 and predict (Google's/NVIDIA's run_squad.py flags).

    python run_squad.py --vocab_file=vocab.txt --bert_config_file=bert_config.json \
        --init_checkpoint=bert_model.ckpt --do_train --train_file=train-v1.1.json \
        --do_predict --predict_file=dev-v1.1.json --train_batch_size=32 --learning_rate=3e-5 \
        --num_train_epochs=2 --max_seq_length=384 --doc_stride=128 --output_dir=out
Writes predictions.json, nbest_predictions.json (null_odds.json for v2.0) and, when the
predict file has answers, eval_results.txt with the official metric.
"""
from finetuning.entry_point import run
from finetuning.flags import define_squad_flags

define_squad_flags()

if __name__ == "__main__":
    run("SquadTask")
