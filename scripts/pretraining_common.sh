# Sourced by the run_pretraining_lamb*.sh scripts: NVIDIA's 15 positional arguments with
# their defaults, the precision and launcher choices, and the data/output locations
# (environment variables with defaults).

train_batch_size_phase1=${1:-64}
train_batch_size_phase2=${2:-8}
eval_batch_size=${3:-8}
learning_rate_phase1=${4:-"7.5e-4"}
learning_rate_phase2=${5:-"5e-4"}
precision=${6:-"fp16"}
use_xla=${7:-"true"}
num_gpus=${8:-8}
warmup_steps_phase1=${9:-"2000"}
warmup_steps_phase2=${10:-"200"}
train_steps=${11:-7820}
save_checkpoints_steps=${12:-100}
num_accumulation_steps_phase1=${13:-128}
num_accumulation_steps_phase2=${14:-512}
bert_model=${15:-"large"}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# NVIDIA's arithmetic (integer, as their `expr`): phase 1 (sequence length 128) takes 90% of
# train_steps; phase 2 (512) 10% of them, scaled by the ratio of the two global batches so
# that phase 2 sees the same share of sequences: 7820 -> 7038 and 782 * 65536 / 32768 = 1564.
# --learning_rate is per GPU: run_pretraining.py applies it x num_gpus (6e-3 and 4e-3).
# TRAIN_STEPS_PHASE1/2 set a phase's steps directly (scripts/run.sub does for NVIDIA's
# run.sub interface, whose steps are written out: 7038 and 1564).
gbs_phase1=$(( train_batch_size_phase1 * num_accumulation_steps_phase1 ))
gbs_phase2=$(( train_batch_size_phase2 * num_accumulation_steps_phase2 ))
train_steps_phase1=${TRAIN_STEPS_PHASE1:-$(( train_steps * 9 / 10 ))}
train_steps_phase2=${TRAIN_STEPS_PHASE2:-$(( train_steps * 1 / 10 * gbs_phase1 / gbs_phase2 ))}

# Where things are. BERT_PREP_WORKING_DIR is bertPrep.py's working directory.
DATA_DIR=${DATA_DIR:-${BERT_PREP_WORKING_DIR:-$ROOT/data}}
TFRECORD_PREFIX=${TFRECORD_PREFIX:-tfrecord_lower_case_1}
DATASET=${DATASET:-books_wiki_en_corpus}
# Which of bertPrep.py's record folders: MASKING=static|dynamic (create_tfrecord_files
# --masking), PACKED=true|false (--pack: several instances a row, less padding).
MASKING=${MASKING:-static}
PACKED=${PACKED:-false}
packing_filter() {  # keeps the folder names of packed records iff PACKED=true
  if [ "$PACKED" = true ]; then grep -e "_packed_"; else grep -v -e "_packed_"; fi
}
# phase_data SEQ_LEN MAX_PRED SPLIT -> bertPrep.py's records of SPLIT (training|test): the
# SPLIT folder (NVIDIA's layout, which bertPrep.py writes), or the flat folder of earlier
# versions of this project as a glob; failing both, the records NVIDIA's own bertPrep.py
# writes under DATA_DIR/tfrecord/ (its scripts' paths).
phase_data() {
  local kind="_max_pred_$2_" dir nvidia
  [ "$MASKING" = dynamic ] && kind="_dynamic"
  dir=$(ls -d "$DATA_DIR"/${TFRECORD_PREFIX}_seq_len_$1_*/"$DATASET" 2>/dev/null \
        | grep -e "$kind" | packing_filter | head -n 1)
  nvidia="$DATA_DIR/tfrecord/lower_case_1_seq_len_$1_max_pred_$2_masked_lm_prob_0.15_random_seed_12345_dupe_factor_5_shard_1472_test_split_10/$DATASET/$3"
  if [ -n "$dir" ] && [ -d "$dir/$3" ]; then echo "$dir/$3"
  elif [ -n "$dir" ]; then echo "$dir/${DATASET}_$3_*.tfrecord"
  elif [ -d "$nvidia" ]; then echo "$nvidia"
  else echo "$DATA_DIR/${TFRECORD_PREFIX}_seq_len_$1_max_pred_$2_masked_lm_prob_0.15_random_seed_12345_dupe_factor_5/$DATASET/$3"
  fi
}
TRAIN_DATA_PHASE1=${TRAIN_DATA_PHASE1:-$(phase_data 128 20 training)}
EVAL_DATA_PHASE1=${EVAL_DATA_PHASE1:-$(phase_data 128 20 test)}
TRAIN_DATA_PHASE2=${TRAIN_DATA_PHASE2:-$(phase_data 512 80 training)}
EVAL_DATA_PHASE2=${EVAL_DATA_PHASE2:-$(phase_data 512 80 test)}
BERT_CONFIG=${BERT_CONFIG:-$ROOT/modeling/configs/bert_${bert_model}_config.json}
RESULTS_DIR=${RESULTS_DIR:-$ROOT/results/bert_${bert_model}_pretraining_lamb_${precision}}
DLLOG_DIR=${DLLOG_DIR:-$RESULTS_DIR}
# Phase 2 starts from phase 1's checkpoint at its LAST step (as NVIDIA's script checks), never
# from the partial weights of a preempted phase 1.
PHASE1_FINAL_CHECKPOINT=${PHASE1_CHECKPOINT:-$RESULTS_DIR/phase_1/model.ckpt-$train_steps_phase1}

