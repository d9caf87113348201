# Sourced by scripts/run.sub (srun's ranks, or horovodrun's over ssh) and by
# scripts/run_pretraining_lamb.sh outside Slurm (horovodrun's hosts, or one machine): what
# the run does when a rank or a node fails during training. The launcher ends the attempt
# when one of its ranks fails (srun: after BERT_PEER_LOSS_WAIT, once rank 0 saved the last
# completed step; horovodrun: 5 s after); the job itself goes on (#SBATCH --no-kill keeps the
# allocation when a node fails). These functions find what failed, which nodes still answer,
# the layout to go on with, and the recipe rescaled to it (the same global batch: more
# accumulation a rank), and `elastic_run` runs the attempts. Expects `fail`, RESULTS_DIR,
# NODES, GPUS_PER_NODE, TOTAL_GPUS, BERT_LAUNCHER (srun or ssh), PHASE_SCRIPTS, ARGS and
# phase_finished from the caller, catch_preemption, supervise, forward_to_launchers,
# PREEMPTED_BY, _launch_flag and _is_this_machine from scripts/launch_common.sh.

# BERT_MAX_RESTARTS (3): attempts after the first; BERT_MIN_NODES (1): fewer nodes stop the job.
# elastic_settings WHO LOG [written]: WHO (the script) begins the console lines; LOG, a
# file of RESULTS_DIR, keeps every attempt's output (what failed is read there): copied
# there from the console, or, with `written`, written there by the recipe itself.
elastic_settings() {
  ELASTIC_WHO=$1 ELASTIC_LOG_WRITTEN=${3:-}
  ELASTIC_MAX_RESTARTS=${BERT_MAX_RESTARTS:-3}
  ELASTIC_MIN_NODES=${BERT_MIN_NODES:-1}
  [[ "$ELASTIC_MAX_RESTARTS" =~ ^[0-9]+$ ]] || fail "BERT_MAX_RESTARTS=$ELASTIC_MAX_RESTARTS:" \
    "must be a whole number (0: a failed rank ends the job)"
  [[ "$ELASTIC_MIN_NODES" =~ ^[1-9][0-9]*$ ]] || fail "BERT_MIN_NODES=$ELASTIC_MIN_NODES: must" \
    "be a positive whole number of nodes"
  ELASTIC_LOG=""
  [ "${DRY_RUN:-0}" != 1 ] || return 0   # a dry run writes nothing
  mkdir -p "$RESULTS_DIR"
  ELASTIC_LOG="$RESULTS_DIR/$2"   # every attempt's output, as on the console
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

# _launcher_failure OUTPUT: true when the launcher says a rank failed; then ELASTIC_FAILED
# (what failed) and ELASTIC_FAILED_NODE are set.
_launcher_failure() {
  local line rank code
  ELASTIC_FAILED_RANK=""
  if [ "$BERT_LAUNCHER" = srun ]; then
    # "srun: error: NODE: task 1: Killed", "... tasks 0-1: Exited with exit code 1",
    # "srun: error: Node failure on NODE", "srun: error: NODE: task 3: launch failed ..."
    line=$(printf '%s\n' "$1" \
      | grep -m 1 -E "^srun: error: (Node failure on |[^ ]+: tasks? [0-9])" || true)
    [ -n "$line" ] || return 1
    if [[ "$line" =~ Node\ failure\ on\ ([^ ]+) ]]; then
      ELASTIC_FAILED_NODE=${BASH_REMATCH[1]}; ELASTIC_FAILED="node $ELASTIC_FAILED_NODE failed"
    else
      line=${line#srun: error: }
      ELASTIC_FAILED_NODE=${line%%:*}
      [[ "$line" =~ tasks?\ ([0-9]+) ]] && ELASTIC_FAILED_RANK=${BASH_REMATCH[1]}
      ELASTIC_FAILED="${line#*: } on $ELASTIC_FAILED_NODE"
    fi
    return 0
  fi
  # horovodrun (Gloo): "Process 1 exit with status code 137." for the first rank that failed
  # (its ranks go host by host, GPUS_PER_NODE a host, in the -H order)
  line=$(printf '%s\n' "$1" | grep -m 1 -E "^Process [0-9]+ exit with status code [0-9]+" \
    || true)
  [[ "$line" =~ ^Process\ ([0-9]+)\ exit\ with\ status\ code\ ([0-9]+) ]] || return 1
  rank=${BASH_REMATCH[1]} code=${BASH_REMATCH[2]}
  ELASTIC_FAILED_RANK=$rank
  (( rank / GPUS_PER_NODE < ${#NODES[@]} )) || return 1
  ELASTIC_FAILED_NODE=${NODES[$(( rank / GPUS_PER_NODE ))]}
  if (( code == 255 )); then   # ssh's own code: the remote rank died of a signal, or the host
    ELASTIC_FAILED="rank $rank: ssh ended with 255 (the rank killed, or its host lost)"
  elif (( code > 128 )); then
    ELASTIC_FAILED="rank $rank: killed by SIG$(kill -l $(( code - 128 )) 2>/dev/null || echo "$(( code - 128 ))")"
  else
    ELASTIC_FAILED="rank $rank: exit code $code"
  fi
  ELASTIC_FAILED+=" on $ELASTIC_FAILED_NODE"
}

# _wait_for_the_chief DIR: until the failed attempt's rank 0 has let go of DIR's run lock
# (resilience/run_lock.py: held for the life of the run), at most 120 s (the grace a failed
# session gives its threads to stop, the last window's saver among them). The launcher can
# return while rank 0, on its host, is still saving the last completed step
# (training/last_window.py): the checkpoint is read after that save, and the relaunch's
# rank 0 does not find the folder locked and refuse.
_wait_for_the_chief() {
  command -v flock >/dev/null 2>&1 || return 0
  { flock -s -w 120 9; } 2>/dev/null 9<"$1/.run.lock" || true
}

# elastic_should_relaunch STATUS OFFSET: true when the attempt (its output from byte OFFSET
# of the log) lost a rank after training had begun; then ELASTIC_FAILED (what failed),
# ELASTIC_FAILED_NODE and ELASTIC_LOST (what it cost) are set. A preemption and a failure
# before the first step (a refused flag or file fails again the same way) end the job.
elastic_should_relaunch() {
  local output last_step dir checkpoint saved seconds
  [ -z "$PREEMPTED_BY" ] && [ -n "$ELASTIC_LOG" ] || return 1
  output=$(_attempt_output "$2")
  _launcher_failure "$output" || return 1
  # A rank that stopped with an error line of its own (a full disk, a bad record, diverged
  # weights) would stop the same way again; one that only saw its peer fail would not.
  if [ -n "$ELASTIC_FAILED_RANK" ] && printf '%s\n' "$output" \
      | grep -E "^($ELASTIC_FAILED_RANK: |\[$ELASTIC_FAILED_RANK\]<std(err|out)>:)error: " \
      | grep -qv "because another rank failed"; then
    return 1
  fi
  # "step 3/9" at a line's start, after srun's "0: " or horovodrun's "[0]<stderr>:"
  last_step=$(printf '%s\n' "$output" | grep -oE '(^|:) ?step [0-9]+/' | tail -n 1 \
    | grep -oE '[0-9]+' || true)
  [ -n "$last_step" ] || return 1   # nothing trained: a start-up failure would repeat
  dir=$(_running_phase_dir)
  _wait_for_the_chief "$dir"
  checkpoint=$(sed -n 's/^model_checkpoint_path: "\(.*\)"$/\1/p' "$dir/checkpoint" 2>/dev/null \
    || true)
  saved=${checkpoint##*-}
  if [[ "$saved" =~ ^[0-9]+$ ]]; then
    seconds=$(( $(date +%s) - $(stat -c %Y "$dir/$(basename "$checkpoint").index" 2>/dev/null \
      || date +%s) ))
    ELASTIC_LOST="$(basename "$dir") goes on from its checkpoint of step $saved"
    if (( last_step == saved + 1 )); then
      ELASTIC_LOST+=": step $last_step is done again"
    elif (( last_step > saved )); then
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

# The nodes of NODES that run a command within 60 s (srun: a one-task step; horovodrun: ssh,
# as horovodrun reaches them; this machine answers), one line each.
_answering_nodes() {
  local node pids=() i
  for node in "${NODES[@]}"; do
    if [ "$BERT_LAUNCHER" = srun ]; then
      timeout 60 srun --nodes=1 --ntasks=1 --nodelist="$node" --kill-on-bad-exit=0 \
        --job-name=bert-node-check true >/dev/null 2>&1 &
    elif _is_this_machine "$node"; then   # scripts/launch_common.sh
      true &
    else
      timeout 60 ssh -o BatchMode=yes -o ConnectTimeout=30 ${SSH_PORT:+-p "$SSH_PORT"} \
        "$node" true </dev/null >/dev/null 2>&1 &
    fi
    pids+=($!)
  done
  for i in "${!NODES[@]}"; do
    if wait "${pids[$i]}"; then echo "${NODES[$i]}"; fi
  done
}

# elastic_relayout: the layout to go on with. Nodes that do not answer are left out; so is
# the failed task's node where the others are enough (its GPU is suspect, and ranks stay the
# same on every node); on a job that cannot spare it (one node, or BERT_MIN_NODES), its
# failed GPU's rank is left out on every node instead. Sets NODES, GPUS_PER_NODE,
# TOTAL_GPUS, HOSTS and BERT_NODES (the nodes srun starts ranks on, scripts/launch_common.sh),
# and for horovodrun the hosts (-H) of HOROVOD_LAUNCH_FLAGS.
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
  # The most ranks (then the most nodes) over which the global batch splits evenly: 7 ranks
  # left of 8 go on with 4, three nodes of a 4-node recipe with two.
  local best=0 best_nodes=0 best_per_node=0 count per_node
  for (( count = ${#kept[@]}; count >= ELASTIC_MIN_NODES && count >= 1; count-- )); do
    for (( per_node = GPUS_PER_NODE; per_node >= 1; per_node-- )); do
      if (( count * per_node > best )) && _keeps_global_batch $(( count * per_node )); then
        best=$(( count * per_node )) best_nodes=$count best_per_node=$per_node
      fi
    done
  done
  if (( best > 0 )); then kept=("${kept[@]:0:best_nodes}"); GPUS_PER_NODE=$best_per_node; fi
  NODES=("${kept[@]}")
  TOTAL_GPUS=$(( ${#NODES[@]} * GPUS_PER_NODE ))
  HOSTS=$(printf "%s:${GPUS_PER_NODE}," "${NODES[@]}"); HOSTS=${HOSTS%,}
  BERT_NODES=$(IFS=,; echo "${NODES[*]}")
  export GPUS_PER_NODE BERT_NODES
  if [ "$BERT_LAUNCHER" != srun ]; then
    HOROVOD_LAUNCH_FLAGS=$(elastic_hosts_flags "$HOSTS" "${HOROVOD_LAUNCH_FLAGS:-}")
    export HOROVOD_LAUNCH_FLAGS
  fi
}

# elastic_hosts_flags HOSTS FLAGS: horovodrun's FLAGS with HOSTS as its -H (--hosts) list
# (added, with --gloo, when FLAGS had none: one machine).
elastic_hosts_flags() {
  local flags=() word replaced=0 next=0
  read -ra flags <<< "$2"
  for word in "${!flags[@]}"; do
    if (( next )); then flags[$word]=$1; next=0; replaced=1; continue; fi
    case "${flags[$word]}" in
      -H|--hosts) next=1 ;;
      -H=*|--hosts=*) flags[$word]="${flags[$word]%%=*}=$1"; replaced=1 ;;
    esac
  done
  (( replaced )) || flags=(--gloo -H "$1" "${flags[@]}")
  echo "${flags[*]}"
}

# elastic_layout_from_flags NUM_GPUS: outside Slurm, NODES, GPUS_PER_NODE, TOTAL_GPUS and
# HOSTS from HOROVOD_LAUNCH_FLAGS' -H list ("h1:2,h2:2"; this machine without one); false
# when they cannot be known (a hostfile, slots that differ between hosts).
elastic_layout_from_flags() {
  local _LAUNCH_FLAGS=${HOROVOD_LAUNCH_FLAGS:-} hosts entry slots   # for _launch_flag
  [ -z "$(_launch_flag -hostfile --hostfile --host-discovery-script)" ] || return 1
  hosts=$(_launch_flag -H --hosts)
  [ -n "$hosts" ] || hosts="localhost:$1"
  NODES=() GPUS_PER_NODE=""
  IFS=, read -ra entries <<< "$hosts"
  for entry in "${entries[@]}"; do
    slots=${entry##*:}; [[ "$entry" == *:* ]] || slots=1
    [ -z "$GPUS_PER_NODE" ] || [ "$GPUS_PER_NODE" = "$slots" ] || return 1
    GPUS_PER_NODE=$slots; NODES+=("${entry%:*}")
  done
  TOTAL_GPUS=$(( ${#NODES[@]} * GPUS_PER_NODE ))
  (( TOTAL_GPUS == $1 )) || return 1
  HOSTS=$hosts
}

# _keeps_global_batch RANKS: whether both phases' accumulation x RECIPE_TOTAL (of
# RECIPE_ARGS) splits evenly over RANKS.
_keeps_global_batch() {
  local index
  for index in 12 13; do
    (( RECIPE_ARGS[index] * RECIPE_TOTAL % $1 == 0 )) || return 1
  done
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
  if [ -z "$ELASTIC_LOG" ] || [ -n "$ELASTIC_LOG_WRITTEN" ]; then
    bash "${PHASE_SCRIPTS[0]}" "${ARGS[@]}"; return
  fi
  bash "${PHASE_SCRIPTS[0]}" "${ARGS[@]}" 2>&1 | tee -i -a "$ELASTIC_LOG"
}

# elastic_run: the recipe (PHASE_SCRIPTS[0] with ARGS) until it ends, relaunched on what is
# left when a rank fails after training began (at most ELASTIC_MAX_RESTARTS times); returns
# the last attempt's status. Each attempt's children know they are one (BERT_ELASTIC_ATTEMPT),
# so a recipe that would loop itself (run_pretraining_lamb.sh) does not.
elastic_run() {
  local attempt=1 status log_offset
  RECIPE_ARGS=("${ARGS[@]}") RECIPE_TOTAL=$TOTAL_GPUS
  export BERT_ELASTIC_ATTEMPT=1
  while :; do
    log_offset=$(elastic_log_size)
    catch_preemption
    elastic_attempt &
    status=0
    supervise $! forward_to_launchers || status=$?
    (( status != 0 )) || return 0
    # a preemption, a refusal (a bad flag, a phase 1 stopped short): as before
    if ! elastic_should_relaunch "$status" "$log_offset"; then
      (( attempt == 1 )) || [ -n "$PREEMPTED_BY" ] || echo "$ELASTIC_WHO: attempt $attempt" \
        "failed (exit $status) and is not relaunched (before its first step, or with an error" \
        "of its own, above); run the same command again to resume from the newest" \
        "checkpoint" | tee -a "$ELASTIC_LOG" >&2
      return "$status"
    fi
    (( attempt <= ELASTIC_MAX_RESTARTS )) || fail "attempt $attempt failed" \
      "($ELASTIC_FAILED) and BERT_MAX_RESTARTS=$ELASTIC_MAX_RESTARTS restarts were used:" \
      "stopping; run the same command again to resume from the newest checkpoint"
    elastic_relayout   # NODES, GPUS_PER_NODE, TOTAL_GPUS, the hosts; fails below the minimum
    elastic_rescale "${RECIPE_ARGS[@]}"
    echo "$ELASTIC_WHO: attempt $attempt failed: $ELASTIC_FAILED; $ELASTIC_LOST; going on with" \
         "$TOTAL_GPUS rank(s) on ${NODES[*]} (${GPUS_PER_NODE} a node; per rank accumulation" \
         "${ARGS[12]}/${ARGS[13]}, the same global batch), attempt $(( attempt + 1 )) of at" \
         "most $(( ELASTIC_MAX_RESTARTS + 1 ))" | tee -a "$ELASTIC_LOG"
    attempt=$(( attempt + 1 ))
  done
}
