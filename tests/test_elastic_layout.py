"""scripts/elastic.sh's decisions, each on its own (the whole under real Slurm: the killed
task of tests/test_slurm.py): what counts as a failure to go on from, which nodes and ranks a
relaunch keeps, the recipe rescaled to them, and the one-line refusals. `srun` is a stub that
answers for the nodes listed as alive."""
import shutil
import subprocess

import pytest

ARGS = "32 8 4 1e-3 5e-4 fp16 true 16 2 1 10 2 4 4 large"   # a recipe for 16 GPUs


def run(repo_root, tmp_path, body, alive=("n1", "n2"), nodes=("n1", "n2"), per_node=8,
        min_nodes=None, log=""):
    """Sources scripts/elastic.sh in a shell set up as run.sub's, runs `body`; the process."""
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "srun").write_text("#!/bin/bash\nfor a in \"$@\"; do case $a in --nodelist=*) "
                               f"node=${{a#--nodelist=}};; esac; done\n"
                               f"case \" {' '.join(alive)} \" in *\" $node \"*) exit 0;; esac\n"
                               "exit 1\n")
    (stub / "srun").chmod(0o755)
    results = tmp_path / "results"
    results.mkdir(exist_ok=True)
    (results / "run.sub.log").write_text(log)   # elastic_settings' ELASTIC_LOG
    script = f"""
set -euo pipefail
fail() {{ echo "run.sub: $*" >&2; exit 2; }}
phase_finished() {{ [ -f "$1/model.ckpt-$2.index" ]; }}
source scripts/launch_common.sh   # as run.sub has it: _launch_flag, _is_this_machine
PATH={stub}:$PATH RESULTS_DIR={results} BERT_LAUNCHER=srun PREEMPTED_BY=
NODES=({' '.join(nodes)}) GPUS_PER_NODE={per_node} TOTAL_GPUS={len(nodes) * per_node}
PHASE_SCRIPTS=(scripts/run_pretraining_lamb.sh) train_steps_phase1=9
{'BERT_MIN_NODES=' + str(min_nodes) if min_nodes else ''}
source scripts/elastic.sh
elastic_settings run.sub run.sub.log
{body}
"""
    return subprocess.run(["bash", "-c", script], cwd=repo_root, capture_output=True,
                          text=True, timeout=60)


KILLED = ("0: step 3/9 loss 7.1\nsrun: error: n2: task 9: Killed\n"
          "srun: error: n1: task 0: Terminated\n")


def test_a_task_killed_after_training_began_is_gone_on_from(repo_root, tmp_path):
    proc = run(repo_root, tmp_path, 'elastic_should_relaunch 143 0 && echo "$ELASTIC_FAILED|'
               '$ELASTIC_FAILED_NODE|$ELASTIC_LOST"', log=KILLED)
    assert proc.stdout.strip() == ("task 9: Killed on n2|n2|phase_1 had no checkpoint yet: it "
                                   "starts again (steps 1-3 are done again)"), proc.stderr


def test_the_checkpoint_is_read_once_rank_0_has_let_go_of_the_folder(repo_root, tmp_path):
    """The launcher returned while rank 0 (holding the folder's run lock) still saves its last
    completed step: that save is the checkpoint the message names."""
    if shutil.which("flock") is None:
        pytest.skip("no flock (util-linux) on this machine: the launcher does not wait without it")
    body = """
phase=$RESULTS_DIR/phase_1; mkdir -p "$phase"; touch "$phase/model.ckpt-2.index"
echo 'model_checkpoint_path: "model.ckpt-2"' > "$phase/checkpoint"
( exec 9>"$phase/.run.lock"; flock 9; touch "$phase/held"; sleep 2
  touch "$phase/model.ckpt-3.index"; echo 'model_checkpoint_path: "model.ckpt-3"' > "$phase/checkpoint" ) &
while [ ! -e "$phase/held" ]; do sleep 0.05; done
elastic_should_relaunch 143 0 && echo "$ELASTIC_LOST"
"""
    proc = run(repo_root, tmp_path, body, log=KILLED)
    assert proc.stdout.strip().startswith(
        "phase_1 goes on from its checkpoint of step 3: only the window in progress is done "
        "again ("), proc.stdout + proc.stderr


@pytest.mark.parametrize("log, why", [
    ("srun: error: n1: tasks 0-15: Exited with exit code 1\n", "nothing trained"),
    ("0: step 3/9\n", "no task failed"),
])
def test_a_failure_before_training_or_without_a_failed_task_ends_the_job(repo_root, tmp_path,
                                                                         log, why):
    proc = run(repo_root, tmp_path, "elastic_should_relaunch 1 0 || echo ends", log=log)
    assert proc.stdout.strip() == "ends", why


