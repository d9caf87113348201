"""runtime/node_network.py on fake sysfs trees (no InfiniBand needed): what a node's interfaces
and RDMA devices are, and which interface every node of a job has for Gloo and NCCL's
sockets. The launch that uses it (a probe step under srun, the tasks' variables) is in
tests/test_slurm_launch.py and, under a real Slurm, tests/test_slurm_steps.py."""
import json
import os
import subprocess
import sys

from runtime import node_network
from runtime.node_network import choose_interface, describe_node, read_descriptions

ETHER, INFINIBAND, LOOPBACK = "1", "32", "772"


def fake_sysfs(root, interfaces=(), rdma=()):
    """A sysfs tree under `root`. interfaces: (name, type, operstate, speed or None, pci)
    with pci the PCI function folder of the interface's device (None: a virtual one);
    rdma: (device, pci, {port: (state, rate, link layer)}), the device's netdevs being the
    interfaces on the same PCI function."""
    root.mkdir(parents=True, exist_ok=True)
    pci_root = root / "devices" / "pci0000:00"
    for name, kind, state, speed, pci in interfaces:
        folder = root / "class" / "net" / name
        folder.mkdir(parents=True)
        (folder / "type").write_text(kind + "\n")
        (folder / "operstate").write_text(state + "\n")
        if speed is not None:
            (folder / "speed").write_text(f"{speed}\n")
        if pci:
            (pci_root / pci / "net" / name).mkdir(parents=True, exist_ok=True)
            (folder / "device").symlink_to(pci_root / pci)
    for device, pci, ports in rdma:
        folder = root / "class" / "infiniband" / device
        folder.mkdir(parents=True)
        (pci_root / pci / "infiniband" / device).mkdir(parents=True, exist_ok=True)
        (folder / "device").symlink_to(pci_root / pci)
        for port, (state, rate, link_layer) in ports.items():
            where = folder / "ports" / str(port)
            where.mkdir(parents=True)
            (where / "state").write_text(state + "\n")
            (where / "rate").write_text(rate + "\n")
            (where / "link_layer").write_text(link_layer + "\n")
    return str(root)


def ib_node(root):
    """A GPU node as clusters have them: Ethernet for management, IPoIB ib0 on an
    InfiniBand HCA, loopback."""
    return fake_sysfs(root, [("eno1", ETHER, "up", 10000, "0000:01:00.0"),
                             ("ib0", INFINIBAND, "up", 200000, "0000:3b:00.0"),
                             ("lo", LOOPBACK, "unknown", None, None)],
                      [("mlx5_0", "0000:3b:00.0",
                        {1: ("4: ACTIVE", "200 Gb/sec (4X HDR)", "InfiniBand")})])


ADDRESSES = {"eno1": "10.1.0.5", "ib0": "10.2.0.5", "lo": "127.0.0.1"}


def test_an_infiniband_node_is_described_from_sysfs(tmp_path):
    description = describe_node(ib_node(tmp_path), ADDRESSES, node="gpu01")
    assert description == {
        "node": "gpu01",
        "interfaces": [
            {"name": "eno1", "ipv4": "10.1.0.5", "kind": "ethernet", "operstate": "up",
             "speed_mbps": 10000},
            {"name": "ib0", "ipv4": "10.2.0.5", "kind": "ib", "operstate": "up",
             "speed_mbps": 200000},
            {"name": "lo", "ipv4": "127.0.0.1", "kind": "loopback", "operstate": "unknown",
             "speed_mbps": None}],
        "rdma": [{"name": "mlx5_0", "port": 1, "state": "ACTIVE", "rate": "200 Gb/sec (4X HDR)",
                  "gbps": 200.0, "link_layer": "InfiniBand", "netdev": "ib0"}]}


def test_roce_is_an_ethernet_interface_backed_by_an_rdma_device_either_way(tmp_path):
    """Found from the RDMA device (infiniband/<dev>/device/net/<if>) and from the interface
    (net/<if>/device/infiniband/); a down link's speed (-1) is unknown."""
    root = fake_sysfs(tmp_path, [("ens1f0", ETHER, "up", 100000, "0000:17:00.0"),
                                 ("eth9", ETHER, "down", -1, None)],
                      [("mlx5_2", "0000:17:00.0",
                        {1: ("4: ACTIVE", "100 Gb/sec (4X EDR)", "Ethernet")})])
    [roce, plain] = describe_node(root, {"ens1f0": "10.3.0.7"}, node="n")["interfaces"]
    assert (roce["kind"], roce["speed_mbps"], plain["kind"], plain["speed_mbps"]) == \
        ("roce", 100000, "ethernet", None)
    # The interface's side alone (an RDMA device folder the kernel did not link back)
    os.remove(os.path.join(root, "class", "infiniband", "mlx5_2", "device"))
    [roce, _] = describe_node(root, {}, node="n")["interfaces"]
    assert roce["kind"] == "roce" and node_network.rdma_devices(root)[0]["netdev"] is None


