"""What NCCL's INFO output (`NCCL_DEBUG=INFO`) says about the network a run's allreduce took.

Why: the pip NCCL (nvidia-nccl-cu12, 2.16.5 for TensorFlow 2.15) reaches InfiniBand through
libibverbs, which it opens at run time. Where rdma-core is missing it logs one INFO line
("Failed to open libibverbs.so[.1]"; a WARN only up to 2.10) and crosses nodes over TCP
sockets, ten to a hundred times slower, without a warning. The log is the only place that
says which transport NCCL chose, so this module turns it into facts (`parse`), names the
transport between nodes and within a node (`transports`) and explains a socket fallback
where InfiniBand is there (`socket_fallback`).

Input: NCCL's lines as a rank prints them to stdout (`host:pid:tid [dev] NCCL INFO ...`,
NCCL's src/debug.cc), or an NCCL_DEBUG_FILE's contents, with whatever a launcher put in
front: horovodrun's `[1]<stdout>:`, mpirun's `[1,0]<stdout>:`, srun's `0: `, a timestamp.
The formats of NCCL 2.4 to 2.27 are read (tests/data/nccl holds real logs of each era):
connections were `Ring NN : a -> b` up to 2.6 and `Channel NN/c : a[x] -> b[x]` since, peers
named by bus id until 2.18.1 and by device number since 2.18.3; `Using network X` exists
since 2.6. Nothing here imports TensorFlow.
"""
import collections
import dataclasses
import re
import sys
from typing import Dict, Iterable, List, Optional, Set, Tuple, Union

from reporting.errors import UsageError

# `host:pid:tid [dev] `, then for a WARN `file.cc:line (func) `, then `NCCL INFO|WARN message`.
# A host has no ':' or brackets, so a launcher's prefix before it is skipped by the search.
_PREFIX = re.compile(r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
                     r"(?:[\d.]+ )?(?:\S+:\d+ (?:\(\S+\) )?)?NCCL (?P<level>INFO|WARN) ?"
                     r"(?P<message>.*?)\s*$")
_VERSION = re.compile(r"NCCL version (?P<version>\d+\.\d+\.\d+\S*)")
_CONNECTION = re.compile(
    r"^(?:Ring|Channel) (?P<channel>\d+)(?:/\d+)? : (?P<src>\d+)(?:\[[0-9a-fA-F]+\])? -> "
    r"(?P<dst>\d+)(?:\[[0-9a-fA-F]+\])?(?: \[(?P<direction>send|receive)\])? "
    r"via (?P<via>.+)$")
_NET_VIA = re.compile(r"^NET/(?P<network>.+?)/(?P<device>\d+)(?:\(\d+\))?(?P<flags>(?:/.*)?)$")
_IB_DEVICE = re.compile(r"\[\d+\] ?(?P<name>[^\s:\[\]]+):(?P<port>\d+)/(?P<link>IB|RoCE)"
                        r"(?P<flags>(?:/[A-Za-z]+)*)")
_INTERFACE = re.compile(r"\[\d+\](?P<name>[^\s:\[\]]+):(?P<address>\S+?)<\d+>")
_BOOTSTRAP = re.compile(r"^Bootstrap ?: Using (?:\[\d+\])?(?P<name>[^\s:\[\]]+):"
                        r"(?P<address>\S+?)<\d+>")
_ENV = re.compile(r"^(?P<name>NCCL_\w+) set by environment to (?P<value>.*?)\.?$")
_IBVERBS_MISSING = re.compile(r"(?:Failed to open|Count not open|Could not open) libibverbs")


@dataclasses.dataclass(frozen=True)
class Connection:
    """One `Channel/Ring NN : a -> b via T` line: `kind` NET, P2P, SHM or OTHER; `label` the
    transport without its device number ("NET/IB", "P2P/IPC", "SHM"); `network` the NET
    transport's network ("IB", "Socket", "IBext_v8", "AWS Libfabric")."""
    host: Optional[str]
    channel: int
    src: int
    dst: int
    direction: Optional[str]
    via: str
    kind: str
    label: str
    network: Optional[str] = None
    gpudirect: bool = False

    @property
    def crosses_nodes(self):
        """NET connects ranks of different nodes (NCCL prefers P2P and SHM within one);
        multi-node NVLink (P2P/MNNVL, GB200 NVL72) too."""
        return self.kind == "NET" or self.label == "P2P/MNNVL"