def test_a_preemption_ends_the_job_as_before(repo_root, tmp_path):
    proc = run(repo_root, tmp_path, "PREEMPTED_BY=TERM; elastic_should_relaunch 143 0 || echo ends",
               log=KILLED)
    assert proc.stdout.strip() == "ends"


def test_only_the_attempts_own_output_counts(repo_root, tmp_path):
    """The log holds every attempt: a failure of attempt 1 is not attempt 2's."""
    proc = run(repo_root, tmp_path, f'elastic_should_relaunch 1 {len(KILLED)} || echo ends',
               log=KILLED + "0: step 5/9\n")
    assert proc.stdout.strip() == "ends"


def relayout(repo_root, tmp_path, **kwargs):
    body = (f'elastic_should_relaunch 143 0; RECIPE_TOTAL=$TOTAL_GPUS RECIPE_ARGS=({ARGS}); '
            f'elastic_relayout; elastic_rescale {ARGS}; echo "$BERT_NODES|$GPUS_PER_NODE|$TOTAL_GPUS|${{ARGS[*]}}"')
    return run(repo_root, tmp_path, body, log=KILLED, **kwargs)


def test_a_failed_node_of_several_is_left_out_and_the_global_batch_kept(repo_root, tmp_path):
    proc = relayout(repo_root, tmp_path, nodes=("n1", "n2"), alive=("n1", "n2"))
    assert proc.returncode == 0, proc.stderr
    nodes, per_node, total, args = proc.stdout.strip().split("|")
    assert (nodes, per_node, total) == ("n1", "8", "8")
    args = args.split()
    # 16 -> 8 ranks: accumulation x2, learning rate per GPU x2, num_gpus 8
    assert args[12:14] == ["8", "8"] and args[7] == "8"
    assert [float(a) for a in args[3:5]] == [2e-3, 1e-3]


def test_nodes_that_do_not_answer_are_left_out(repo_root, tmp_path):
    proc = relayout(repo_root, tmp_path, nodes=("n1", "n2", "n3", "n4"), alive=("n1", "n2"))
    assert proc.returncode == 0, proc.stderr
    nodes, per_node, total, args = proc.stdout.strip().split("|")
    assert (nodes, per_node, total) == ("n1", "8", "8")   # n3, n4 silent; n2 had the failure
    assert args.split()[12:14] == ["16", "16"]            # 4 x 32 ranks / 8


def test_ranks_over_which_the_global_batch_cannot_split_are_left_idle(repo_root, tmp_path):
    """Three nodes of 8 left of a 32-rank job: 24 ranks cannot split accumulation 4 x 32
    ranks; 16 ranks (two of the nodes) can."""
    proc = relayout(repo_root, tmp_path, nodes=("n1", "n2", "n3", "n4"),
                    alive=("n1", "n3", "n4"))
    assert proc.returncode == 0, proc.stderr
    nodes, per_node, total, args = proc.stdout.strip().split("|")
    assert (nodes, per_node, total) == ("n1,n3", "8", "16")
    assert args.split()[12:14] == ["8", "8"]


def test_one_rank_lost_of_eight_on_one_machine_goes_on_with_four(repo_root, tmp_path):
    proc = relayout(repo_root, tmp_path, nodes=("n2",), alive=("n2",), per_node=8)
    assert proc.returncode == 0, proc.stderr
    nodes, per_node, total, args = proc.stdout.strip().split("|")
    # 7 cannot split accumulation 4 x 8 ranks; 4 can (accumulation 8)
    assert (nodes, per_node, total) == ("n2", "4", "4")
    assert args.split()[12:14] == ["8", "8"]


def test_on_one_node_the_failed_rank_is_left_out(repo_root, tmp_path):
    proc = relayout(repo_root, tmp_path, nodes=("n2",), alive=("n2",), per_node=2)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().split("|")[:3] == ["n2", "1", "1"]


def test_fewer_nodes_than_the_minimum_stop_in_one_line(repo_root, tmp_path):
    proc = relayout(repo_root, tmp_path, nodes=("n1", "n2", "n3"), alive=("n1",), min_nodes=2)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "run.sub: task 9: Killed on n2; 1 node(s) still answer (n1), fewer than BERT_MIN_NODES=2: "
        "stopping; resubmit the job to resume from the newest checkpoint"]


def test_the_minimum_keeps_the_failed_node_with_one_rank_fewer_on_each(repo_root, tmp_path):
    proc = relayout(repo_root, tmp_path, nodes=("n1", "n2"), alive=("n1", "n2"), min_nodes=2,
                    per_node=2)
    assert proc.returncode == 0, proc.stderr
    nodes, per_node, total, args = proc.stdout.strip().split("|")
    assert (nodes, per_node, total) == ("n1,n2", "1", "2")
    assert args.split()[12:14] == ["8", "8"]


