"""The multi-node check (`bert-preflight --nodes`, or `PREFLIGHT=1 sbatch scripts/run.sub`):
does the recipe's allreduce cross the nodes over the network it should, and how fast?

Why: the single-node preflight cannot see the network between nodes, and NCCL chooses it by
itself: without rdma-core on a node it crosses over TCP sockets without a warning. BERT-large's
float16 gradients are 0.67 GB a window: 1.0 s on 10 GbE, 10 s on 1 GbE, 7 ms on a DGX A100's
eight HDR links, against NVIDIA's ~5.7 s phase-1 window on 4 DGX A100s.

The check is the recipe's own launch (srun under Slurm, horovodrun over ssh: `scripts/
nodes_check.sh`, which uses `scripts/launch_common.sh` as the run scripts do) of
`runtime.allreduce_check` on every rank: timed allreduces of the recipe's gradient bytes, with
NCCL_DEBUG=INFO written to files of the check's folder. Then, here:
* the transport NCCL took between nodes and within a node (`runtime.nccl_log`);
* the bus bandwidth measured (nccl-tests' definition, `runtime.allreduce_bandwidth`) beside
  what this node's links carry (its active InfiniBand/RoCE ports for NET/IB, the interface's
  speed for sockets), and the allreduce's time a window beside NVIDIA's phase-1 window;
* the verdict: a socket fallback where InfiniBand is there is a fall-back (exit 2) named in one
  line with its cause; a launch that failed is a failure (exit 1); a bus bandwidth under half
  the links' is a warning. On CPUs (this project's tests) the allreduce is Horovod's Gloo over
  TCP: its bandwidth is real, there is no NCCL.
"""
import dataclasses
import glob
import json
import os
import shutil
import subprocess
import tempfile
from typing import Optional, Tuple

from pretraining import published_speed
from pretraining.preflight_report import verdict
from reporting.errors import UsageError
from runtime import allreduce_bandwidth, nccl_log

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "nodes_check.sh")
ITERATIONS = 10
BANDWIDTH_WARNING = 0.5   # measured bus bandwidth / the links' below this: a warning
GLOBAL_BATCH = 65536      # NVIDIA's phase-1 global batch (a window)


@dataclasses.dataclass(frozen=True)
class NodesCheck:
    """What the multi-node check found (module docstring); `result` is allreduce_check's
    JSON, `failure` why there is none."""
    model: str
    precision: str
    gradient_bytes: int
    network: Optional[str] = None
    result: Optional[dict] = None
    nccl: Optional[str] = None                 # the transports, one line
    inter_node: Optional[str] = None
    fallback: Optional[str] = None
    nccl_warnings: Tuple[str, ...] = ()
    links: Tuple[str, ...] = ()
    link_gbytes_per_s: Optional[float] = None  # what the links carry, GB/s of bus bandwidth
    window_seconds: Optional[float] = None     # NVIDIA's phase-1 window on as many GPUs
    window_how: Optional[str] = None
    failure: Optional[str] = None


def _gb(nbytes):
    """0.67 GB, 4.2 MB, 12 kB."""
    if nbytes >= 1e8:
        return f"{nbytes / 1e9:.2f} GB"
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 1e5 else f"{nbytes / 1e3:.0f} kB"