@dataclasses.dataclass(frozen=True)
class IbDevice:
    name: str
    port: int
    link: str            # "IB" or "RoCE" (NCCL's own words)
    flags: str = ""      # e.g. "/SHARP"


@dataclasses.dataclass
class NcclFacts:
    """What one log says, over all the ranks whose lines it holds."""
    lines: int = 0                                  # NCCL lines read
    versions: Set[str] = dataclasses.field(default_factory=set)
    hosts: Set[str] = dataclasses.field(default_factory=set)
    networks: Dict[str, Set[str]] = dataclasses.field(default_factory=dict)  # network: hosts
    ib_devices: Set[IbDevice] = dataclasses.field(default_factory=set)
    ib_no_device: bool = False
    ibverbs_missing: bool = False
    socket_interfaces: Set[Tuple[str, str]] = dataclasses.field(default_factory=set)
    bootstrap_interfaces: Set[Tuple[str, str]] = dataclasses.field(default_factory=set)
    plugins: Set[str] = dataclasses.field(default_factory=set)
    environment: Dict[str, str] = dataclasses.field(default_factory=dict)
    nodes: Optional[int] = None                     # NCCL's own count (`nNodes`, 2.12+)
    ranks: Optional[int] = None
    nvlink: bool = False                            # NVLink seen (topology or NVLS)
    warnings: List[str] = dataclasses.field(default_factory=list)
    connections: List[Connection] = dataclasses.field(default_factory=list)


def _transport(via):
    """(kind, label, network, gpudirect) of a connection's `via` text."""
    net = _NET_VIA.match(via)
    if net:
        network = net.group("network")
        return "NET", f"NET/{network}", network, "GDRDMA" in net.group("flags")
    if via.startswith("P2P/"):
        return "P2P", "P2P/" + via.split("/")[1], None, False
    if via.startswith("SHM") or via == "direct shared memory":
        return "SHM", "SHM", None, False
    return "OTHER", via, None, False


def _message(facts, host, message):
    """Folds one INFO message into `facts`."""
    connection = _CONNECTION.match(message)
    if connection:
        kind, label, network, gpudirect = _transport(connection.group("via"))
        facts.connections.append(Connection(
            host, int(connection.group("channel")), int(connection.group("src")),
            int(connection.group("dst")), connection.group("direction"),
            connection.group("via"), kind, label, network, gpudirect))
        return
    used = re.match(r"^Using (?:internal )?[Nn]etwork (?P<network>.+)$", message)
    if used:
        facts.networks.setdefault(used.group("network"), set()).add(host or "?")
    elif message.startswith(("NET/IB : No device found", "Net/IB: call to devices() returned 0")):
        facts.ib_no_device = True
    elif message.startswith(("NET/IB : Using", "NET/IB: [")):
        for device in _IB_DEVICE.finditer(message.split("; OOB")[0]):
            facts.ib_devices.add(IbDevice(device.group("name"), int(device.group("port")),
                                          device.group("link"), device.group("flags")))
    elif message.startswith("NET/Socket : Using"):
        facts.socket_interfaces.update(
            (found.group("name"), found.group("address"))
            for found in _INTERFACE.finditer(message))
    elif found := _BOOTSTRAP.match(message):
        facts.bootstrap_interfaces.add((found.group("name"), found.group("address")))
    elif _IBVERBS_MISSING.search(message):
        facts.ibverbs_missing = True
    elif message.startswith("P2P plugin "):
        facts.plugins.add(message[len("P2P plugin "):].strip())
    elif message.startswith("NET/Plugin: Loaded net plugin "):
        facts.plugins.add(re.sub(r" \(v\d+\)$", "", message[len("NET/Plugin: Loaded net "
                                                                "plugin "):]))
    elif env := _ENV.match(message):
        facts.environment[env.group("name")] = env.group("value")
    elif message.startswith("NVLS multicast support is available") or \
            re.search(r"\bNVL\[|type NVL/", message):
        facts.nvlink = True
    nodes = re.search(r"\bnNodes (\d+)\b", message)
    if nodes:
        facts.nodes = max(facts.nodes or 0, int(nodes.group(1)))
    ranks = re.search(r"\bn[Rr]anks (\d+)\b", message)
    if ranks:
        facts.ranks = max(facts.ranks or 0, int(ranks.group(1)))


