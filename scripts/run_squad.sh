#!/usr/bin/env bash
# Fine-tune on SQuAD and predict (NVIDIA's positional arguments and defaults):
#   bash scripts/run_squad.sh [batch_size=8] [learning_rate=5e-6] [precision=fp16|bf16|fp32|tf32|manual_fp16]
#     [use_xla=true] [num_gpu=8] [seq_length=384] [doc_stride=128] [bert_model=large|base]
#     [squad_version=1.1|2.0] [init_checkpoint=$BERT_DIR/model.ckpt] [epochs=2.0]
# Environment: BERT_DIR (vocab.txt, bert_config.json; default as NVIDIA's: their LAMB BERT-large,
# Google's BERT-base),
# SQUAD_DIR (train-vX.json, dev-vX.json), RESULTS_DIR, EXPORT_DIR (write a SavedModel), PYTHON.
set -euo pipefail
batch_size=${1:-8}
learning_rate=${2:-5e-6}
precision=${3:-fp16}
use_xla=${4:-true}
num_gpus=${5:-8}
seq_length=${6:-384}
doc_stride=${7:-128}
bert_model=${8:-large}
squad_version=${9:-1.1}
source "$(dirname "${BASH_SOURCE[0]}")/launch_common.sh"
DATA_DIR=${DATA_DIR:-${BERT_PREP_WORKING_DIR:-$ROOT/data}}
# NVIDIA's defaults: BERT-large is NVIDIA's LAMB-pre-trained checkpoint (`bertPrep.py --action
# download --dataset nvidia_pretrained_weights`), which their learning rates were chosen
# for; BERT-base is Google's.
if [ "$bert_model" = large ]; then
  BERT_DIR=${BERT_DIR:-$DATA_DIR/download/nvidia_pretrained/bert_tf_pretraining_large_lamb}
else
  BERT_DIR=${BERT_DIR:-$DATA_DIR/download/google_pretrained_weights/uncased_L-12_H-768_A-12}
fi
SQUAD_DIR=${SQUAD_DIR:-$DATA_DIR/download/squad/v$squad_version}
init_checkpoint=${10:-$BERT_DIR/model.ckpt}
# NVIDIA's default name is model.ckpt; Google's folders hold bert_model.ckpt: with the default,
# a folder with one checkpoint of another name is taken (the commands read a folder so).
if [ -z "${10:-}" ] && [ ! -e "$init_checkpoint.index" ] && [ -d "$BERT_DIR" ]; then
  init_checkpoint=$BERT_DIR
fi
epochs=${11:-2.0}
RESULTS_DIR=${RESULTS_DIR:-$ROOT/results/squad_${bert_model}_${precision}_v${squad_version}}
v2_flag=$([ "$squad_version" = "1.1" ] && echo --noversion_2_with_negative || echo --version_2_with_negative)
for needed in "$BERT_DIR/vocab.txt" "$BERT_DIR/bert_config.json" \
              "$SQUAD_DIR/train-v$squad_version.json" "$SQUAD_DIR/dev-v$squad_version.json"; do
  [ -f "$needed" ] || { echo "error: $needed: missing (set BERT_DIR / SQUAD_DIR)" >&2; exit 1; }
done
precision_flags "$precision" finetuning
xla_flags "$use_xla"
mkdir -p "$RESULTS_DIR"
launch "$ROOT/run_squad.py" --vocab_file="$BERT_DIR/vocab.txt" \
  --bert_config_file="$BERT_DIR/bert_config.json" --init_checkpoint="$init_checkpoint" \
  --do_train --train_file="$SQUAD_DIR/train-v$squad_version.json" \
  --do_predict --predict_file="$SQUAD_DIR/dev-v$squad_version.json" \
  --train_batch_size="$batch_size" --learning_rate="$learning_rate" \
  --num_train_epochs="$epochs" --max_seq_length="$seq_length" --doc_stride="$doc_stride" \
  --save_checkpoints_steps=1000 --output_dir="$RESULTS_DIR" $v2_flag $PREC_FLAGS $XLA_FLAGS_ARG \
  $( [ -f "$SQUAD_DIR/evaluate-v$squad_version.py" ] && echo "--eval_script=$SQUAD_DIR/evaluate-v$squad_version.py" ) \
  ${EXPORT_DIR:+--export_dir="$EXPORT_DIR"} 2>&1 | tee "$RESULTS_DIR/run_squad.log"
