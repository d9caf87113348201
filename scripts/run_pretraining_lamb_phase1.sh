#!/usr/bin/env bash
# Phase 1 of BERT pre-training with LAMB: sequence length 128, 90% of the steps.
# Same 15 positional arguments as run_pretraining_lamb.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/pretraining_common.sh"
run_phase 1 128 20 "$train_batch_size_phase1" "$learning_rate_phase1" "$warmup_steps_phase1" \
  "$train_steps_phase1" "$num_accumulation_steps_phase1" "$TRAIN_DATA_PHASE1" "$EVAL_DATA_PHASE1" \
  ${INIT_CHECKPOINT:+--init_checkpoint="$INIT_CHECKPOINT"}