def parse(text: Union[str, Iterable[str]]) -> NcclFacts:
    """The facts of an NCCL INFO log (a string, or lines); lines of anything else are skipped."""
    lines = text.splitlines() if isinstance(text, str) else text
    facts = NcclFacts()
    for line in lines:
        line = line.rstrip("\r\n")
        prefixed = _PREFIX.search(line)
        if not prefixed:  # rank 0's plain "NCCL version 2.4.7+cuda10.0" (up to 2.2x)
            version = _VERSION.search(line)
            if version and "compiled with" not in line:
                facts.versions.add(version.group("version"))
                facts.lines += 1
            continue
        facts.lines += 1
        host, message = prefixed.group("host"), prefixed.group("message")
        facts.hosts.add(host)
        if prefixed.group("level") == "WARN":
            facts.warnings.append(f"{host}: {message}")
            if _IBVERBS_MISSING.search(message):
                facts.ibverbs_missing = True
        elif message.startswith("NCCL version "):
            facts.versions.add(_VERSION.match(message).group("version"))
        else:
            _message(facts, host, message)
    return facts


def parse_file(path) -> NcclFacts:
    """`parse` of a file: a log saved from stdout, or an NCCL_DEBUG_FILE."""
    try:
        with open(path, encoding="utf-8", errors="replace") as log:
            return parse(log.read())
    except OSError as error:
        raise UsageError(f"{path}: cannot read the NCCL log: {error.strerror}") from None


def network_family(network, ib_devices=()):
    """What a network name means on the wire: "InfiniBand", "RoCE", "TCP sockets", ...
    NCCL names its verbs transport "IB" for RoCE ports too; plugins add a suffix (IBext,
    IBext_v8: NVIDIA's HPC-X plugin over the same verbs)."""
    name = network.lower()
    if name.startswith("ib"):
        links = {device.link for device in ib_devices}
        return "RoCE" if links == {"RoCE"} else "InfiniBand"
    if name == "socket":
        return "TCP sockets"
    if "libfabric" in name or "ofi" in name or "efa" in name:
        return "libfabric (AWS EFA)"
    return f"the {network} network plugin"


@dataclasses.dataclass(frozen=True)
class Transports:
    """`inter_node`: the transport between nodes ("NET/IB", "NET/Socket", ...; "mixed: ..."
    when ranks disagree; None when the log shows none), `family` what it is on the wire,
    `intra_node` the transport within a node ("P2P/IPC", "SHM", ...), `description` one
    line for a person."""
    inter_node: Optional[str]
    family: Optional[str]
    intra_node: Optional[str]
    nvlink: bool
    description: str


def _most_common(labels):
    return collections.Counter(labels).most_common(1)[0][0] if labels else None


def transports(facts: NcclFacts) -> Transports:
    crossing = [c for c in facts.connections if c.crosses_nodes]
    within = [c for c in facts.connections if not c.crosses_nodes and c.kind in ("P2P", "SHM")]
    labels = sorted({c.label for c in crossing})
    networks = sorted(facts.networks)
    if len(labels) > 1 or (not labels and len(networks) > 1):
        parts = labels or [f"NET/{n} ({', '.join(sorted(facts.networks[n]))})" for n in networks]
        inter, family = "mixed: " + ", ".join(parts), "mixed"
    elif labels:
        inter = labels[0]
        network = next(c.network for c in crossing if c.label == inter)
        family = network_family(network, facts.ib_devices) if network else "multi-node NVLink"
    elif networks:
        inter, family = f"NET/{networks[0]}", network_family(networks[0], facts.ib_devices)
    else:
        inter, family = None, None
    intra = _most_common([c.label for c in within])
    return Transports(inter, family, intra, facts.nvlink,
                      _describe(facts, inter, family, intra, bool(crossing)))