def _bandwidth_lines(check, result):
    lines, warnings = [], []
    mean = result["time_s"]["mean"]
    busbw = result["busbw_GBps"]
    lines.append(f"allreduce: {_gb(result['bytes'])} ({result['dtype']}) x "
                 f"{result['iterations']} over {result['ranks']} ranks on {result['nodes']} "
                 f"node{'s' * (result['nodes'] != 1)}: {mean * 1e3:.1f} ms each (the slowest "
                 f"rank's, mean), bus bandwidth {busbw:.2f} GB/s (algbw "
                 f"{result['algbw_GBps']:.2f} GB/s x 2(n-1)/n, nccl-tests' definition)")
    links = "; ".join(check.links)
    if not links:
        lines.append("links:  not known here (no InfiniBand port, and the interface was the "
                     "launcher's choice)")
    elif check.link_gbytes_per_s:
        share = busbw / check.link_gbytes_per_s
        lines.append(f"links:  this node's {links}: at most {check.link_gbytes_per_s:.2f} GB/s "
                     f"of bus bandwidth; measured {share:.0%} of it")
        if share < BANDWIDTH_WARNING:
            warnings.append(f"the bus bandwidth is {share:.0%} of what this node's links "
                            f"carry ({busbw:.2f} of {check.link_gbytes_per_s:.2f} GB/s)")
    else:
        lines.append(f"links:  this node's {links} (no rate known to compare with)")
    recipe = allreduce_bandwidth.allreduce_seconds(check.gradient_bytes, busbw,
                                                   result["ranks"])
    line = (f"window: the recipe's allreduce ({check.model}, {check.precision} gradients, "
            f"{_gb(check.gradient_bytes)}) takes {recipe:.3g} s a window at this bandwidth")
    if check.window_seconds:
        line += (f", against NVIDIA's phase-1 window of {check.window_seconds:.1f} s on "
                 f"{result['ranks']} GPUs ({check.window_how}): {recipe / check.window_seconds:.1%}"
                 " more time a step")
    lines.append(line)
    return lines, warnings


def report_nodes(check, allow_cpu=False):
    """The check's text, exit status and fall-backs, from `check` alone."""
    lines = [f"BERT preflight, nodes: the allreduce of {check.model}, {check.precision}"]
    if check.network:
        lines.append(f"network: {check.network}")
    failures, fallbacks, warnings = [], [], []
    result = check.result
    if check.failure or not result:
        failures.append(check.failure or "the check wrote no result")
    else:
        lines.append(f"ranks:  {result['ranks']} on {', '.join(sorted(set(result['hosts'])))}"
                     f" ({result['device']})")
        on_gpu = result["dtype"] == "float16"
        if result["nccl_used"]:
            lines.append(f"transport: {check.nccl or 'NCCL wrote no log'}")
        else:
            lines.append(f"transport: Horovod's {result['controller'] or '?'} over TCP (no "
                         f"NCCL: {'Horovod built without it' if on_gpu else 'CPU ranks'})")
        more, said = _bandwidth_lines(check, result)
        lines += more
        warnings += said
        if on_gpu and not result["nccl_used"]:
            fallbacks.append("the GPUs' allreduce did not use NCCL (Horovod built without it: "
                             "BERT_TF_FLAVOR=gpu bash scripts/install.sh)")
        if check.fallback:
            fallbacks.append(check.fallback)
        if not on_gpu and not allow_cpu:
            fallbacks.append("no GPU: CPU ranks allreduced over Gloo (--allow_cpu accepts "
                             "that)")
        if result["nodes"] < 2:
            warnings.append("one node: nothing crossed a network between nodes")
    warnings += list(check.nccl_warnings)
    lines += [f"warning: {text}" for text in warnings]
    passed = None
    if result:
        across = ("across nodes " + (check.inter_node or "over "
                                     f"{result['controller'] or 'the network'}")
                  if result["nodes"] > 1 else "within one node")
        passed = f"PASS: {across} at {result['busbw_GBps']:.2f} GB/s"
    return verdict(lines, failures, fallbacks, warnings, passed)


def links_of(inter_node, interface, ports=allreduce_bandwidth.ib_ports,
             speed=allreduce_bandwidth.interface_gbps):
    """(descriptions, GB/s of bus bandwidth they carry or None) of this node's links for the
    transport between nodes: the active InfiniBand/RoCE ports for NET/IB (NCCL spreads over
    them), the interface's speed for sockets and Gloo."""
    active = [port for port in ports() if port.state == "ACTIVE"]
    if inter_node and "IB" in inter_node and active:
        known = [port.rate.data_gbps for port in active if port.rate]
        total = allreduce_bandwidth.expected_busbw(sum(known), 1) if known else None
        return tuple(port.describe() for port in active), total
    if interface:
        gbps = speed(interface)
        text = f"interface {interface}: " + (f"{gbps:g} Gb/s" if gbps else "speed unknown")
        return (text,), (allreduce_bandwidth.expected_busbw(gbps, 1) if gbps else None)
    return tuple(port.describe() for port in active), None


