"""runtime/nccl_log.py on real NCCL INFO logs users posted (tests/data/nccl, README there names
each one's source and NCCL version): which transport crossed nodes, which stayed within a node,
and the socket fallback where InfiniBand is there. No TensorFlow, milliseconds."""
import os

import pytest

from reporting.errors import UsageError
from runtime import nccl_log
from runtime.nccl_log import IbDevice, parse, parse_file, socket_fallback, transports

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "nccl")
HDR_PORT = "mlx5_0 port 1: 200 Gb/sec (4X HDR), InfiniBand, ACTIVE"


def load(name):
    return parse_file(os.path.join(DATA, name))


def test_every_recorded_log_is_named_in_the_readme():
    readme = open(os.path.join(DATA, "README.md"), encoding="utf-8").read()
    logs = sorted(name for name in os.listdir(DATA) if name.endswith(".log"))
    assert len(logs) >= 3
    assert [name for name in logs if f"`{name}`" not in readme] == []


def test_infiniband_between_two_nodes_nccl_2_4_under_horovod():
    facts = load("ib_2node_horovod_nccl2.4.7.log")
    assert facts.versions == {"2.4.7+cuda10.0"}
    assert facts.hosts == {"master_node", "secondary_node"}
    assert facts.ib_devices == {IbDevice("mlx5_0", 1, "IB")}
    # NCCL 2.4 logs its socket interfaces too and prints no "Using network" line: the
    # transport is read from the connections, not from those lines.
    assert facts.socket_interfaces == {("ib0", "192.168.11.1"), ("ib0", "192.168.11.2")}
    assert facts.networks == {}
    found = transports(facts)
    assert (found.inter_node, found.family, found.intra_node) == ("NET/IB", "InfiniBand",
                                                                  "P2P/IPC")
    crossing = [c for c in facts.connections if c.crosses_nodes]
    assert {(c.src, c.dst, c.direction) for c in crossing} == {
        (6, 2, "receive"), (6, 2, "send"), (2, 6, "receive"), (3, 6, "send")}
    assert socket_fallback(facts, [HDR_PORT]) is None


def test_roce_under_horovod_with_mpiruns_output_prefix():
    facts = load("roce_2node_horovod_nccl2.8.4.log")
    assert facts.versions == {"2.8.4+cuda11.2"}          # "[1,0]<stdout>:NCCL version ..."
    assert facts.hosts == {"j66d10267", "j63g01247"}     # the [1,N]<stdout>: prefix is not
    assert facts.ib_devices == {IbDevice("mlx5_bond_0", 1, "RoCE")}
    assert facts.networks == {"IB": {"j66d10267"}}
    found = transports(facts)
    assert (found.inter_node, found.family) == ("NET/IB", "RoCE")
    assert "chosen network, no connection in the log" in found.description


def test_infiniband_through_the_hpcx_plugin_on_three_nodes():
    facts = load("ibext_3node_nccl2.22.3.log")
    assert (facts.nodes, facts.ranks) == (3, 24)
    assert facts.hosts == {"h100clust-worker-1"}         # after the "[0] " prefix
    assert facts.nvlink                                   # NVLS multicast is available
    # "Channel 00/16 :    0   7   6 ..." lists a ring's order: not a connection
    assert len(facts.connections) == 12
    assert all(c.gpudirect and c.network == "IBext_v8" for c in facts.connections)
    found = transports(facts)
    assert (found.inter_node, found.family) == ("NET/IBext_v8", "InfiniBand")
    assert "GPUDirect RDMA" in found.description and "3 node(s)" in found.description


def test_socket_fallback_without_libibverbs_across_two_nodes():
    """NCCL 2.18 (as 2.11 to 2.16: the pip NCCL of TensorFlow 2.15) says only INFO."""
    facts = load("socket_fallback_libibverbs_2node_nccl2.18.3.log")
    assert facts.versions == {"2.18.3+cuda12.2"}
    assert facts.ibverbs_missing
    assert len(facts.warnings) == 1 and "libcuda.so" in facts.warnings[0]   # none of IB
    assert facts.networks == {"Socket": {"ubuntu"}}
    assert facts.socket_interfaces == {("ens4", "10.0.0.1"), ("ens4", "10.0.0.2")}
    # Both nodes are named "ubuntu": what crossed nodes is known from the NET transport.
    assert facts.hosts == {"ubuntu"}
    found = transports(facts)
    assert (found.inter_node, found.family, found.intra_node) == ("NET/Socket", "TCP sockets",
                                                                  "SHM")
    assert "libibverbs could not be loaded" in found.description
    # Nothing in this log shows InfiniBand; with this node's port given, the one line:
    assert socket_fallback(facts) is None
    line = socket_fallback(facts, [HDR_PORT])
    assert line.startswith("NCCL crossed nodes over TCP sockets (NET/Socket) although "
                           "InfiniBand is there (mlx5_0 port 1: 200 Gb/sec (4X HDR)")
    assert "libibverbs could not be loaded" in line and "\n" not in line


