"""Another Python program run as a child process whose whole process tree dies with us.

``bertPrep.py --action text_formatting`` runs wikiextractor as a child (a command-line
program whose output is streamed through a pipe), and wikiextractor forks a reducer and one
extractor per ``--processes``. Killed with SIGKILL, bertPrep used to leave that tree running:
re-parented to init, wikiextractor went on loading the dump's templates (most of an hour on a
full English dump) before its first write found the reader gone, and its children then waited
on queues nobody would drain. ``data_prep.processes.worker_lifetime`` covers our own pools; this
module covers a program we do not control, and every process that program forks::

    subprocess.Popen(tethered_command("wikiextractor.WikiExtractor", [dump, "--json", ...]),
                     env=tethered_env())

The child first asks the kernel for SIGKILL when we die (``die_with_parent``, which also
exits at once if we died before the request), then registers an at-fork hook so that each
process it forks (multiprocessing's "fork" start method goes through ``os.fork``) makes the
same request against its own parent, then runs the program's module as ``__main__`` in the
same interpreter. A kill of the parent thus takes the tree down level by level; so does our
own ``proc.kill()`` of the child after an error. Not covered: helpers started by fork+exec
outside ``os.fork`` (multiprocessing's resource tracker), which end by themselves once the
processes holding their pipe are gone. As for pools, the kernel signals when the *thread* that
started the child ends: start it from the thread that reads its output.
"""
import os
import runpy
import sys

from data_prep.processes.worker_lifetime import die_with_parent

# The package root, put on the child's PYTHONPATH so that ``-m data_prep.processes.tethered_child``
# resolves wherever bertPrep.py was started from.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_forker = {"pid": None}


def tethered_command(module, args):
    """The argv that runs ``python -m module args`` as a child tethered to this process."""
    return [sys.executable, "-m", __name__, str(os.getpid()), module, *map(str, args)]


def tethered_env(base=None):
    """``base`` (default: os.environ) with this package importable by the child."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
    return env


def _remember_forker():
    _forker["pid"] = os.getpid()


def _die_with_forker():
    die_with_parent(_forker["pid"])


def main(argv):
    """``argv``: [this module, parent pid, module to run, its arguments...]."""
    parent_pid, module, args = int(argv[1]), argv[2], argv[3:]
    die_with_parent(parent_pid)
    os.register_at_fork(before=_remember_forker, after_in_child=_die_with_forker)
    sys.argv = [module] + list(args)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv)
