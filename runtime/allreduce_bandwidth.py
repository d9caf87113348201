"""Allreduce bandwidth arithmetic: what a measured allreduce achieved, what a link should give,
and how long the recipe's gradient allreduce takes on it.

Definitions are nccl-tests' (https://github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md):
`algbw = S / t` for S bytes in t seconds, and for an allreduce over n ranks
`busbw = algbw * 2(n-1)/n`, the rate each rank's link must carry (a ring or a tree sends
2(n-1)/n of the data over every rank's link). Bus bandwidth is comparable with a link's rate
whatever n, which is why the check reports it. GB are 10^9 bytes, as nccl-tests prints
(src/all_reduce.cu `AllReduceGetBw`: bytes / 1.0E9 / sec).

Between nodes the bottleneck is the node's network links: with NCCL's rings spread over the
node's NICs (one ring per rail), bus bandwidth reaches the node's NICs together, so the
expected figure is the data rate of one link times the links NCCL uses (`expected_busbw`).
It is a ceiling: nccl-tests on healthy InfiniBand reaches about 90-97% of it, TCP sockets
less (protocol overhead, copies).

Link rates come from sysfs, as the kernel prints them:
* an InfiniBand or RoCE port: /sys/class/infiniband/<hca>/ports/<n>/rate, e.g.
  "200 Gb/sec (4X HDR)" (drivers/infiniband/core/sysfs.c `rate_show`: lanes times the
  per-lane rate of the speed grade). SDR, DDR and QDR lanes carry 8b/10b-encoded data, so
  their data rate is 80% of that figure; FDR's 14 Gb/s is a signalling rate (14.0625 Gb/s with
  64b/66b: 13.64 Gb/s of data); FDR10, EDR and later grades are quoted as data rates.
* an Ethernet interface: /sys/class/net/<if>/speed, in Mb/s (-1 or unreadable when the link
  is down or virtual).

Nothing here imports TensorFlow (the recipe's gradient size comes from `BertConfig`'s own
parameter count, which tests/test_config_ranges.py checks against the built graph).
"""
import dataclasses
import os
import re
from typing import List, Optional

from reporting.errors import UsageError

GB = 1e9  # nccl-tests' GB
# Data rate of one lane, Gb/s, by speed grade (see the module docstring).
IB_LANE_DATA_GBPS = {"SDR": 2.0, "DDR": 4.0, "QDR": 8.0, "FDR10": 10.0, "FDR": 14.0625 * 64 / 66,
                     "EDR": 25.0, "HDR": 50.0, "NDR": 100.0, "XDR": 200.0}
# The per-lane figure the kernel multiplies by the width for the rate text.
IB_LANE_RATE_GBPS = {"SDR": 2.5, "DDR": 5.0, "QDR": 10.0, "FDR10": 10.0, "FDR": 14.0,
                     "EDR": 25.0, "HDR": 50.0, "NDR": 100.0, "XDR": 200.0}
BYTES_PER_ELEMENT = {"float16": 2, "bfloat16": 2, "float32": 4}
_IB_RATE = re.compile(r"^\s*(?P<rate>\d+(?:\.\d+)?) Gb/sec \((?P<lanes>\d+)X ?(?P<grade>[A-Z0-9]*)"
                      r"\)\s*$")


def bus_factor(ranks):
    """nccl-tests' allreduce factor 2(n-1)/n (0 for one rank: nothing crosses a link)."""
    ranks = int(ranks)
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    return 2.0 * (ranks - 1) / ranks


def algbw(nbytes, seconds):
    """Algorithm bandwidth, GB/s: bytes / time."""
    if seconds <= 0:
        raise ValueError(f"a time must be positive, got {seconds}")
    return nbytes / seconds / GB


def busbw(nbytes, seconds, ranks):
    """Bus bandwidth of an allreduce, GB/s: algbw x 2(n-1)/n."""
    return algbw(nbytes, seconds) * bus_factor(ranks)


def allreduce_seconds(nbytes, bus_gbytes_per_s, ranks):
    """The time an allreduce of `nbytes` over `ranks` takes at a bus bandwidth (GB/s): the
    definition of busbw solved for t."""
    if bus_gbytes_per_s <= 0:
        raise ValueError(f"a bandwidth must be positive, got {bus_gbytes_per_s}")
    return nbytes * bus_factor(ranks) / (bus_gbytes_per_s * GB)


@dataclasses.dataclass(frozen=True)
class IbRate:
    """An InfiniBand/RoCE port's rate as sysfs prints it, and the data it carries."""
    text: str
    lanes: int
    grade: str            # "HDR", "EDR", ... ("" when the kernel printed none)
    rate_gbps: float      # the printed figure
    data_gbps: float      # after line encoding

    @property
    def data_gbytes_per_s(self):
        return self.data_gbps / 8