def test_libibverbs_missing_was_a_warning_up_to_nccl_2_10():
    facts = load("libibverbs_missing_warn_nccl2.10.3.log")
    assert facts.versions == {"2.10.3+cuda11.3"}
    assert facts.ibverbs_missing
    assert facts.warnings == ["ai: Failed to open libibverbs.so[.1]"] * 3
    assert facts.connections == []
    assert transports(facts).inter_node == "NET/Socket"


def test_nodes_that_chose_different_networks():
    facts = load("mixed_networks_ib_and_socket.log")
    assert facts.networks == {"IB": {"x1"}, "Socket": {"x0"}}
    found = transports(facts)
    assert found.inter_node == "mixed: NET/IB (x1), NET/Socket (x0)"
    assert "ranks disagree" in found.description
    assert "libibverbs" in socket_fallback(facts, [HDR_PORT])


def test_socket_fallback_on_an_infiniband_cluster_is_seen_in_the_log_alone():
    facts = load("socket_fallback_ib_present_nccl2.18.log")
    # "misc/socket.cc:567 -> 2" lines are not connections
    assert len(facts.connections) == 23
    assert {c.label for c in facts.connections} == {"P2P/IPC", "NET/Socket"}
    assert sorted(c.via for c in facts.connections if c.kind == "NET") == \
        ["NET/Socket/0"] * 4 + ["NET/Socket/3"] * 2
    assert len(facts.warnings) == 3
    found = transports(facts)
    assert (found.inter_node, found.intra_node) == ("NET/Socket", "P2P/IPC")
    assert nccl_log.ib_hints(facts) == ["the IBext network plugin is installed",
                                        "interface ibp12s0 is IP over InfiniBand"]
    line = socket_fallback(facts)
    assert "ibp12s0" in line and "IBext" in line


def test_a_single_node_over_nvlink_has_no_network_connection():
    facts = load("p2p_nvlink_single_node_nccl2.22.3.log")
    assert facts.versions == {"2.22.3+cuda12.2"}         # the INFO form of the version line
    assert facts.hosts == {"lrdn2296"}
    assert len(facts.connections) == 11                   # nccl-tests' '#' and result rows skipped
    found = transports(facts)
    assert (found.inter_node, found.intra_node) == (None, "P2P/direct pointer")
    assert "no connection between nodes" in found.description
    # The lines do not name the link (the issue says NVLink 3.0): nothing claims it.
    assert not facts.nvlink
    assert socket_fallback(facts, [HDR_PORT]) is None


def test_newest_format_lists_no_ib_device():
    facts = load("no_ib_device_nccl2.27.5.log")
    assert facts.versions == {"2.27.5+cuda12.9"}
    assert facts.ib_no_device and facts.ib_devices == set()   # "Using [RO]; OOB eth0..."
    assert facts.socket_interfaces == {("eth0", "192.168.69.159")}


PREFIXES = {
    # horovodrun: horovod/runner/common/util/safe_shell_exec.py `prefix_connection`,
    # "{time}[{rank}]<{prefix}>:" (time only with --prefix-timestamp)
    "horovodrun": lambda rank: f"[{rank}]<stdout>:",
    "horovodrun --prefix-timestamp": lambda rank: f"Fri Aug 11 12:31:45 2023[{rank}]<stdout>:",
    "srun --label": lambda rank: f"{rank:>2}: ",
    # NCCL's own, with NCCL_DEBUG_TIMESTAMP_LEVELS (src/debug.cc, default format "[%F %T] ")
    "NCCL timestamps": lambda rank: f"[2025-03-01 10:00:{rank:02d}] ",
}


@pytest.mark.parametrize("launcher", sorted(PREFIXES))
def test_launcher_prefixes_change_nothing(launcher):
    path = os.path.join(DATA, "socket_fallback_libibverbs_2node_nccl2.18.3.log")
    lines = open(path, encoding="utf-8").read().splitlines()
    prefixed = [PREFIXES[launcher](number % 16) + line for number, line in enumerate(lines)]
    plain, wrapped = parse(lines), parse(prefixed)
    assert wrapped.versions == plain.versions and wrapped.hosts == plain.hosts
    assert wrapped.connections == plain.connections
    assert transports(wrapped) == transports(plain)


def test_a_log_without_nccl_lines_says_what_to_check():
    facts = parse("Epoch 1/3\nloss: 2.31\n")
    assert facts.lines == 0
    found = transports(facts)
    assert found.inter_node is None
    assert "NCCL_DEBUG=INFO" in found.description


def test_an_unreadable_log_is_one_line_naming_it(tmp_path, capsys):
    missing = tmp_path / "nccl.log"
    with pytest.raises(UsageError, match=f"{missing}: cannot read the NCCL log"):
        parse_file(missing)
    assert nccl_log.main([str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert nccl_log.main([os.path.join(DATA, "ib_2node_horovod_nccl2.4.7.log")]) == 0
    assert "across nodes NET/IB (InfiniBand on mlx5_0:1)" in capsys.readouterr().out
