# Sourced by the run scripts: precision and XLA flags, and the Horovod launcher (which
# turns SIGTERM/SIGINT into a clean, resumable stop of every rank). `launch` expects
# num_gpus to be set by the caller (PYTHON defaults to the project's .venv).
#
# Hosts (multi-host, tested over ssh): by default one host, `horovodrun --gloo -H
# localhost:$num_gpus`. HOROVOD_LAUNCH_FLAGS replaces those flags, e.g.
#   HOROVOD_LAUNCH_FLAGS="--gloo -H node1:8,node2:8 --network-interface ib0"
# (scripts/run.sub builds it from the Slurm job's nodes with BERT_LAUNCHER=ssh); horovodrun
# starts the ranks of a host that is not this machine through `ssh HOST` (passwordless, the
# first `ssh` on the PATH, the same paths on every host: a shared file system). SSH_PORT,
# when set, is the port of the hosts' sshd (passed as horovodrun -p); a user or key go in
# ~/.ssh/config.
# Inside a Slurm allocation, BERT_LAUNCHER=srun (scripts/run.sub's default) starts the ranks
# with srun instead, one task per GPU, no ssh: see `_srun_command`.

ROOT=${ROOT:-"$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"}
PYTHON="${PYTHON:-$( [ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3 )}"

# fp16|bf16|fp32|tf32|manual_fp16 -> PREC_FLAGS, with the meaning NVIDIA's scripts give
# them: fp32 and tf32 are both --noamp, which on Ampere and later GPUs still lets cuBLAS use
# TF32 (NVIDIA's published "TF32" numbers come from it; set NVIDIA_TF32_OVERRIDE=0 yourself
# for IEEE float32 matmuls); bf16 is ours (bfloat16 AMP, no loss scaling).
# A second argument `finetuning` maps manual_fp16 to --noamp, as NVIDIA's run_squad.sh and
# run_glue.sh do (their fine-tuning scripts have no --manual_fp16).
precision_flags() {
  [ "${2:-}" = finetuning ] && [ "$1" = manual_fp16 ] && { PREC_FLAGS="--noamp"; return; }
  case "$1" in
    fp16) PREC_FLAGS="--amp --amp_dtype=float16" ;;
    bf16) PREC_FLAGS="--amp --amp_dtype=bfloat16" ;;
    fp32|tf32) PREC_FLAGS="--noamp" ;;
    manual_fp16) PREC_FLAGS="--noamp --manual_fp16" ;;
    *) echo "unknown precision '$1': use fp16, bf16, fp32, tf32 or manual_fp16" >&2; exit 2 ;;
  esac
}

xla_flags() {  # true|false -> XLA_FLAGS_ARG (the commands' default is NVIDIA's: on)
  case "$1" in
    true) XLA_FLAGS_ARG="--use_xla" ;;
    false) XLA_FLAGS_ARG="--nouse_xla" ;;
    *) echo "use_xla must be true or false, got '$1'" >&2; exit 2 ;;
  esac
}

# ---------------------------------------------------------------------------------------
# Preemption. SIGTERM (a cluster's notice) or SIGINT (Ctrl-C) must make every rank stop at
# the same accumulation boundary, rank 0 save a checkpoint and every rank exit 0
# (training/hooks.py PreemptionHook). horovodrun itself answers SIGTERM/SIGINT by sending
# SIGTERM to its ranks and SIGKILLing them 5 s later (GRACEFUL_TERMINATION_TIME_S in
# horovod/runner/common/util/safe_shell_exec.py), far too soon for rank 0 to write a
# BERT-large checkpoint, and mpirun also kills its job. So `launch` starts horovodrun/mpirun
# in a session of its own (out of reach of signals sent to our process group, e.g. Ctrl-C)
# and sends SIGTERM to the rank processes itself. Ranks on other nodes need no signal: the
# ranks agree through an allreduce. Processes started by `launch` carry BERT_LAUNCHER_PID so
# an outer script (scripts/run.sub) can forward a signal to the launcher, and
# BERT_LAUNCH_ID (this host, the launcher's pid, a random number; horovodrun passes the
# environment on to remote ranks too) so that, when no rank runs on this machine (every
# host of the list is reached through ssh, e.g. a launch from a login node), the launcher
# finds the ranks of the first host over ssh and signals them there (`_forward_over_ssh`).

