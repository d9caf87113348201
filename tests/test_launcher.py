"""scripts/launch_common.sh `launch` with stand-in programs (no TensorFlow, a few seconds):
which launcher it picks for the Horovod build at hand (none: one process on every GPU with
--num_local_devices), and that SIGTERM reaches the ranks but not horovodrun."""
import os
import signal
import subprocess
import time

import pytest

# Stands in for $PYTHON: `-c ...` is launch's Horovod build query (STUB_BUILDS answers it; unset,
# Horovod does not import); anything else is a trainer that exits 0 once it gets SIGTERM.
PYTHON = """#!/usr/bin/env bash
if [ "$1" = -c ]; then [ -n "${STUB_BUILDS+x}" ] || exit 1; echo "$STUB_BUILDS"; exit 0; fi
trap 'echo "rank ${HOROVOD_RANK:-none} got TERM"; exit 0' TERM
echo "rank ${HOROVOD_RANK:-none} started: $*"
while :; do sleep 0.1; done
"""
# Stands in for horovodrun: starts two ranks; if it gets SIGTERM itself it kills them, as the
# real one does 5 s after its own SIGTERM.
HOROVODRUN = """#!/usr/bin/env bash
echo "horovodrun $*"
while [ "$1" != env ] && [ ! -x "$1" ]; do shift; done   # its flags, up to the command
HOROVOD_RANK=0 "$@" & HOROVOD_RANK=1 "$@" &
trap 'echo "horovodrun got TERM"; kill -9 $(jobs -p); exit 1' TERM INT
wait
"""
MPIRUN = """#!/usr/bin/env bash
echo "mpirun $*"
"""


def write_script(path, text):
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def stubs(tmp_path):
    venv, other = tmp_path / "venv" / "bin", tmp_path / "other"
    venv.mkdir(parents=True)
    other.mkdir()
    python = write_script(venv / "python", PYTHON)
    write_script(venv / "horovodrun", HOROVODRUN)
    write_script(other / "mpirun", MPIRUN)
    base = dict(os.environ, PYTHON=python, PATH="/usr/bin:/bin")
    base.pop("STUB_BUILDS", None)
    return {"python": python, "venv": venv, "other": other, "env": base}


def launch(repo_root, env, num_gpus):
    script = f'set -euo pipefail; num_gpus={num_gpus}; source scripts/launch_common.sh; ' \
             'launch trainer.py --flag'
    return subprocess.Popen(["bash", "-c", script], cwd=repo_root, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def wait_for_lines(process, count, timeout=30):
    """Reads stdout until `count` lines have come (the ranks have started)."""
    lines, deadline = [], time.time() + timeout
    while len(lines) < count:
        assert time.time() < deadline and process.poll() is None, lines
        lines.append(process.stdout.readline())
    return lines


def terminate_after(process, count):
    """SIGTERM to the launcher once `count` lines have come; (those lines, the rest of stdout,
    stderr, exit code). What is left of its process group is killed if the test fails half-way."""
    try:
        first = wait_for_lines(process, count)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return first, out, err, process.returncode


def test_sigterm_reaches_the_ranks_not_horovodrun(stubs, repo_root):
    env = dict(stubs["env"], STUB_BUILDS="gloo ")
    first, out, err, code = terminate_after(launch(repo_root, env, 2), 3)
    words = first[0].split()
    assert words[:8] == ["horovodrun", "-np", "2", "--gloo", "-H", "localhost:2",
                         "--gloo-timeout-seconds", "600"]
    assert words[8] == "env" and words[-4:] == [stubs["python"], "trainer.py", "--flag",
                                                "--horovod"]
    assert "rank 0 got TERM" in out and "rank 1 got TERM" in out
    assert "horovodrun got TERM" not in out
    assert code == 128 + signal.SIGTERM
    assert "preempted by SIGTERM" in err


def test_single_process_gets_the_signal_too(stubs, repo_root):
    _, out, _, code = terminate_after(launch(repo_root, stubs["env"], 1), 1)
    assert "rank none got TERM" in out
    assert code == 128 + signal.SIGTERM


def test_mpirun_only_when_horovod_has_mpi(stubs, repo_root):
    os.remove(stubs["venv"] / "horovodrun")
    env = dict(stubs["env"], STUB_BUILDS=" mpi", PATH=f"{stubs['other']}:/usr/bin:/bin")
    out, err = launch(repo_root, env, 2).communicate(timeout=30)
    assert out.startswith("mpirun -np 2 "), err
    assert out.rstrip().endswith(f"{stubs['python']} trainer.py --flag --horovod")


def test_without_horovod_one_process_trains_on_every_gpu(stubs, repo_root):
    """Horovod does not import (a plain pip install): one process with --num_local_devices,
    announced in one line, and it gets the signal."""
    env = dict(stubs["env"], PATH=f"{stubs['other']}:/usr/bin:/bin")  # mpirun there, unused
    first, out, err, code = terminate_after(launch(repo_root, env, 2), 2)
    assert first == ["num_gpus=2 without Horovod: one process on 2 GPUs (--num_local_devices=2, "
                     "in-graph towers)\n",
                     "rank none started: trainer.py --flag --num_local_devices=2\n"]
    assert "rank none got TERM" in out and "mpirun" not in out + err
    assert code == 128 + signal.SIGTERM


def system_path_without(folder, names):
    """A PATH holding what /usr/bin and /bin hold but `names` (links in `folder`): the
    machine's tools without, e.g., an mpirun that this machine may have installed."""
    folder.mkdir(exist_ok=True)
    for system in ("/usr/bin", "/bin"):
        for name in os.listdir(system):
            link = folder / name
            if name not in names and not os.path.lexists(link):
                os.symlink(os.path.join(system, name), link)
    return str(folder)


@pytest.mark.parametrize("builds, horovodrun, extra, message", [
    ("gloo ", False, {},
     "num_gpus=2 needs Horovod for TensorFlow with Gloo (horovodrun) in {python}: "
     "bash scripts/install.sh builds it"),
    (" mpi", True, {},
     "num_gpus=2: this Horovod has only MPI and mpirun is not on the PATH: install "
     "Open MPI, or rebuild Horovod with Gloo (bash scripts/install.sh)"),
    (None, True, {"HOROVOD_LAUNCH_FLAGS": "-H node1:1,node2:1"},
     "num_gpus=2 on several nodes (HOROVOD_LAUNCH_FLAGS) needs Horovod for TensorFlow in "
     "{python}: bash scripts/install.sh builds it"),
], ids=["gloo_without_horovodrun", "mpi_without_mpirun", "several_nodes_without_horovod"])
def test_no_usable_launcher_is_a_one_line_error(stubs, repo_root, builds, horovodrun, extra,
                                                message, tmp_path):
    path = system_path_without(tmp_path / "bin", {"mpirun", "mpiexec", "orterun"})
    env = dict(stubs["env"], PATH=path, **extra)
    if builds is not None:
        env["STUB_BUILDS"] = builds
    if not horovodrun:
        os.remove(stubs["venv"] / "horovodrun")
    process = launch(repo_root, env, 2)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 1
    assert err.splitlines() == [message.format(python=stubs["python"])]
    assert "started" not in out
