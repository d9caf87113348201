"""Which network NCCL chose, said by the run itself once NCCL is up.

Why: NCCL picks its transport between nodes at its first collective, by itself, and says so
only in its INFO log, which nobody reads: a node whose rdma-core is missing crosses nodes over
TCP sockets, ten to a hundred times slower than InfiniBand, without a warning
(`runtime.nccl_log` has the story and the parser). So rank 0 of a Horovod run on GPUs with
NCCL keeps NCCL's INIT and NET messages in a file of its output folder (`capture_nccl_log`,
before NCCL starts: NCCL reads its environment when its first communicator is made), and
`NcclTransportHook` reads that file once NCCL has connected and writes one console line:

    NCCL: NCCL 2.16.5; 4 node(s); across nodes NET/IB (InfiniBand on mlx5_0:1, ...); within a node P2P/IPC

and a warning line where it crossed nodes over sockets although this node has active
InfiniBand ports (`runtime.allreduce_bandwidth.ib_ports`), with the cause NCCL logged; NCCL's
own warnings are repeated there too (the file holds them from then on). A user who chose
where NCCL logs (NCCL_DEBUG_FILE, or NCCL_DEBUG=INFO on the console) is left alone.
"""
import glob
import json
import os

import tensorflow as tf
from absl import logging

from reporting.console import SHOW
from runtime import nccl_log
from runtime.allreduce_bandwidth import ib_ports

tf1 = tf.compat.v1

LOG_PATTERN = "nccl.%h.%p.log"   # NCCL puts the host for %h and the process id for %p
CHECK_RUNS = 200                 # runs after which a log without connections is reported


def nccl_built():
    """Whether Horovod here was built with NCCL (False without Horovod)."""
    try:
        import horovod.tensorflow as hvd
        return bool(hvd.nccl_built())
    except Exception:  # noqa: BLE001 - not installed, or built against another TensorFlow
        return False


def capture_nccl_log(output_dir, environ=None):
    """Sends NCCL's INIT and NET INFO lines (and its warnings) to a file in `output_dir`;
    returns the file's glob pattern, or None when the user chose where NCCL logs."""
    environ = os.environ if environ is None else environ
    if environ.get("NCCL_DEBUG_FILE") or environ.get("NCCL_DEBUG", "").upper() in ("INFO",
                                                                                   "TRACE"):
        return None
    os.makedirs(output_dir, exist_ok=True)
    environ["NCCL_DEBUG"] = "INFO"
    environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
    environ["NCCL_DEBUG_FILE"] = os.path.join(output_dir, LOG_PATTERN)
    return os.path.join(output_dir, LOG_PATTERN.replace("%h", "*").replace("%p", "*"))


def report(facts, active_ib_ports=()):
    """(the console line, warning lines) for NCCL's parsed log."""
    found = nccl_log.transports(facts)
    warnings = [f"NCCL warned: {text}" for text in sorted(set(facts.warnings))]
    fallback = nccl_log.socket_fallback(facts, active_ib_ports)
    if fallback:
        warnings.insert(0, fallback)
    return f"NCCL: {found.description}", warnings


class NcclTransportHook(tf1.train.SessionRunHook):
    """Reads rank 0's NCCL log (`pattern`) after each run until it shows the connections NCCL
    made (or CHECK_RUNS runs went by), then logs `report` once and appends a
    `{"event": "nccl", ...}` record to `dllog_path`."""

    def __init__(self, pattern, dllog_path=None, ports=ib_ports):
        self._pattern = pattern
        self._dllog_path = dllog_path
        self._ports = ports
        self._runs = 0
        self.line = None

    def after_run(self, run_context, run_values):
        if self.line is not None:
            return
        self._runs += 1
        files = sorted(glob.glob(self._pattern))
        facts = nccl_log.parse("".join(_read(path) for path in files))
        if not facts.connections and not facts.networks and self._runs < CHECK_RUNS:
            return
        self._report(facts, files)

    def end(self, session):
        if self.line is None and self._runs:
            files = sorted(glob.glob(self._pattern))
            self._report(nccl_log.parse("".join(_read(path) for path in files)), files)

    def _report(self, facts, files):
        active = [port.describe() for port in self._ports() if port.state == "ACTIVE"]
        self.line, warnings = report(facts, active)
        if not files:
            self.line = f"NCCL: no log at {self._pattern} (did this rank use NCCL?)"
        logging.info("%s", self.line, extra=SHOW)
        for warning in warnings:
            logging.warning("%s", warning, extra=SHOW)
        if self._dllog_path:
            found = nccl_log.transports(facts)
            record = {"event": "nccl", "inter_node": found.inter_node, "family": found.family,
                      "intra_node": found.intra_node, "description": self.line,
                      "warnings": warnings, "files": files}
            with open(self._dllog_path, "a", encoding="utf-8") as writer:
                writer.write(json.dumps(record) + "\n")


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as reader:
            return reader.read()
    except OSError:
        return ""
