"""A machine that looks like a GPU node to this project's checks: /dev/nvidia0 exists.

The command runs in a private mount namespace (`unshare -m`) whose /dev is an overlay of the
real one with an empty file nvidia0 added (the real /dev/shm moved back on top, so
shared memory still works); nothing outside the namespace changes, and the mounts vanish
with the process. Needs root and unshare; `unavailable()` says why not where they lack.
"""
import os
import shutil
import subprocess

# $1: a scratch folder; the rest: the command.
_SCRIPT = r"""
set -e
scratch=$1; shift
mount --make-rprivate /
mkdir -p "$scratch/upper" "$scratch/work" "$scratch/shm"
mount --bind /dev/shm "$scratch/shm"
mount -t overlay overlay -o "lowerdir=/dev,upperdir=$scratch/upper,workdir=$scratch/work" /dev
mount --move "$scratch/shm" /dev/shm
: > /dev/nvidia0
exec "$@"
"""


def unavailable():
    """Why a fake GPU node cannot be made here, or None."""
    if os.geteuid() != 0:
        return "faking /dev/nvidia0 needs root (a private mount namespace)"
    if not shutil.which("unshare"):
        return "faking /dev/nvidia0 needs unshare (util-linux)"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    if probe.returncode:
        return f"unshare -m fails here: {probe.stderr.strip()}"
    return None


def command(scratch, args):
    """`args` wrapped to run where /dev/nvidia0 exists (`scratch`: an empty folder)."""
    os.makedirs(scratch, exist_ok=True)
    return ["unshare", "-m", "bash", "-c", _SCRIPT, "fake-gpu", str(scratch)] + list(args)
