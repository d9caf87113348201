"""scripts/elastic.sh's decisions, each on its own (the whole under real Slurm: the killed
task of tests/test_slurm.py): what counts as a failure to go on from, which nodes and ranks a
relaunch keeps, the recipe rescaled to them, and the one-line refusals. `srun` is a stub that
answers for the nodes listed as alive."""
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
PATH={stub}:$PATH RESULTS_DIR={results} BERT_LAUNCHER=srun PREEMPTED_BY=
NODES=({' '.join(nodes)}) GPUS_PER_NODE={per_node} TOTAL_GPUS={len(nodes) * per_node}
PHASE_SCRIPTS=(scripts/run_pretraining_lamb.sh) train_steps_phase1=9
{'BERT_MIN_NODES=' + str(min_nodes) if min_nodes else ''}
source scripts/elastic.sh
elastic_settings
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
    body = ('elastic_should_relaunch 143 0; RECIPE_TOTAL=$TOTAL_GPUS; elastic_relayout; '
            f'elastic_rescale {ARGS}; echo "$BERT_NODES|$GPUS_PER_NODE|$TOTAL_GPUS|${{ARGS[*]}}"')
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


def test_a_global_batch_the_ranks_left_cannot_keep_stops_in_one_line(repo_root, tmp_path):
    proc = relayout(repo_root, tmp_path, nodes=("n1", "n2", "n3", "n4"),
                    alive=("n1", "n3", "n4"))
    assert proc.returncode == 2
    # three nodes, 24 ranks: accumulation 4 x 32 / 24 is not whole
    assert proc.stderr.strip().splitlines() == [
        "run.sub: task 9: Killed on n2; the global batch (accumulation 4 x 32 ranks) cannot be "
        "kept on 24 rank(s): stopping; resubmit the job to resume from the newest checkpoint"]


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