def parse_ib_rate(text) -> IbRate:
    """"200 Gb/sec (4X HDR)" -> IbRate(lanes 4, HDR, 200, data 200 Gb/s). ValueError on text
    of another form, or a figure that is not lanes x the grade's lane rate."""
    found = _IB_RATE.match(text or "")
    if not found:
        raise ValueError(f"{text!r} is not an InfiniBand rate like '200 Gb/sec (4X HDR)'")
    rate, lanes, grade = float(found.group("rate")), int(found.group("lanes")), \
        found.group("grade")
    if lanes < 1:
        raise ValueError(f"{text!r}: no lanes")
    if grade in IB_LANE_RATE_GBPS:
        if abs(IB_LANE_RATE_GBPS[grade] * lanes - rate) > 0.5:
            raise ValueError(f"{text!r}: {lanes}X {grade} is "
                             f"{IB_LANE_RATE_GBPS[grade] * lanes:g} Gb/sec, not {rate:g}")
        data = IB_LANE_DATA_GBPS[grade] * lanes
    elif grade:
        raise ValueError(f"{text!r}: unknown InfiniBand speed grade {grade}")
    else:
        data = rate
    return IbRate(text.strip(), lanes, grade, rate, data)


def expected_busbw(link_data_gbps, links=1):
    """The bus bandwidth (GB/s) a node's `links` network links of `link_data_gbps` each can
    carry: their data rate together, in bytes (a ceiling, see the module docstring)."""
    if link_data_gbps <= 0 or int(links) < 1:
        raise ValueError(f"need a positive rate and at least one link, got {link_data_gbps} "
                         f"Gb/s x {links}")
    return link_data_gbps * int(links) / 8


def ethernet_gbps(speed_mbps):
    """/sys/class/net/<if>/speed (Mb/s) in Gb/s; None for a link without a speed (-1: down,
    virtual, or a driver that does not say)."""
    speed = int(speed_mbps)
    return speed / 1000 if speed > 0 else None


@dataclasses.dataclass(frozen=True)
class IbPort:
    device: str
    port: int
    state: str            # "ACTIVE", "DOWN", ...
    link_layer: str       # "InfiniBand" or "Ethernet" (RoCE)
    rate: Optional[IbRate]

    def describe(self):
        rate = self.rate.text if self.rate else "rate unknown"
        return f"{self.device} port {self.port}: {rate}, {self.link_layer}, {self.state}"


def _read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read().strip()


def ib_ports(root="/sys/class/infiniband") -> List[IbPort]:
    """The InfiniBand/RoCE ports this node has (empty without the kernel's IB stack: no
    `root`). Present even where rdma-core is missing: the kernel driver makes them."""
    ports = []
    if not os.path.isdir(root):
        return ports
    for device in sorted(os.listdir(root)):
        port_dir = os.path.join(root, device, "ports")
        if not os.path.isdir(port_dir):
            continue
        for port in sorted(os.listdir(port_dir), key=lambda p: int(p) if p.isdigit() else -1):
            if not port.isdigit():
                continue
            base = os.path.join(port_dir, port)
            try:
                rate_text = _read(os.path.join(base, "rate"))
                state = _read(os.path.join(base, "state")).split(":")[-1].strip()
                link = _read(os.path.join(base, "link_layer")) if os.path.exists(
                    os.path.join(base, "link_layer")) else "InfiniBand"
            except OSError as error:
                raise UsageError(f"{base}: cannot read the port's sysfs files: "
                                 f"{error.strerror}") from None
            try:
                rate = parse_ib_rate(rate_text)
            except ValueError:
                rate = None
            ports.append(IbPort(device, int(port), state, link, rate))
    return ports


def interface_gbps(interface, root="/sys/class/net"):
    """An Ethernet interface's link speed in Gb/s, or None (no such interface, no speed)."""
    try:
        return ethernet_gbps(_read(os.path.join(root, interface, "speed")))
    except (OSError, ValueError):
        return None


def gradient_bytes(config, dtype="float16"):
    """Bytes of one allreduce of the recipe's gradients: every trainable parameter once
    (`BertConfig.parameter_count`), in the wire dtype. The recipe's float16 AMP allreduces in
    float16 (Horovod's fp16 compression); bfloat16 and float32 runs in float32
    (training.settings.gradient_compression)."""
    if dtype not in BYTES_PER_ELEMENT:
        raise ValueError(f"dtype must be one of {', '.join(BYTES_PER_ELEMENT)}, got {dtype!r}")
    return config.parameter_count() * BYTES_PER_ELEMENT[dtype]
