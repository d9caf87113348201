"""A Horovod run on GPUs says which network NCCL chose, once NCCL is up: rank 0's NCCL INFO
lines go to a file of its output folder and a hook reads them (`training/nccl_transport.py`).
No GPU here: the hook reads real recorded NCCL logs (tests/data/nccl) copied to where NCCL
would write, and this node's InfiniBand ports come from a faked sysfs."""
import json
import os
import shutil
import types

from runtime.allreduce_bandwidth import IbPort, parse_ib_rate
from training import nccl_transport

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "nccl")


def test_ncclss_lines_go_to_a_file_unless_the_user_chose_where(tmp_path):
    environ = {"NCCL_DEBUG": "WARN"}  # run.sub's default
    pattern = nccl_transport.capture_nccl_log(str(tmp_path), environ)
    assert environ == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
                       "NCCL_DEBUG_FILE": str(tmp_path / "nccl.%h.%p.log")}
    assert pattern == str(tmp_path / "nccl.*.*.log")
    for chosen in ({"NCCL_DEBUG_FILE": "/x/%h.log"}, {"NCCL_DEBUG": "INFO"},
                   {"NCCL_DEBUG": "trace"}):
        kept = dict(chosen)
        assert nccl_transport.capture_nccl_log(str(tmp_path), kept) is None and kept == chosen


def _hook(tmp_path, log, ports=()):
    folder = tmp_path / "out"
    folder.mkdir(exist_ok=True)
    pattern = nccl_transport.capture_nccl_log(str(folder), {})
    if log:
        shutil.copy(os.path.join(DATA, log), folder / "nccl.node1.4242.log")
    dllog = tmp_path / "dllog.jsonl"
    return nccl_transport.NcclTransportHook(pattern, str(dllog), lambda: list(ports)), dllog


def _runs(hook, count):
    for _ in range(count):
        hook.after_run(None, types.SimpleNamespace(results={}))


def test_infiniband_across_nodes_is_said_once(tmp_path, caplog):
    hook, dllog = _hook(tmp_path, "ibext_3node_nccl2.22.3.log")
    caplog.set_level("INFO")
    _runs(hook, 3)
    lines = [record.getMessage() for record in caplog.records if record.getMessage()
             .startswith("NCCL: ")]
    assert len(lines) == 1 and "across nodes NET/IBext_v8 (InfiniBand" in lines[0], lines
    records = [json.loads(line) for line in dllog.read_text().splitlines()]
    assert records[0]["event"] == "nccl" and records[0]["family"] == "InfiniBand"


def test_a_socket_fallback_on_a_node_with_active_infiniband_is_a_warning(tmp_path, caplog):
    port = IbPort("mlx5_0", 1, "ACTIVE", "InfiniBand", parse_ib_rate("200 Gb/sec (4X HDR)"))
    hook, _ = _hook(tmp_path, "socket_fallback_libibverbs_2node_nccl2.18.3.log", [port])
    _runs(hook, 1)
    warnings = [record.getMessage() for record in caplog.records
                if record.levelname == "WARNING"]
    assert warnings and warnings[0].startswith(
        "NCCL crossed nodes over TCP sockets (NET/Socket) although InfiniBand is there "
        "(mlx5_0 port 1: 200 Gb/sec (4X HDR), InfiniBand, ACTIVE): libibverbs could not be "
        "loaded"), warnings
    assert "across nodes NET/Socket (TCP sockets over ens4)" in hook.line


def test_the_hook_waits_for_nccl_to_connect_and_reports_a_missing_log_at_the_end(tmp_path):
    hook, dllog = _hook(tmp_path, None)
    _runs(hook, 5)
    assert hook.line is None and not dllog.exists()  # NCCL not up yet: nothing said
    hook.end(None)
    assert hook.line.startswith("NCCL: no log at ") and hook.line.endswith(
        "(did this rank use NCCL?)")