PREEMPTED_BY=""   # TERM or INT once this shell was asked to stop

catch_preemption() {  # from now on TERM/INT only set PREEMPTED_BY (see supervise)
  trap 'PREEMPTED_BY=TERM' TERM
  trap 'PREEMPTED_BY=INT' INT
}

# _topmost_below ROOT TEST: the processes below ROOT for which "TEST PID" succeeds, without
# looking further below those (their own children belong to them). Reads /proc itself:
# slim containers have no `ps`.
_topmost_below() {
  local -A kids=()
  local stat line fields pid queue=("$1")
  for stat in /proc/[0-9]*/stat; do
    read -r line 2>/dev/null < "$stat" || continue   # "PID (COMM) STATE PPID ..."
    fields=(${line##*") "})
    pid=${stat#/proc/}
    kids[${fields[1]}]+=" ${pid%/stat}"
  done
  while [ ${#queue[@]} -gt 0 ]; do
    for pid in ${kids[${queue[0]}]:-}; do
      if "$2" "$pid"; then echo "$pid"; else queue+=("$pid"); fi
    done
    queue=("${queue[@]:1}")
  done
}

_environ_has() {  # _environ_has PID REGEX: a NAME=value of PID's environment matches ^REGEX
  tr '\0' '\n' 2>/dev/null < "/proc/$1/environ" | grep -Eq "^($2)"
}

# A rank is a process whose environment has its rank from horovodrun (HOROVOD_RANK),
# Open MPI (OMPI_COMM_WORLD_RANK) or MPICH (PMI_RANK); a variable this shell already has
# would be inherited by horovodrun too, so it cannot tell ranks apart and is not used.
_rank_variables() {
  local name names=""
  for name in HOROVOD_RANK OMPI_COMM_WORLD_RANK PMI_RANK; do
    [ -n "${!name+x}" ] || names+="${names:+|}$name="
  done
  echo "$names"
}
_is_rank() { [ -n "$_RANK_VARS" ] && _environ_has "$1" "$_RANK_VARS"; }

# _signal_once SIGNAL PID...: signals each PID not signalled before (a rank that already
# stopped must not be killed by a second signal while it exits).
_SIGNALLED=" "
_signal_once() {
  local sig=$1 pid; shift
  for pid in "$@"; do
    case "$_SIGNALLED" in *" $pid "*) continue ;; esac
    _SIGNALLED+="$pid "
    kill -"$sig" "$pid" 2>/dev/null || true
  done
}

# Forwarders: "FORWARDER CHILD". TERM whatever the signal received: it is the signal the
# trainers handle from their start on, while SIGINT is ignored by background commands.
forward_to_ranks() {
  local _RANK_VARS; _RANK_VARS=$(_rank_variables)
  _signal_once TERM $(_topmost_below "$1" _is_rank)
  _forward_over_ssh
}

# _launch_flag NAME...: the value of the first of these horovodrun flags among the flags
# `launch` uses ("-H a:2,b:2" or "--hosts=a:2,b:2"); nothing when absent.
_launch_flag() {
  local words=($_LAUNCH_FLAGS) i name
  for ((i = 0; i < ${#words[@]}; i++)); do
    for name in "$@"; do
      [ "${words[i]}" = "$name" ] && { echo "${words[i + 1]:-}"; return; }
      [[ "${words[i]}" == "$name="* ]] && { echo "${words[i]#*=}"; return; }
    done
  done
  return 0   # absent is no error (the run scripts use set -e)
}

# _is_this_machine HOST: whether HOST names this machine (by name: localhost, 127.0.0.1, its
# host name, short or not).
_is_this_machine() {
  case "$1" in localhost|127.0.0.1|"${HOSTNAME:-}"|"${HOSTNAME%%.*}") return 0 ;; esac
  return 1
}

# _first_remote_host: "HOST SLOTS", the first host of the -H list, when no host of the list
# is this machine (nothing otherwise), decided as horovodrun decides to use ssh (is the
# host's address one of this machine's interface addresses?) by $PYTHON's Horovod.
_first_remote_host() {
  local hosts entry; hosts=$(_launch_flag -H --hosts)
  [ -n "$hosts" ] || return 0
  for entry in ${hosts//,/ }; do
    ! _is_this_machine "${entry%%:*}" || return 0
  done
  "$PYTHON" -c '
import sys
from horovod.runner.util import network
local = set(network.get_local_host_addresses())
hosts = [entry.partition(":") for entry in sys.argv[1].split(",") if entry]
if all(network.resolve_host_address(host) not in local for host, _, _ in hosts):
    print(hosts[0][0], hosts[0][2] or 1)' "$hosts" 2>/dev/null || true
}

# Runs on a host through ssh (sh -s LAUNCH_ID PID...): SIGTERM to this launch's ranks there
# (BERT_LAUNCH_ID in their environment, HOROVOD_RANK not inherited from their parent) that
# are not among the PIDs (signalled before); prints the pids it signalled.
_REMOTE_SIGNAL_SCRIPT='id=$1; shift; done_pids=" $* "
for environ in /proc/[0-9]*/environ; do
  pid=${environ#/proc/}; pid=${pid%/environ}
  case "$done_pids" in *" $pid "*) continue ;; esac
  vars=$(tr "\000" "\n" < "$environ" 2>/dev/null) || continue
  printf "%s\n" "$vars" | grep -qx "BERT_LAUNCH_ID=$id" || continue
  printf "%s\n" "$vars" | grep -q "^HOROVOD_RANK=" || continue
  parent=$(sed "s/.*) [A-Za-z] \([0-9]*\) .*/\1/" "/proc/$pid/stat" 2>/dev/null)
  tr "\000" "\n" < "/proc/$parent/environ" 2>/dev/null | grep -q "^HOROVOD_RANK=" && continue
  kill -TERM "$pid" 2>/dev/null && echo "$pid"
done'
_LAUNCH_FLAGS=""    # horovodrun's host flags, set by `launch`
_REMOTE_HOST=""     # "HOST SLOTS" once looked up, "-" when every rank can be signalled here
_REMOTE_PIDS=()     # the pids signalled there

# When every rank runs on other hosts, only horovodrun's `ssh` clients are below this shell
# (sshd started the ranks): SIGTERM goes over ssh to the ranks of the first host (the
# allreduce tells the others), again on each call until all its slots got it (ranks that
# were still starting).
_forward_over_ssh() {
  [ -n "$_REMOTE_HOST" ] || _REMOTE_HOST=$(_first_remote_host)
  [ -n "$_REMOTE_HOST" ] || _REMOTE_HOST=-
  [ "$_REMOTE_HOST" != - ] || return 0
  local host=${_REMOTE_HOST% *} slots=${_REMOTE_HOST#* } port identity pid
  (( ${#_REMOTE_PIDS[@]} < slots )) || return 0
  port=${SSH_PORT:-$(_launch_flag -p --ssh-port)}
  identity=$(_launch_flag -i --ssh-identity-file)
  for pid in $(printf '%s\n' "$_REMOTE_SIGNAL_SCRIPT" | ssh -o PasswordAuthentication=no \
      -o StrictHostKeyChecking=no -o ConnectTimeout=10 ${port:+-p "$port"} \
      ${identity:+-i "$identity"} "$host" sh -s "$BERT_LAUNCH_ID" "${_REMOTE_PIDS[@]}" \
      2>/dev/null); do
    _REMOTE_PIDS+=("$pid")
  done
}
forward_to_child() { _signal_once TERM "$1"; }

# ---- Ranks started by srun (BERT_LAUNCHER=srun) ----------------------------------------
# srun starts num_gpus tasks, GPUS_PER_NODE a node (else num_gpus / the allocation's nodes)
# on the first nodes of the allocation, and each becomes a Horovod rank through Horovod's own
# Gloo rendezvous (runtime/slurm_launch.py: its server runs here, around srun). The plan is
# horovodrun's (ranks node by node), which srun's block distribution gives; another
# distribution (e.g. sbatch --distribution=cyclic) is refused here in one line, and each task
# checks its place again. NETWORK_INTERFACE (e.g. ib0) pins Gloo and NCCL to one interface;
# without it an InfiniBand/RoCE interface every node has is taken (the server probes the
# nodes in one quick srun step first), else the route between the nodes. NCCL_SOCKET_IFNAME,
# HOROVOD_GLOO_IFACE and NCCL_IB_HCA set by the user or the site are kept; Gloo's rendezvous
# waits HOROVOD_GLOO_TIMEOUT_SECONDS (600 s unless set) for the last rank.
# Preemption: srun answers SIGTERM by SIGKILLing its tasks ("forcing job termination"), so
# the tasks (children of slurmstepd, not of this shell) get SIGTERM from
# `scancel --signal=TERM JOB.STEP` instead (`forward_to_step`): they stop at one boundary,
# rank 0 saves, all exit 0 and so does srun. Slurm logs the step as CANCELLED.
_STEP_NAME=""       # srun --job-name of this launch's step
_STEP_SIGNALLED=""  # its JOB.STEP once SIGTERM went to its tasks

_srun_command() {  # the trainer's arguments -> cmd (srun inside its rendezvous server)
  local nodes per_node used plan
  if [ -z "${SLURM_JOB_ID:-}" ] || [ -z "${SLURM_JOB_NODELIST:-}" ]; then
    echo "BERT_LAUNCHER=srun needs a Slurm allocation (SLURM_JOB_ID, SLURM_JOB_NODELIST" \
         "unset): run it inside sbatch or salloc, or unset BERT_LAUNCHER" >&2; exit 1
  fi
  if [ -n "${HOROVOD_LAUNCH_FLAGS:-}" ]; then
    echo "BERT_LAUNCHER=srun and HOROVOD_LAUNCH_FLAGS given together: srun starts the ranks" \
         "itself; unset HOROVOD_LAUNCH_FLAGS, or BERT_LAUNCHER=ssh for horovodrun" >&2; exit 1
  fi
  case "${SLURM_DISTRIBUTION:-block}" in
    block|block:*) ;;
    *) echo "SLURM_DISTRIBUTION=$SLURM_DISTRIBUTION: Horovod's ranks go node by node, which" \
            "only srun's block distribution gives; submit without --distribution (or" \
            "--distribution=block)" >&2; exit 1 ;;
  esac
  command -v srun >/dev/null 2>&1 \
    || { echo "BERT_LAUNCHER=srun: srun is not on the PATH" >&2; exit 1; }
  if [ -n "${BERT_NODES:-}" ]; then   # the nodes a relaunch goes on with (scripts/elastic.sh)
    IFS=, read -ra nodes <<< "$BERT_NODES"
  else
    mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null)
  fi
  (( ${#nodes[@]} > 0 )) || { echo "BERT_LAUNCHER=srun: scontrol show hostnames" \
    "$SLURM_JOB_NODELIST listed no node" >&2; exit 1; }
  per_node=${GPUS_PER_NODE:-$(( num_gpus % ${#nodes[@]} == 0 ? num_gpus / ${#nodes[@]} : 0 ))}
  if ! [[ "$per_node" =~ ^[1-9][0-9]*$ ]] || (( num_gpus % per_node != 0 )) \
     || (( num_gpus / per_node > ${#nodes[@]} )); then
    echo "num_gpus=$num_gpus does not fill whole nodes of GPUS_PER_NODE=${GPUS_PER_NODE:-unset}" \
         "ranks on the ${#nodes[@]} node(s) of job $SLURM_JOB_ID: set GPUS_PER_NODE (ranks a" \
         "node) to a divisor of num_gpus" >&2; exit 1
  fi
  # A rank that dies: the others get BERT_PEER_LOSS_WAIT seconds (180) to reach their window's
  # end, where rank 0 saves the last completed step (training/last_window.py), before srun
  # ends them; 0: srun ends them at once (--kill-on-bad-exit).
  local peer_wait=${BERT_PEER_LOSS_WAIT:-180} on_task_exit
  [[ "$peer_wait" =~ ^[0-9]+$ ]] || { echo "BERT_PEER_LOSS_WAIT=$peer_wait: must be a whole number of" \
    "seconds (0: a rank that dies ends the others at once)" >&2; exit 1; }
  if (( peer_wait == 0 )); then on_task_exit=(--kill-on-bad-exit=1)
  else on_task_exit=(--kill-on-bad-exit=0 --wait="$peer_wait"); fi
  used=$(( num_gpus / per_node ))
  plan=$(printf "%s:$per_node," "${nodes[@]:0:used}"); plan=${plan%,}
  _STEP_NAME="bert-$BERT_LAUNCH_ID" _STEP_SIGNALLED=""
  cmd=(env "PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}"
       "$PYTHON" -m runtime.slurm_launch server --hosts "$plan"
       ${NETWORK_INTERFACE:+--network-interface "$NETWORK_INTERFACE"} --
       srun --ntasks="$num_gpus" --nodes="$used" --ntasks-per-node="$per_node"
       --nodelist="$(IFS=,; echo "${nodes[*]:0:used}")" --distribution=block
       "${on_task_exit[@]}" --cpu-bind=none --label --job-name="$_STEP_NAME"
       "$PYTHON" -m runtime.slurm_launch task -- "$PYTHON" "$@" --horovod)
}

# FORWARDER for srun: SIGTERM, once, to the tasks of this launch's step (found by its name
# among the job's steps; until srun has created it, tried again on the next call).
forward_to_step() {
  [ -z "$_STEP_SIGNALLED" ] || return 0
  local step
  step=$(scontrol show step "$SLURM_JOB_ID" --oneliner 2>/dev/null \
    | awk -v name="Name=$_STEP_NAME" '{ for (i = 2; i <= NF; i++) if ($i == name) {
        sub(/^StepId=/, "", $1); print $1; exit } }')
  [ -n "$step" ] || return 0
  scancel --signal=TERM "$step" 2>/dev/null && _STEP_SIGNALLED=$step
  return 0
}
_has_launcher() { _environ_has "$1" BERT_LAUNCHER_PID=; }
forward_to_launchers() {  # the `launch` shells below CHILD (run.sub -> run scripts -> launch)
  local pid
  _signal_once TERM $(for pid in $(_topmost_below "$1" _has_launcher); do
    tr '\0' '\n' 2>/dev/null < "/proc/$pid/environ" | sed -n 's/^BERT_LAUNCHER_PID=//p'
  done | sort -u)
}

# supervise CHILD FORWARDER: waits for the background job CHILD (started after
# catch_preemption). Once a signal arrived, FORWARDER runs at once and then every second, so
# processes started after the signal (ranks still being spawned) get it too. Returns CHILD's
# status; after a preemption that CHILD survived cleanly, 128 + the signal's number, so a
# calling script stops (e.g. does not start phase 2 on an unfinished phase 1).
supervise() {
  local child=$1 forwarder=$2 status=0
  while kill -0 "$child" 2>/dev/null; do
    [ -z "$PREEMPTED_BY" ] || "$forwarder" "$child"
    sleep 1 & wait $! || true   # a trapped signal ends this wait at once
  done
  wait "$child" || status=$?
  trap - TERM INT
  if [ -n "$PREEMPTED_BY" ] && [ "$status" -eq 0 ]; then
    echo "preempted by SIG$PREEMPTED_BY: the checkpoint is saved; rerun the same command" \
         "to resume" >&2
    status=$(( 128 + $(kill -l "$PREEMPTED_BY") ))
  fi
  return "$status"
}

# ---- horovodrun: the site's network settings and Gloo's rendezvous timeout -------------
# horovodrun runs each rank as "env <its variables> ... NCCL_SOCKET_IFNAME=<its nics>
# HOROVOD_GLOO_IFACE=<its nic> COMMAND" (horovod/runner/gloo_run.py), overwriting what the
# user or the site set; so COMMAND starts with `env NAME=value ...`, which sets them back
# (NCCL_IB_HCA too, for one place to read them). BERT_NETWORK_CHOICE says, for each rank's
# plan line, what the ranks talk on (runtime/slurm_launch.py does the same for srun).
# Gloo's rendezvous waits HOROVOD_GLOO_TIMEOUT_SECONDS for every rank, 600 s unless set
# (Horovod's default is 30 s; runtime/slurm_launch.py says why), as --gloo-timeout-seconds.
GLOO_TIMEOUT_DEFAULT=600
_horovodrun_settings() {  # -> _HVD_FLAGS (horovodrun flags), _HVD_ENV (env NAME=value ...)
  local timeout=${HOROVOD_GLOO_TIMEOUT_SECONDS:-$GLOO_TIMEOUT_DEFAULT} name kept="" rest="" choice nic
  if ! [[ "$timeout" =~ ^[0-9]+$ ]] || (( 10#$timeout < 1 )); then
    echo "HOROVOD_GLOO_TIMEOUT_SECONDS=$timeout: must be a whole number of seconds, at least 1" \
         "(unset: $GLOO_TIMEOUT_DEFAULT)" >&2; exit 1
  fi
  _HVD_FLAGS=()
  [ -n "$(_launch_flag --gloo-timeout-seconds)" ] || _HVD_FLAGS=(--gloo-timeout-seconds "$timeout")
  _HVD_ENV=(env)
  for name in NCCL_SOCKET_IFNAME HOROVOD_GLOO_IFACE NCCL_IB_HCA; do
    [ -n "${!name:-}" ] || continue
    _HVD_ENV+=("$name=${!name}"); kept+="${kept:+, }$name=${!name}"
  done
  nic=$(_launch_flag --network-interface --network-interfaces)
  choice="horovodrun's choice (an interface routed between the hosts)"
  [ -z "$nic" ] || choice="$nic (--network-interface)"
  [ -n "${HOROVOD_GLOO_IFACE:-}" ] || rest="Gloo"
  [ -n "${NCCL_SOCKET_IFNAME:-}" ] || rest+="${rest:+ and }NCCL's sockets"
  if [ -n "$kept" ]; then choice="$kept (set by you or the site)${rest:+; $rest: $choice}"; fi
  _HVD_ENV+=("BERT_NETWORK_CHOICE=$choice")
}

# horovod_builds: "gloo" and/or "mpi": the controllers this Horovod was built with (nothing
# when Horovod for TensorFlow does not import).
horovod_builds() {
  "$PYTHON" -c 'import horovod.tensorflow as h; print("gloo" * h.gloo_built(), "mpi" * h.mpi_built())' \
    2>/dev/null || true
}

# Whether a launch of one rank must still go through srun or horovodrun: the node it is to
# run on (a relaunch's, scripts/elastic.sh: BERT_NODES, or the -H of HOROVOD_LAUNCH_FLAGS) is
# another machine than this one.
_one_rank_elsewhere() {
  if [ "${BERT_LAUNCHER:-}" = srun ]; then
    [ -n "${BERT_NODES:-}" ] && ! _is_this_machine "${BERT_NODES%%,*}"
  else   # as horovodrun itself decides to use ssh
    [ -n "$(_LAUNCH_FLAGS=${HOROVOD_LAUNCH_FLAGS:-} _first_remote_host)" ]
  fi
}

# One process per GPU under Horovod: horovodrun with Gloo, srun when BERT_LAUNCHER=srun (a
# Slurm allocation, Horovod with Gloo), or mpirun only when Horovod was built with MPI
# (mpirun cannot start a Horovod built without it). Without Horovod (it does not import: a
# plain `pip install`), ONE process trains on the num_gpus GPUs as in-graph towers
# (--num_local_devices, runtime/towers.py), which is enough on one machine; a multi-node
# launch (HOROVOD_LAUNCH_FLAGS, srun) still needs Horovod. A single process for one GPU
# (on another machine, one rank through srun or horovodrun: _one_rank_elsewhere).
# After a signal has been forwarded, a second one is not: kill -9 aborts.
launch() {
  local cmd forwarder=forward_to_child
  local launcher=$BASHPID   # this shell: expanded after `&`, $BASHPID is the child's
  BERT_LAUNCH_ID="${HOSTNAME:-host}-$launcher-$RANDOM$RANDOM"
  case "${BERT_LAUNCHER:-}" in
    ""|ssh|srun) ;;
    *) echo "BERT_LAUNCHER=$BERT_LAUNCHER: use srun (ranks started by srun in a Slurm" \
            "allocation) or ssh (horovodrun)" >&2; exit 1 ;;
  esac
  if [ "$num_gpus" -gt 1 ] || _one_rank_elsewhere; then
    local builds hvd
    builds=" $(horovod_builds) "
    hvd="$(dirname "$PYTHON")/horovodrun"   # the one installed with $PYTHON's Horovod
    [ -x "$hvd" ] || hvd=$(command -v horovodrun || true)
    if [ "${BERT_LAUNCHER:-}" = srun ]; then
      if [[ "$builds" != *" gloo "* ]]; then
        echo "num_gpus=$num_gpus started by srun (BERT_LAUNCHER=srun) needs Horovod for" \
             "TensorFlow with Gloo in $PYTHON: bash scripts/install.sh builds it" >&2; exit 1
      fi
      _srun_command "$@"
      forwarder=forward_to_step
    elif [ -z "${builds// /}" ] && [ -z "${HOROVOD_LAUNCH_FLAGS:-}" ]; then
      echo "num_gpus=$num_gpus without Horovod: one process on $num_gpus GPUs" \
           "(--num_local_devices=$num_gpus, in-graph towers)"
      cmd=("$PYTHON" "$@" --num_local_devices="$num_gpus")
    elif [[ "$builds" == *" gloo "* ]] && [ -x "$hvd" ]; then
      # HOROVOD_LAUNCH_FLAGS replaces the single-node default (scripts/run.sub sets the hosts).
      _LAUNCH_FLAGS=${HOROVOD_LAUNCH_FLAGS:---gloo -H localhost:$num_gpus}
      _horovodrun_settings
      cmd=("$hvd" -np "$num_gpus" $_LAUNCH_FLAGS ${SSH_PORT:+-p "$SSH_PORT"} "${_HVD_FLAGS[@]}"
           "${_HVD_ENV[@]}" "$PYTHON" "$@" --horovod)
      forwarder=forward_to_ranks
    elif [[ "$builds" == *" mpi "* ]] && command -v mpirun >/dev/null 2>&1; then
      cmd=(mpirun -np "$num_gpus" --allow-run-as-root -bind-to none -map-by slot
           -x NCCL_DEBUG -x LD_LIBRARY_PATH -x PATH "$PYTHON" "$@" --horovod)
      forwarder=forward_to_ranks
    elif [[ "$builds" == *" mpi "* ]]; then
      echo "num_gpus=$num_gpus: this Horovod has only MPI and mpirun is not on the PATH:" \
           "install Open MPI, or rebuild Horovod with Gloo (bash scripts/install.sh)" >&2; exit 1
    elif [ -z "${builds// /}" ]; then
      echo "num_gpus=$num_gpus on several nodes (HOROVOD_LAUNCH_FLAGS) needs Horovod for" \
           "TensorFlow in $PYTHON: bash scripts/install.sh builds it" >&2; exit 1
    else
      echo "num_gpus=$num_gpus needs Horovod for TensorFlow with Gloo (horovodrun) in" \
           "$PYTHON: bash scripts/install.sh builds it" >&2; exit 1
    fi
    # Horovod: ranks (or srun) in a session of their own
    [ "$forwarder" = forward_to_child ] || cmd=(setsid -w "${cmd[@]}")
  else
    cmd=("$PYTHON" "$@")
  fi
  catch_preemption
  BERT_LAUNCHER_PID=$launcher BERT_LAUNCH_ID=$BERT_LAUNCH_ID "${cmd[@]}" &
  supervise $! "$forwarder"
}
