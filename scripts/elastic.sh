# Sourced by scripts/run.sub: what the job does when a rank or a node fails during training.
# srun ends the step when one of its tasks fails (--kill-on-bad-exit); the job itself goes on
# (#SBATCH --no-kill keeps the allocation when a node fails). These functions find what
# failed, which nodes still answer, the layout to go on with, and the recipe rescaled to it
# (the same global batch: more accumulation a rank). Expects `fail`, RESULTS_DIR, NODES,
# GPUS_PER_NODE, TOTAL_GPUS, BERT_LAUNCHER, PREEMPTED_BY and phase_finished from run.sub.

# BERT_MAX_RESTARTS (3): attempts after the first; BERT_MIN_NODES (1): fewer nodes stop the job.
elastic_settings() {
  ELASTIC_MAX_RESTARTS=${BERT_MAX_RESTARTS:-3}
  ELASTIC_MIN_NODES=${BERT_MIN_NODES:-1}
  [[ "$ELASTIC_MAX_RESTARTS" =~ ^[0-9]+$ ]] || fail "BERT_MAX_RESTARTS=$ELASTIC_MAX_RESTARTS:" \
    "must be a whole number (0: a failed rank ends the job)"
  [[ "$ELASTIC_MIN_NODES" =~ ^[1-9][0-9]*$ ]] || fail "BERT_MIN_NODES=$ELASTIC_MIN_NODES: must" \
    "be a positive whole number of nodes"
  ELASTIC_LOG=""
  [ "${DRY_RUN:-0}" != 1 ] || return 0   # a dry run writes nothing
  mkdir -p "$RESULTS_DIR"
  ELASTIC_LOG="$RESULTS_DIR/run.sub.log"   # every attempt's output, as in the job's output
}

elastic_log_size() { [ -z "$ELASTIC_LOG" ] && echo 0 || stat -c %s "$ELASTIC_LOG" 2>/dev/null || echo 0; }
# The output of the attempt that started at byte OFFSET of the log.
_attempt_output() { tail -c +"$(( $1 + 1 ))" "$ELASTIC_LOG" 2>/dev/null || true; }

# The folder of the phase that was running: the first one not finished.
_running_phase_dir() {
  if [ "${#PHASE_SCRIPTS[@]}" -eq 1 ] && [[ "${PHASE_SCRIPTS[0]}" == *_phase[12].sh ]]; then
    local name=${PHASE_SCRIPTS[0]%.sh}; echo "$RESULTS_DIR/phase_${name##*phase}"; return
  fi
  if phase_finished "$RESULTS_DIR/phase_1" "$train_steps_phase1"; then
    echo "$RESULTS_DIR/phase_2"
  else
    echo "$RESULTS_DIR/phase_1"
  fi
}