@pytest.mark.parametrize("name, value", [("BERT_MAX_RESTARTS", "-1"), ("BERT_MIN_NODES", "0")])
def test_bad_settings_are_one_line(repo_root, tmp_path, name, value):
    proc = subprocess.run(["bash", "-c", f'fail() {{ echo "run.sub: $*" >&2; exit 2; }}; '
                           f'RESULTS_DIR={tmp_path} {name}={value}; source scripts/elastic.sh; '
                           'elastic_settings'], cwd=repo_root, capture_output=True, text=True)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith(f"run.sub: {name}={value}: must be")


# ---- horovodrun's ranks (BERT_LAUNCHER=ssh, and run_pretraining_lamb.sh outside Slurm) ----

HOROVODRUN_KILLED = ("[0]<stderr>:step 3/9  loss 7.1\n[2]<stderr>:step 3/9  loss 7.1\n"
                     "Process 3 exit with status code 137.\n"
                     "Terminating remaining workers after failure of Process 3.\n"
                     "Process 0 exit with status code 1.\n")


def test_horovodruns_failed_rank_is_named_with_its_host(repo_root, tmp_path):
    body = ('BERT_LAUNCHER=ssh; elastic_should_relaunch 1 0 && echo "$ELASTIC_FAILED|'
            '$ELASTIC_FAILED_NODE"')
    proc = run(repo_root, tmp_path, body, per_node=2, log=HOROVODRUN_KILLED)
    assert proc.stdout.strip() == "rank 3: killed by SIGKILL on n2|n2", proc.stderr


def test_horovodruns_hosts_are_rewritten_without_the_failed_one(repo_root, tmp_path):
    """ssh is a stub that answers for every host: n2 is left out because its rank failed."""
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "ssh").write_text("#!/bin/sh\nexit 0\n")
    (stub / "ssh").chmod(0o755)
    body = ('BERT_LAUNCHER=ssh HOROVOD_LAUNCH_FLAGS="--gloo -H n1:2,n2:2 --network-interface lo";'
            ' elastic_should_relaunch 1 0; RECIPE_TOTAL=$TOTAL_GPUS; '
            f'RECIPE_ARGS=({ARGS.replace(" 16 ", " 4 ")}); elastic_relayout; '
            f'elastic_rescale {ARGS.replace(" 16 ", " 4 ")}; '
            'echo "$HOROVOD_LAUNCH_FLAGS|$TOTAL_GPUS|${ARGS[7]}|${ARGS[12]}"')
    proc = run(repo_root, tmp_path, body, per_node=2, log=HOROVODRUN_KILLED)
    assert proc.stdout.strip() == "--gloo -H n1:2 --network-interface lo|2|2|8", proc.stderr


@pytest.mark.parametrize("flags, expected", [
    ("--gloo -H a:2,b:2", "a b|2|4"),
    ("--gloo --hosts=a:4", "a|4|4"),
    ("", "localhost|4|4"),                          # one machine: horovodrun -H localhost:4
    ("--gloo -H a:2,b:1", "refused"),               # slots that differ between hosts
    ("--gloo -hostfile hosts.txt", "refused"),
])
def test_the_layout_outside_slurm_comes_from_horovodruns_hosts(repo_root, tmp_path, flags,
                                                               expected):
    body = (f'HOROVOD_LAUNCH_FLAGS="{flags}"; if elastic_layout_from_flags 4; then '
            'echo "${NODES[*]}|$GPUS_PER_NODE|$TOTAL_GPUS"; else echo refused; fi')
    proc = run(repo_root, tmp_path, body)
    assert proc.stdout.strip() == expected, proc.stderr


@pytest.mark.parametrize("log, relaunch", [
    # rank 1's own one-line error (a full disk): the relaunch would stop the same way
    ("0: step 3/9\n1: error: /r/phase_1: no space left on the device (...)\n"
     "srun: error: n2: task 1: Exited with exit code 1\n", False),
    # rank 0 only saw rank 1 die: rank 1 (killed) failed first, and had no error line
    ("0: step 3/9\n0: error: /r/phase_1: this rank stopped because another rank failed "
     "(that rank's error line says why)\nsrun: error: n2: task 1: Killed\n", True),
    ("[0]<stderr>:step 3/9\n[1]<stderr>:error: /r/phase_1: bad record in f.tfrecord\n"
     "Process 1 exit with status code 1.\n", False),
])
def test_a_ranks_own_error_ends_the_job_a_lost_rank_does_not(repo_root, tmp_path, log,
                                                             relaunch):
    launcher = "ssh" if log.startswith("[") else "srun"
    proc = run(repo_root, tmp_path, f"BERT_LAUNCHER={launcher}; elastic_should_relaunch 1 0 "
               "&& echo relaunch || echo ends", log=log)
    assert proc.stdout.strip() == ("relaunch" if relaunch else "ends"), proc.stderr
