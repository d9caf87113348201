"""Test helpers for the fault suite: kill -9 at seeded moments, then compare with a run that
was never interrupted.

The machine running the tests is shared and slow at times, so a kill never waits for a
wall-clock delay: it fires when the program has made observable progress (a checkpoint or
output file exists, a temporary reached a byte count, a child process has the input open),
and which progress point is drawn by an RNG seeded with BERT_FAULT_SEED (default fixed; set it
to explore other moments) and the test's name, so a failure can be replayed exactly.
"""
import hashlib
import os
import shutil
import subprocess
import time
import zlib

import numpy as np
import psutil

FAULT_SEED = int(os.environ.get("BERT_FAULT_SEED", "10"))


def seeded_moments(test_name, candidates, count=3):
    """`count` distinct `candidates`, in their order, drawn by (FAULT_SEED, test_name)."""
    rng = np.random.default_rng([FAULT_SEED, zlib.crc32(test_name.encode())])
    picked = sorted(rng.choice(len(candidates), size=count, replace=False).tolist())
    return [candidates[index] for index in picked]


def kill_tree(process):
    """SIGKILL to every descendant of `process` (first: Horovod's launcher would otherwise
    signal its ranks), then to `process`; reaps it."""
    try:
        descendants = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    for child in descendants:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    process.kill()
    process.wait()


def kill_when(args, ready, log, cwd=None, env=None, timeout=300):
    """Runs `args` (stdout and stderr unbuffered into `log`) until `ready()` is true, then
    kill -9s its whole process tree. Fails if the run ends first. Returns the log's text."""
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    with open(log, "w") as output:
        process = subprocess.Popen(args, cwd=cwd, env=env, stdout=output,
                                   stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + timeout
            while not ready():
                assert process.poll() is None, f"run ended before the kill: {log}"
                assert time.time() < deadline, f"no kill moment within {timeout} s: {log}"
                time.sleep(0.02)
        finally:
            kill_tree(process)
    return log.read_text()


def _session(sid):
    """The live (not zombie) processes of session `sid`, its leader excepted."""
    members = []
    for process in psutil.process_iter():
        try:
            if process.pid != sid and os.getsid(process.pid) == sid \
                    and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process)
        except (OSError, psutil.Error):  # ended meanwhile
            pass
    return members


def kill_parent_and_check_descendants_die(args, ready=lambda descendants: len(descendants) >= 2,
                                          **popen_options):
    """Starts `args` in a session of its own, waits until `ready(its descendants)`, kills it
    alone with SIGKILL (no chance to stop anything) and asserts that no other process of its
    session (whatever it started, before or after the check) is left within 5 seconds."""
    parent = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, **popen_options)
    try:
        deadline = time.time() + 120
        descendants = []
        while not ready(descendants):
            assert parent.poll() is None and time.time() < deadline, "no descendants started"
            try:
                descendants = psutil.Process(parent.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                descendants = []
            time.sleep(0.01)
        parent.kill()
        parent.wait()
        deadline = time.time() + 5
        while _session(parent.pid) and time.time() < deadline:
            time.sleep(0.05)
        alive = [(p.pid, " ".join(p.cmdline()[:4])) for p in _session(parent.pid)]
        assert not alive, f"still running after their parent was killed: {alive}"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for process in _session(parent.pid):
            process.kill()


def file_digests(folder):
    """{path relative to `folder`: sha256} of every file below `folder`."""
    digests = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                digests[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return digests


def checkpoint_steps(folder):
    """The steps of the model checkpoints in `folder`, ascending."""
    return sorted(int(path.name.split("-")[1].split(".")[0])
                  for path in folder.glob("model.ckpt-*.index"))


def latest_checkpoint_step(folder):
    return (checkpoint_steps(folder) or [-1])[-1]


def resumed_micro_step(folder):
    """The micro_step a run started now would resume from (0: none); a kill can fall between
    a checkpoint's files and the `checkpoint` state naming it, so this may be an older one."""
    import tensorflow as tf
    latest = tf.train.latest_checkpoint(str(folder))
    return int(tf.train.load_checkpoint(latest).get_tensor("micro_step")) if latest else 0


def train_killed_at_checkpoints(args, folder, moments, final_step, logs, cwd=None,
                                ranks=(0,), drop_input_states_before=None):
    """Trains with `args` (output folder `folder`) through one kill -9 per moment, then to
    `final_step`. A moment is a checkpoint step: the run is killed once a checkpoint at or
    after it, and after the one it resumed from, exists (the kill lands at or shortly after
    it, often inside an accumulation window). The input states are deleted before run
    number `drop_input_states_before` (as if killed between the two writes), which must then
    skip records instead. Asserts that every run resuming from a checkpoint past micro_step 0
    positioned each rank's input."""
    runs = []
    for index, moment in enumerate(moments):
        if index == drop_input_states_before:
            shutil.rmtree(folder / "input_state")
        target = max(moment, latest_checkpoint_step(folder) + 1)
        resumed = resumed_micro_step(folder)
        log = kill_when(args, lambda: latest_checkpoint_step(folder) >= target,
                        logs / f"killed-at-{moment}.log", cwd)
        runs.append((resumed, log))
    assert latest_checkpoint_step(folder) < final_step, \
        f"killed too late to test resuming (moments {moments})"
    resumed = resumed_micro_step(folder)
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    runs.append((resumed, result.stdout + result.stderr))
    for index, (resumed, log) in enumerate(runs):
        if resumed == 0:
            continue  # a fresh start (or from the step-0 checkpoint): nothing consumed
        for rank in ranks:
            restored = f"rank {rank} resumes its input from" in log
            # no state: dropped, or the kill fell between a rank's state and the checkpoint
            skipped = (f"rank {rank}: no input state for micro_step" in log
                       and "(exact, but slower)" in log)
            assert skipped if index == drop_input_states_before else restored or skipped, \
                f"run {index} (moments {moments}):\n{log[-3000:]}"


def assert_same_weights(reference, got):
    """Every variable of checkpoint `got` equals `reference`'s, bit for bit."""
    from test_pretraining import checkpoint_tensors
    expected, actual = checkpoint_tensors(str(reference)), checkpoint_tensors(str(got))
    assert expected.keys() == actual.keys()
    for name, value in expected.items():
        np.testing.assert_array_equal(actual[name], value, err_msg=name)


def trainer_pid(rank, results):
    """The pid of the trainer of Horovod rank `rank` writing under `results` (HOROVOD_RANK
    in its environment: horovodrun sets it, runtime/slurm_launch.py's srun task too)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as reader:
                command = reader.read().split(b"\0")
            with open(f"/proc/{name}/environ", "rb") as reader:
                environ = reader.read().split(b"\0")
        except OSError:
            continue
        # the Python process itself, not a shell or an ssh client whose command line holds it
        if (os.path.basename(command[0]).startswith(b"python")
                and any(part.endswith(b"run_pretraining.py") for part in command)
                and any(str(results).encode() in part for part in command)
                and f"HOROVOD_RANK={rank}".encode() in environ):
            return int(name)
    return None