def _describe(facts, inter, family, intra, from_connections):
    version = ", ".join(sorted(facts.versions)) or "version not shown"
    if not facts.lines:
        return ("no NCCL lines: was NCCL_DEBUG=INFO set, and did the allreduce run on GPUs "
                "(Horovod built with NCCL)?")
    parts = [f"NCCL {version}"]
    if facts.nodes:
        parts.append(f"{facts.nodes} node(s)")
    if family == "mixed":
        parts.append(f"ranks disagree on the network between nodes: {inter[len('mixed: '):]}")
    elif inter:
        over = ""
        if family == "TCP sockets" and facts.socket_interfaces:
            over = " over " + ", ".join(sorted({name for name, _ in facts.socket_interfaces}))
        elif family in ("InfiniBand", "RoCE") and facts.ib_devices:
            over = " on " + ", ".join(sorted(f"{d.name}:{d.port}" for d in facts.ib_devices))
        if any(c.gpudirect for c in facts.connections):
            over += ", GPUDirect RDMA"
        if from_connections:
            parts.append(f"across nodes {inter} ({family}{over})")
        else:
            parts.append(f"between nodes NCCL would use {inter} ({family}{over}): its chosen "
                         "network, no connection in the log")
    else:
        parts.append("no connection between nodes in the log")
    if intra:
        parts.append(f"within a node {intra}" + (" (NVLink present)" if facts.nvlink else ""))
    elif facts.nvlink:
        parts.append("NVLink present")
    hints = fallback_causes(facts)
    if hints and family in ("TCP sockets", "mixed"):
        parts.append("; ".join(hints))
    return "; ".join(parts)


def fallback_causes(facts: NcclFacts) -> List[str]:
    """Why NCCL left InfiniBand aside, as far as its log tells."""
    causes = []
    if facts.ibverbs_missing:
        causes.append("libibverbs could not be loaded (rdma-core missing: install "
                      "libibverbs1 / rdma-core on every node)")
    if facts.ib_no_device:
        causes.append("NCCL found no usable IB device (check the ports are Active, "
                      "NCCL_IB_HCA, and that a container sees /dev/infiniband)")
    if facts.environment.get("NCCL_IB_DISABLE", "0").strip() == "1":
        causes.append("NCCL_IB_DISABLE=1 is set")
    if facts.environment.get("NCCL_NET", "").lower() == "socket":
        causes.append("NCCL_NET=Socket is set")
    return causes


def ib_hints(facts: NcclFacts) -> List[str]:
    """Signs of InfiniBand hardware in the log itself (the lead's check also reads sysfs):
    IB devices NCCL listed, an IB network plugin, IPoIB interfaces (ib0, ibp12s0, ibs1)."""
    hints = [f"NCCL listed {d.name}:{d.port}/{d.link}" for d in sorted(
        facts.ib_devices, key=lambda d: (d.name, d.port)) if d.link == "IB"]
    hints += [f"the {p} network plugin is installed" for p in sorted(facts.plugins)
              if p.lower().startswith("ib")]
    interfaces = {name for name, _ in facts.bootstrap_interfaces | facts.socket_interfaces}
    hints += [f"interface {name} is IP over InfiniBand" for name in sorted(interfaces)
              if re.match(r"^ib[a-z]*\d", name)]
    return hints


def socket_fallback(facts: NcclFacts, ib_ports: Iterable[str] = ()) -> Optional[str]:
    """One line when NCCL crossed nodes over TCP sockets although InfiniBand is there:
    `ib_ports` (e.g. "mlx5_0 port 1: 200 Gb/sec (4X HDR)", from this node's sysfs) or the
    log's own `ib_hints`. None when it did not, or when nothing shows InfiniBand."""
    found = transports(facts)
    if not found.inter_node or "NET/Socket" not in found.inter_node:
        return None
    evidence = list(ib_ports) or ib_hints(facts)
    if not evidence:
        return None
    causes = fallback_causes(facts) or ["the log does not say why: rerun with "
                                        "NCCL_DEBUG_SUBSYS=INIT,NET"]
    return (f"NCCL crossed nodes over TCP sockets ({found.inter_node}) although InfiniBand "
            f"is there ({'; '.join(evidence)}): {'; '.join(causes)}")


def main(argv=None):
    """`python -m runtime.nccl_log FILE...`: one line a log."""
    paths = sys.argv[1:] if argv is None else list(argv)
    if not paths:
        print("usage: python -m runtime.nccl_log NCCL_LOG...", file=sys.stderr)
        return 2
    try:
        for path in paths:
            facts = parse_file(path)
            print(f"{path}: {transports(facts).description}")
            fallback = socket_fallback(facts)
            if fallback:
                print(f"{path}: {fallback}")
    except UsageError as error:
        print(f"nccl_log: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