def test_the_real_nodes_description_is_one_json_line_without_tensorflow(repo_root):
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "runtime.node_network"],
                            cwd=repo_root, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    description = json.loads(line)
    assert {"lo"} <= {interface["name"] for interface in description["interfaces"]}
    assert "tensorflow" not in result.stderr   # -X importtime lists every module imported


def described(tmp_path, name, **kinds):
    """A node `name` with the interfaces kinds gives (interface -> (kind, speed Mb/s)), each
    with an address; a fake tree behind it."""
    interfaces, rdma, addresses = [], [], {}
    for number, (interface, (kind, speed)) in enumerate(sorted(kinds.items())):
        pci = f"0000:{number + 16:02x}:00.0"
        if kind == "ib":
            interfaces.append((interface, INFINIBAND, "up", speed, pci))
            rdma.append((f"mlx5_{number}", pci, {1: ("4: ACTIVE", "200 Gb/sec", "InfiniBand")}))
        elif kind == "roce":
            interfaces.append((interface, ETHER, "up", speed, pci))
            rdma.append((f"mlx5_{number}", pci, {1: ("4: ACTIVE", "100 Gb/sec", "Ethernet")}))
        else:
            interfaces.append((interface, ETHER, "up", speed, pci))
        addresses[interface] = f"10.{number}.0.{len(name)}"
    return describe_node(fake_sysfs(tmp_path / name, interfaces, rdma), addresses, node=name)


def test_choose_infiniband_on_every_node_else_say_which_node_lacks_it(tmp_path):
    node1 = described(tmp_path, "node1", eno1=("ethernet", 10000), ib0=("ib", 200000))
    node2 = described(tmp_path, "node2", eno1=("ethernet", 10000), ib0=("ib", 200000))
    plain = described(tmp_path, "node3", eno1=("ethernet", 10000))
    assert choose_interface([node1, node2], ["node1", "node2"]) == \
        ("ib0", "InfiniBand, on every node")
    assert choose_interface([node1, node2, plain], ["node1", "node2", "node3"]) == \
        (None, "no InfiniBand/RoCE interface on node3")
    assert choose_interface([node1], ["node1", "node2"]) == \
        (None, "the interfaces of node2 could not be read")
    other = described(tmp_path, "node4", ib1=("ib", 200000))
    assert choose_interface([node1, other], ["node1", "node4"]) == \
        (None, "no InfiniBand/RoCE interface of one name on every node")


def test_infiniband_before_roce_then_the_faster_on_its_slowest_node(tmp_path):
    both = [described(tmp_path, f"n{i}", ens2=("roce", 400000), ib0=("ib", 100000))
            for i in range(2)]
    assert choose_interface(both, ["n0", "n1"]) == ("ib0", "InfiniBand, on every node")
    roce = [described(tmp_path, "a", ens1=("roce", 100000), ens2=("roce", 200000)),
            described(tmp_path, "b", ens1=("roce", 100000), ens2=("roce", 25000))]
    assert choose_interface(roce, ["a", "b"]) == ("ens1", "RoCE, on every node")


def test_an_interface_without_an_address_or_down_is_not_taken(tmp_path):
    root = ib_node(tmp_path / "x")
    without = describe_node(root, {"eno1": "10.1.0.5"}, node="x")
    assert node_network.fast_interfaces(without) == []
    with open(os.path.join(root, "class", "net", "ib0", "operstate"), "w") as state:
        state.write("down\n")
    assert node_network.fast_interfaces(describe_node(root, ADDRESSES, node="x")) == []


def test_the_probes_lines_are_read_behind_sruns_labels():
    text = ('srun: job 7 queued\n0: {"node": "a", "interfaces": [], "rdma": []}\n'
            '1: not json\n  12: {"node": "b", "interfaces": [], "rdma": []}\n{"other": 1}\n')
    assert [d["node"] for d in read_descriptions(text)] == ["a", "b"]
