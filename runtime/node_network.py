"""What one node's network offers the ranks: its interfaces and RDMA devices, read from sysfs.

Horovod's Gloo (its controller and CPU collectives) and NCCL's socket transport talk on the
interface HOROVOD_GLOO_IFACE and NCCL_SOCKET_IFNAME name. Left to the route between the
nodes, that is often the 1-25 GbE management network while the nodes also have InfiniBand
(an IPoIB interface: sysfs type 32, ARPHRD_INFINIBAND) or RoCE (an Ethernet interface backed
by an RDMA device) at 100-400 Gb/s. Which one every node has cannot be told from one node,
so `python -m runtime.node_network` prints this node's description as one JSON line, and
runtime/slurm_launch.py runs it once on every node of the job (one srun step, one task a
node, before the ranks start) and lets `choose_interface` pick. It reads files and imports
no TensorFlow, so it takes well under a second; a later check of each node can reuse it.

`describe_node(sys_root)` reads a sysfs tree rooted anywhere, so tests build fake ones:
    /sys/class/net/<if>/{type,operstate,speed}   /sys/class/net/<if>/device/infiniband/<dev>
    /sys/class/infiniband/<dev>/device/net/<if>
    /sys/class/infiniband/<dev>/ports/<p>/{state,rate,link_layer}
IPv4 addresses are not in sysfs: they come from the kernel (psutil), or are passed in.
"""
import json
import os
import re
import socket
import sys

ARPHRD_ETHER, ARPHRD_INFINIBAND, ARPHRD_LOOPBACK = 1, 32, 772
FAST_KINDS = {"ib": "InfiniBand", "roce": "RoCE"}


def _read(path):
    try:
        with open(path, encoding="ascii", errors="replace") as reader:
            return reader.read().strip()
    except OSError:            # absent, or unreadable (a down link's speed: EINVAL)
        return None


def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _ipv4_addresses():
    import psutil
    return {name: address.address for name, addresses in psutil.net_if_addrs().items()
            for address in addresses if address.family == socket.AF_INET}


def rdma_devices(sys_root="/sys"):
    """One entry a port of each RDMA device: name, port, state ("ACTIVE"), rate text and its
    Gb/s, link layer ("InfiniBand" or "Ethernet": RoCE), netdev (the interface on the same
    PCI function, or None)."""
    folder = os.path.join(sys_root, "class", "infiniband")
    ports = []
    for device in _listdir(folder):
        netdevs = _listdir(os.path.join(folder, device, "device", "net"))
        for port in _listdir(os.path.join(folder, device, "ports")):
            where = os.path.join(folder, device, "ports", port)
            state = _read(os.path.join(where, "state")) or ""     # "4: ACTIVE"
            rate = _read(os.path.join(where, "rate"))              # "100 Gb/sec (4X EDR)"
            gbps = re.match(r"\s*([0-9.]+)\s*Gb/sec", rate or "")
            ports.append({"name": device, "port": int(port) if port.isdigit() else port,
                          "state": state.partition(":")[2].strip() or state or None,
                          "rate": rate, "gbps": float(gbps.group(1)) if gbps else None,
                          "link_layer": _read(os.path.join(where, "link_layer")),
                          "netdev": netdevs[0] if netdevs else None})
    return ports


def _kind(sys_root, name, kind_number, rdma_netdevs):
    if kind_number == ARPHRD_LOOPBACK:
        return "loopback"
    if kind_number == ARPHRD_INFINIBAND:
        return "ib"
    if kind_number == ARPHRD_ETHER:
        backed = name in rdma_netdevs or _listdir(
            os.path.join(sys_root, "class", "net", name, "device", "infiniband"))
        return "roce" if backed else "ethernet"
    return "other"


def interfaces(sys_root="/sys", addresses=None, rdma=None):
    """Every network interface: name, ipv4 (None without one), kind (ib, roce, ethernet,
    loopback, other), operstate, speed_mbps (None when the kernel does not say)."""
    addresses = _ipv4_addresses() if addresses is None else addresses
    rdma = rdma_devices(sys_root) if rdma is None else rdma
    rdma_netdevs = {port["netdev"] for port in rdma if port["netdev"]}
    found = []
    for name in _listdir(os.path.join(sys_root, "class", "net")):
        folder = os.path.join(sys_root, "class", "net", name)
        kind_number = _read(os.path.join(folder, "type"))
        speed = _read(os.path.join(folder, "speed"))
        speed = int(speed) if speed and speed.lstrip("-").isdigit() else None
        found.append({"name": name, "ipv4": addresses.get(name),
                      "kind": _kind(sys_root, name, int(kind_number or -1), rdma_netdevs),
                      "operstate": _read(os.path.join(folder, "operstate")),
                      "speed_mbps": speed if speed and speed > 0 else None})
    return found


def describe_node(sys_root="/sys", addresses=None, node=None):
    """This node's network: {"node", "interfaces", "rdma"} (see `interfaces`,
    `rdma_devices`). `node` defaults to Slurm's name for it, else the short host name."""
    rdma = rdma_devices(sys_root)
    return {"node": node or os.environ.get("SLURMD_NODENAME")
            or socket.gethostname().split(".")[0],
            "interfaces": interfaces(sys_root, addresses, rdma), "rdma": rdma}


def fast_interfaces(description):
    """The node's InfiniBand and RoCE interfaces that can carry sockets: an IPv4 address, and
    not down."""
    return [interface for interface in description["interfaces"]
            if interface["kind"] in FAST_KINDS and interface["ipv4"]
            and interface["operstate"] != "down"]


def _few(names, most=3):
    names = list(names)
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def choose_interface(descriptions, nodes):
    """(interface, why) for the job's `nodes` from their `descriptions`: an InfiniBand or RoCE
    interface of one name with an IPv4 address on every node (InfiniBand first, then the
    fastest on its slowest node, then by name), why = "InfiniBand, on every node"; or
    (None, why not), e.g. "no InfiniBand/RoCE interface on node2"."""
    by_node = {description.get("node"): description for description in descriptions}
    unread = [node for node in nodes if node not in by_node]
    if unread:
        return None, f"the interfaces of {_few(unread)} could not be read"
    fast = {node: {interface["name"]: interface for interface in fast_interfaces(by_node[node])}
            for node in nodes}
    lacking = [node for node in nodes if not fast[node]]
    if lacking:
        return None, f"no InfiniBand/RoCE interface on {_few(lacking)}"
    common = set.intersection(*(set(names) for names in fast.values()))
    if not common:
        return None, "no InfiniBand/RoCE interface of one name on every node"

    def rank(name):
        kinds = {fast[node][name]["kind"] for node in nodes}
        slowest = min(fast[node][name]["speed_mbps"] or 0 for node in nodes)
        return (kinds != {"ib"}, -slowest, name)
    chosen = min(common, key=rank)
    return chosen, f"{FAST_KINDS[fast[nodes[0]][chosen]['kind']]}, on every node"


def read_descriptions(text):
    """The descriptions printed by the probe's tasks (one JSON line each, behind srun's
    "N: " label when it has one); other lines are ignored."""
    found = []
    for line in text.splitlines():
        line = re.sub(r"^\s*\d+:\s*", "", line).strip()
        if line.startswith("{"):
            try:
                description = json.loads(line)
            except ValueError:
                continue
            if isinstance(description, dict) and "interfaces" in description:
                found.append(description)
    return found


def main():
    print(json.dumps(describe_node(), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