source "$ROOT/scripts/launch_common.sh"
precision_flags "$precision"
xla_flags "$use_xla"

# run_phase PHASE SEQ MAX_PRED BATCH LR WARMUP STEPS ACCUM TRAIN_DIR EVAL_DIR [extra flags...]
run_phase() {
  local phase=$1 seq=$2 pred=$3 batch=$4 lr=$5 warmup=$6 steps=$7 accum=$8 train=$9 evaldir=${10}
  shift 10
  local out="$RESULTS_DIR/phase_$phase"
  # One list for the dry run and the run, so the printed plan is the one that runs.
  local args=(--phase="$phase"
    --bert_config_file="$BERT_CONFIG" --input_files_dir="$train" --eval_files_dir="$evaldir"
    --output_dir="$out" --do_train --do_eval --optimizer_type=lamb
    --max_seq_length="$seq" --max_predictions_per_seq="$pred"
    --train_batch_size="$batch" --eval_batch_size="$eval_batch_size"
    --learning_rate="$lr" --num_warmup_steps="$warmup" --num_train_steps="$steps"
    --num_accumulation_steps="$accum" --allreduce_post_accumulation
    --save_checkpoints_steps="$save_checkpoints_steps" --display_loss_steps="${DISPLAY_LOSS_STEPS:-1}"
    --dllog_path="$DLLOG_DIR/phase_${phase}_dllog.jsonl" $PREC_FLAGS $XLA_FLAGS_ARG "$@")
  # RESET_DATA_POSITION=1: resume the weights and step with a new data order on purpose (after
  # changing the batch or the files; another rank count alone restarts it by itself).
  [ "${RESET_DATA_POSITION:-0}" = 1 ] && args+=(--reset_data_position)
  if [ "${DRY_RUN:-0}" = 1 ]; then  # the plan of this phase as one JSON line; nothing runs
    "$PYTHON" "$ROOT/run_pretraining.py" "${args[@]}" --dry_run --dry_run_ranks="$num_gpus"
    return
  fi
  mkdir -p "$out"
  echo "== phase $phase: seq $seq, batch $batch x $accum accumulation x $num_gpus ranks," \
       "lr $lr per GPU (x $num_gpus), $steps steps ($warmup warm-up), $precision, xla $use_xla -> $out"
  launch "$ROOT/run_pretraining.py" "${args[@]}"
}

# phase_finished DIR STEPS: true when DIR holds the checkpoint of step STEPS (the phase's last).
phase_finished() { [ -f "$1/model.ckpt-$2.index" ]; }
