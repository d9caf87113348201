#!/usr/bin/env bash
# Fine-tune on a GLUE task (NVIDIA's positional arguments and defaults):
#   bash scripts/run_glue.sh [task_name=MRPC] [batch_size=16] [learning_rate=3e-6]
#     [precision=fp16|bf16|fp32|tf32|manual_fp16] [use_xla=true] [num_gpu=8] [seq_length=128]
#     [doc_stride=64 (accepted, unused by classification)] [bert_model=large|base]
#     [epochs=3.0] [warmup_proportion=0.1] [init_checkpoint=$BERT_DIR/model.ckpt]
# Environment: BERT_DIR (vocab.txt, bert_config.json), GLUE_DIR (holds <task_name>/),
# RESULTS_DIR, EXPORT_DIR (write a SavedModel), PYTHON.
# Optimizer: run_classifier.py's default, adam (NVIDIA's is lamb, which leaves a real model at
# the majority class at these rates: README, docs/finetuning.md).
set -euo pipefail
task_name=${1:-MRPC}
batch_size=${2:-16}
learning_rate=${3:-3e-6}
precision=${4:-fp16}
use_xla=${5:-true}
num_gpus=${6:-8}
seq_length=${7:-128}
bert_model=${9:-large}
epochs=${10:-3.0}
warmup_proportion=${11:-0.1}
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
GLUE_DIR=${GLUE_DIR:-$DATA_DIR/download/glue}
init_checkpoint=${12:-$BERT_DIR/model.ckpt}
# NVIDIA's default name is model.ckpt; Google's folders hold bert_model.ckpt: with the default,
# a folder with one checkpoint of another name is taken (the commands read a folder so).
if [ -z "${12:-}" ] && [ ! -e "$init_checkpoint.index" ] && [ -d "$BERT_DIR" ]; then
  init_checkpoint=$BERT_DIR
fi
RESULTS_DIR=${RESULTS_DIR:-$ROOT/results/glue_${task_name}_${bert_model}_${precision}}
for needed in "$BERT_DIR/vocab.txt" "$BERT_DIR/bert_config.json" "$GLUE_DIR/$task_name"; do
  [ -e "$needed" ] || { echo "error: $needed: missing (set BERT_DIR / GLUE_DIR)" >&2; exit 1; }
done
precision_flags "$precision" finetuning
xla_flags "$use_xla"
mkdir -p "$RESULTS_DIR"
launch "$ROOT/run_classifier.py" --task_name="$task_name" --do_train --do_eval \
  --data_dir="$GLUE_DIR/$task_name" --vocab_file="$BERT_DIR/vocab.txt" \
  --bert_config_file="$BERT_DIR/bert_config.json" --init_checkpoint="$init_checkpoint" \
  --max_seq_length="$seq_length" --train_batch_size="$batch_size" \
  --learning_rate="$learning_rate" --num_train_epochs="$epochs" \
  --warmup_proportion="$warmup_proportion" --output_dir="$RESULTS_DIR" $PREC_FLAGS \
  $XLA_FLAGS_ARG ${EXPORT_DIR:+--export_dir="$EXPORT_DIR"} 2>&1 | tee "$RESULTS_DIR/run_glue.log"