def nvidia_window(gpu_name, memory_bytes, ranks, precision):
    """(seconds, how) of NVIDIA's phase-1 window (65,536 sequences) on `ranks` GPUs of this
    kind, or (None, None) where NVIDIA publishes no figure."""
    table, _ = published_speed.table_for(gpu_name, memory_bytes, ranks)
    if table is None:
        return None, None
    figure = published_speed.figure(table, published_speed.PHASE1_SEQ, ranks,
                                     published_speed.PRECISION_CLASS[precision])
    if figure is None:
        return None, None
    how = f"{table.system}, {figure.how}"
    return GLOBAL_BATCH / figure.rate, how


def _interface(found):
    """The first interface rank 0 was given (its result's, or an environment's), or None."""
    named = (found.get("interface") or found.get("NCCL_SOCKET_IFNAME")
             or found.get("HOROVOD_GLOO_IFACE") or found.get("NETWORK_INTERFACE") or "")
    return named.split(",")[0].lstrip("^=") or None


def run_nodes(model_label, precision, gradient_bytes, gpu, work_dir=None, iterations=ITERATIONS,
              allow_cpu=False, environ=None):
    """Launches the check (`scripts/nodes_check.sh`) and reads what it left: a NodesCheck.
    `gpu`: this node's first GpuInfo, or None."""
    environ = dict(os.environ if environ is None else environ)
    work = os.path.abspath(work_dir or tempfile.mkdtemp(prefix="bert_preflight_nodes_"))
    out = os.path.join(work, "nodes")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    output = os.path.join(out, "allreduce.json")
    command = ["bash", SCRIPT, out, str(gradient_bytes), str(iterations)]
    if allow_cpu or gpu is None:
        command.append("--allow_cpu")
    base = dict(model=model_label, precision=precision, gradient_bytes=gradient_bytes)
    with open(os.path.join(out, "console.txt"), "w", encoding="utf-8") as writer:
        status = subprocess.call(command, stdout=writer, stderr=subprocess.STDOUT, env=environ,
                                 cwd=ROOT)
    with open(os.path.join(out, "console.txt"), encoding="utf-8", errors="replace") as reader:
        console = reader.read()
    if status != 0 or not os.path.isfile(output):
        said = [line for line in console.splitlines() if line.strip()]
        return NodesCheck(**base, failure=f"exit status {status}: " + (
            said[-1][:300] if said else "no output") + f" (all of it: {out}/console.txt)")
    with open(output, encoding="utf-8") as reader:
        result = json.load(reader)
    network = result.get("network")
    facts = nccl_log.parse("".join(open(path, encoding="utf-8", errors="replace").read()
                                   for path in sorted(glob.glob(os.path.join(out, "nccl.*")))))
    found = nccl_log.transports(facts)
    links, carried = links_of(found.inter_node, _interface(result) or _interface(environ))
    active = [line for line in links if line.endswith("ACTIVE")]
    window, how = (nvidia_window(gpu.name, gpu.memory_bytes, result["ranks"], precision)
                   if gpu is not None else (None, None))
    return NodesCheck(**base, network=network, result=result, nccl=found.description,
                      inter_node=found.inter_node,
                      fallback=nccl_log.socket_fallback(facts, active),
                      nccl_warnings=tuple(f"NCCL warned: {text}"
                                          for text in sorted(set(facts.warnings))),
                      links=links, link_gbytes_per_s=carried, window_seconds=window,
                      window_how=how)


def check_from_json(text):
    try:
        values = json.loads(text)
        values["nccl_warnings"] = tuple(values.get("nccl_warnings", ()))
        values["links"] = tuple(values.get("links", ()))
        return NodesCheck(**values)
    except (ValueError, TypeError) as err:
        raise UsageError(f"not a nodes check's JSON ({err})") from None