# elastic_should_relaunch STATUS OFFSET: true when the attempt's srun step lost a task after
# training had begun; then ELASTIC_FAILED (what failed), ELASTIC_FAILED_NODE and ELASTIC_LOST
# (what it cost) are set. A preemption, ranks not started by srun, and a failure before the
# first step (a refused flag or file fails again the same way) end the job as before.
elastic_should_relaunch() {
  local output line last_step dir checkpoint saved seconds
  [ -z "$PREEMPTED_BY" ] && [ "${BERT_LAUNCHER:-}" = srun ] || return 1
  output=$(_attempt_output "$2")
  # srun: "srun: error: NODE: task 1: Killed", "... tasks 0-1: Exited with exit code 1",
  # "srun: error: Node failure on NODE", "srun: error: NODE: task 3: launch failed ..."
  line=$(printf '%s\n' "$output" \
    | grep -m 1 -E "^srun: error: (Node failure on |[^ ]+: tasks? [0-9])" || true)
  [ -n "$line" ] || return 1
  last_step=$(printf '%s\n' "$output" | grep -oE '(^|: )step [0-9]+/' | tail -n 1 \
    | grep -oE '[0-9]+' || true)
  [ -n "$last_step" ] || return 1   # nothing trained: a start-up failure would repeat
  if [[ "$line" =~ Node\ failure\ on\ ([^ ]+) ]]; then
    ELASTIC_FAILED_NODE=${BASH_REMATCH[1]}; ELASTIC_FAILED="node $ELASTIC_FAILED_NODE failed"
  else
    line=${line#srun: error: }
    ELASTIC_FAILED_NODE=${line%%:*}
    ELASTIC_FAILED="${line#*: } on $ELASTIC_FAILED_NODE"
  fi
  dir=$(_running_phase_dir)
  checkpoint=$(sed -n 's/^model_checkpoint_path: "\(.*\)"$/\1/p' "$dir/checkpoint" 2>/dev/null \
    || true)
  saved=${checkpoint##*-}
  if [[ "$saved" =~ ^[0-9]+$ ]]; then
    seconds=$(( $(date +%s) - $(stat -c %Y "$dir/$(basename "$checkpoint").index" 2>/dev/null \
      || date +%s) ))
    ELASTIC_LOST="$(basename "$dir") goes on from its checkpoint of step $saved"
    if (( last_step > saved )); then
      ELASTIC_LOST+=": steps $(( saved + 1 ))-$last_step are done again"
    else
      ELASTIC_LOST+=": only the window in progress is done again"
    fi
    ELASTIC_LOST+=" (${seconds} s of work since it was written)"
  else
    ELASTIC_LOST="$(basename "$dir") had no checkpoint yet: it starts again (steps"
    ELASTIC_LOST+=" 1-$last_step are done again)"
  fi
  return 0
}

# The nodes of NODES that run a task within 60 s, one line each.
_answering_nodes() {
  local node pids=() ok=()
  for node in "${NODES[@]}"; do
    timeout 60 srun --nodes=1 --ntasks=1 --nodelist="$node" --kill-on-bad-exit=0 \
      --job-name=bert-node-check true >/dev/null 2>&1 &
    pids+=($!)
  done
  local i
  for i in "${!NODES[@]}"; do
    if wait "${pids[$i]}"; then echo "${NODES[$i]}"; fi
  done
}

# elastic_relayout: the layout to go on with. Nodes that do not answer are left out; so is
# the failed task's node where the others are enough (its GPU is suspect, and ranks stay the
# same on every node); on a job that cannot spare it (one node, or BERT_MIN_NODES), its
# failed GPU's rank is left out on every node instead. Sets NODES, GPUS_PER_NODE,
# TOTAL_GPUS, HOSTS and BERT_NODES (the nodes srun starts ranks on, scripts/launch_common.sh).
elastic_relayout() {
  local alive=() kept=() node
  mapfile -t alive < <(_answering_nodes)
  if (( ${#alive[@]} > ELASTIC_MIN_NODES )) || { (( ${#alive[@]} == ELASTIC_MIN_NODES )) \
      && ! printf '%s\n' "${alive[@]}" | grep -qx "$ELASTIC_FAILED_NODE"; }; then
    for node in "${alive[@]}"; do [ "$node" = "$ELASTIC_FAILED_NODE" ] || kept+=("$node"); done
    (( ${#kept[@]} >= ELASTIC_MIN_NODES )) || kept=("${alive[@]}")
  else
    kept=("${alive[@]}")
  fi
  (( ${#kept[@]} >= ELASTIC_MIN_NODES )) || fail "$ELASTIC_FAILED; ${#alive[@]} node(s) still" \
    "answer (${alive[*]:-none}), fewer than BERT_MIN_NODES=$ELASTIC_MIN_NODES: stopping;" \
    "resubmit the job to resume from the newest checkpoint"
  if printf '%s\n' "${kept[@]}" | grep -qx "$ELASTIC_FAILED_NODE"; then
    if (( GPUS_PER_NODE > 1 )); then GPUS_PER_NODE=$(( GPUS_PER_NODE - 1 )); fi
  fi
  NODES=("${kept[@]}")
  TOTAL_GPUS=$(( ${#NODES[@]} * GPUS_PER_NODE ))
  HOSTS=$(printf "%s:${GPUS_PER_NODE}," "${NODES[@]}"); HOSTS=${HOSTS%,}
  BERT_NODES=$(IFS=,; echo "${NODES[*]}")
  export GPUS_PER_NODE BERT_NODES
}

# elastic_rescale ARGS...: ARGS becomes the 15 positional arguments of the recipe as planned
# for RECIPE_TOTAL ranks, on TOTAL_GPUS ranks: the same global batch (accumulation x
# RECIPE_TOTAL / TOTAL_GPUS) and the same peak learning rate (per GPU x RECIPE_TOTAL /
# TOTAL_GPUS), as run.sub rescales a recipe to a job's GPUs.
elastic_rescale() {
  local args=("$@") index value
  for index in 12 13; do
    value=$(( args[index] * RECIPE_TOTAL ))
    (( value % TOTAL_GPUS == 0 )) || fail "$ELASTIC_FAILED; the global batch (accumulation" \
      "${args[index]} x $RECIPE_TOTAL ranks) cannot be kept on $TOTAL_GPUS rank(s): stopping;" \
      "resubmit the job to resume from the newest checkpoint"
    args[index]=$(( value / TOTAL_GPUS ))
  done
  for index in 3 4; do
    args[index]=$(awk -v lr="${args[index]}" -v r="$RECIPE_TOTAL" -v t="$TOTAL_GPUS" \
      'BEGIN { printf "%.10g", lr * r / t }')
  done
  args[7]=$TOTAL_GPUS
  ARGS=("${args[@]}")
}

# elastic_attempt: the recipe once, its output also in ELASTIC_LOG (run.sub reads what failed
# there).
elastic_attempt() {
  if [ -z "$ELASTIC_LOG" ]; then bash "${PHASE_SCRIPTS[0]}" "${ARGS[@]}"; return; fi
  bash "${PHASE_SCRIPTS[0]}" "${ARGS[@]}" 2>&1 | tee -i -a "$ELASTIC_LOG"
}
