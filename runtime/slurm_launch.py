"""Horovod ranks started by Slurm's `srun`, one task per GPU, with no ssh between nodes.

horovodrun starts the ranks of other hosts through ssh, which many clusters forbid between
compute nodes. Here `srun` starts every rank and Horovod's own Gloo rendezvous joins them,
the way horovodrun's Gloo launcher does (horovod/runner/gloo_run.py `launch_gloo`): the same
host plan (`get_host_assignments`), the same HTTP `RendezvousServer`, the same variables per
rank (`create_slot_env_vars`, `create_run_env_vars`). Two roles:

    python -m runtime.slurm_launch server --hosts node1:8,node2:8 [--network-interface ib0] \\
        -- srun --ntasks=16 --ntasks-per-node=8 ... python -m runtime.slurm_launch task -- CMD

* `server`, on the launching host (scripts/run.sub's batch shell): starts the rendezvous
  server with the plan, runs the command after `--` (srun) with the server's address, its
  port and the plan in the environment (srun passes its environment on to the tasks), stops
  the server when that command ends and exits with its status. It imports no TensorFlow.
* `task`, in each srun task: takes slot SLURM_PROCID of the same plan, checks that Slurm
  put the task where the plan has that rank (node SLURMD_NODENAME, local id SLURM_LOCALID,
  the step's task count): srun's block distribution numbers tasks node by node as the plan
  does, a cyclic or arbitrary one would give a rank another node's slot, so that is refused
  in one line. Then it sets Horovod's variables and execs the command.

Which interface (one phrase of it, BERT_NETWORK_CHOICE, reaches every rank for its plan line):
* NCCL_SOCKET_IFNAME, HOROVOD_GLOO_IFACE and NCCL_IB_HCA set by the user or the site (in the
  batch shell or the tasks' environment) are kept as they are; horovodrun, like Horovod's
  create_run_env_vars, would overwrite the first two.
* --network-interface (NETWORK_INTERFACE): that interface's address on the server's host and
  that interface in every task, as horovodrun's --network-interface.
* Neither: the server runs one quick srun step, one task a node, that describes each node's
  interfaces (runtime/node_network.py); an InfiniBand or RoCE interface with an IPv4 address
  on every node is taken (the server's address on it when its host has it).
* Otherwise, as horovodrun without ssh cannot ask the hosts: the server takes its address on
  the route to another node of the plan (127.0.0.1 when every node is this host), and each
  task the interface on its own route to that address.

The Gloo rendezvous waits HOROVOD_GLOO_TIMEOUT_SECONDS for every rank (Horovod's default 30 s;
horovod/horovod#2015 needed 240 s at 50 nodes). Ranks that import TensorFlow from a cold
shared file system arrive minutes apart, so the server sets DEFAULT_GLOO_TIMEOUT (600 s)
unless the user set one. The same limit bounds each Gloo operation (horovod/horovod#1374: a
first step compiling for minutes). It only lengthens the wait for a rank that never comes,
and srun's --wait (BERT_PEER_LOSS_WAIT, scripts/launch_common.sh) ends the step when a rank
dies first.
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys

import psutil
from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts, \
    parse_hosts_and_slots
from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars
from horovod.runner.http.http_server import RendezvousServer
from horovod.runner.util import network

from reporting.errors import UsageError
from runtime.node_network import choose_interface, read_descriptions

# Handed from the server to the tasks through srun's environment, beside Horovod's
# HOROVOD_GLOO_RENDEZVOUS_ADDR and HOROVOD_GLOO_RENDEZVOUS_PORT.
PLAN_ENV = "BERT_SLURM_HOSTS"
INTERFACE_ENV = "BERT_SLURM_INTERFACE"
REASON_ENV = "BERT_SLURM_INTERFACE_REASON"     # why that interface (or why the route)
ADDRESS_ENV, PORT_ENV = "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT"
CHOICE_ENV = "BERT_NETWORK_CHOICE"             # for each rank's plan line
# Kept as the user or the site set them; the first two are the ones Horovod would set.
NETWORK_VARIABLES = ("NCCL_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE", "NCCL_IB_HCA")
GLOO_TIMEOUT_ENV, DEFAULT_GLOO_TIMEOUT = "HOROVOD_GLOO_TIMEOUT_SECONDS", 600
ROUTE = "the route to the batch node"
PROBE_TIMEOUT = 300   # s for the probe step (srun may first wait for the nodes)


def host_plan(hosts):
    """horovodrun's plan for "node1:8,node2:8": one SlotInfo a rank, ranks node by node."""
    try:
        parse_hosts_and_slots(hosts)
        infos = parse_hosts(hosts)
    except ValueError:
        raise UsageError(f"--hosts {hosts!r}: expected NODE:RANKS[,NODE:RANKS...], e.g. "
                         "node1:8,node2:8") from None
    if any(info.slots < 1 for info in infos):
        raise UsageError(f"--hosts {hosts!r}: every node needs at least one rank")
    return get_host_assignments(infos, sum(info.slots for info in infos))


def interface_address(interface):
    """The IPv4 address of `interface` on this host."""
    for address in psutil.net_if_addrs().get(interface, []):
        if address.family == socket.AF_INET:
            return address.address
    raise UsageError(f"network interface {interface!r} (NETWORK_INTERFACE) has no IPv4 address "
                     f"on {socket.gethostname()}: interfaces here: "
                     f"{', '.join(sorted(psutil.net_if_addrs()))}")


def source_address(destination):
    """This host's address on its route to `destination` (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((destination, 9))
        except OSError as error:
            raise UsageError(f"no route from {socket.gethostname()} to {destination} "
                             f"({error.strerror}): set NETWORK_INTERFACE") from None
        return probe.getsockname()[0]


def interface_of(address):
    """The interface holding `address` on this host."""
    for interface, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addresses):
            return interface
    raise UsageError(f"no interface of {socket.gethostname()} holds {address}, its address "
                     "towards the rendezvous server: set NETWORK_INTERFACE")


def plan_nodes(plan):
    return list(dict.fromkeys(slot.hostname for slot in plan))


def server_address(plan, interface=None, required=True):
    """The address the tasks reach the server at (see the module's docstring); with
    `interface` not `required`, its address when this host has one, else the route's."""
    if interface:
        try:
            return interface_address(interface)
        except UsageError:
            if required:
                raise
    remote = network.filter_local_addresses(plan_nodes(plan))
    if not remote:
        return "127.0.0.1"
    address = network.resolve_host_address(remote[0])
    if address is None:
        raise UsageError(f"node {remote[0]} of --hosts does not resolve to an address on "
                         f"{socket.gethostname()}: set NETWORK_INTERFACE (e.g. ib0)")
    return source_address(address)


def user_network(env):
    """The interface variables the user or the site set: {name: value}, in a fixed order."""
    return {name: env[name] for name in NETWORK_VARIABLES if env.get(name)}


def gloo_timeout(env):
    """HOROVOD_GLOO_TIMEOUT_SECONDS as the ranks get it: the user's, checked, or 600."""
    value = env.get(GLOO_TIMEOUT_ENV) or str(DEFAULT_GLOO_TIMEOUT)
    if not value.isdigit() or int(value) < 1:
        raise UsageError(f"{GLOO_TIMEOUT_ENV}={value}: must be a whole number of seconds, at "
                         f"least 1 (unset: {DEFAULT_GLOO_TIMEOUT})")
    return value


def probe_network(nodes, env, srun="srun"):
    """The descriptions of `nodes` (runtime/node_network.py), from one srun step with one
    task a node, and why not where that step failed ("" when it ran)."""
    command = [srun, f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
               f"--nodelist={','.join(nodes)}", "--kill-on-bad-exit=1", "--cpu-bind=none",
               "--job-name=bert-network-probe", sys.executable, "-m", "runtime.node_network"]
    try:
        result = subprocess.run(command, env=env, capture_output=True, text=True,
                                timeout=PROBE_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as error:
        return [], f"the probe step did not run ({error})"
    descriptions = read_descriptions(result.stdout)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no message"])[-1]
        return descriptions, f"the probe step failed ({result.returncode}: {last})"
    return descriptions, ""


def choose_network(plan, interface, env):
    """(interface or None, why) for the tasks: NETWORK_INTERFACE; none when the user or
    the site set an interface variable; else InfiniBand/RoCE on every node (probed), else
    None with why the route is taken."""
    if interface:
        return interface, "NETWORK_INTERFACE"
    if user_network(env):
        return None, ROUTE
    if not shutil.which("srun", path=env.get("PATH")):
        return None, f"{ROUTE}; srun not found, the nodes' interfaces were not read"
    nodes = plan_nodes(plan)
    descriptions, failure = probe_network(nodes, env)
    chosen, why = choose_interface(descriptions, nodes)
    if chosen:
        return chosen, why
    if failure:
        print(f"slurm_launch: warning: {failure}; Gloo and NCCL use {ROUTE}", file=sys.stderr)
    return None, f"{ROUTE}; {why}"


def serve(hosts, interface, command):
    """The server role: rendezvous for `hosts`, `command` run with it; its exit status."""
    plan = host_plan(hosts)
    env = dict(os.environ)
    env[GLOO_TIMEOUT_ENV] = gloo_timeout(env)
    chosen, why = choose_network(plan, interface, env)
    address = server_address(plan, chosen, required=bool(interface))
    rendezvous = RendezvousServer()
    port = rendezvous.start()
    rendezvous.init(plan)
    env.update({ADDRESS_ENV: address, PORT_ENV: str(port), PLAN_ENV: hosts, REASON_ENV: why})
    env.pop(INTERFACE_ENV, None)
    if chosen:
        env[INTERFACE_ENV] = chosen
    try:
        return subprocess.call(command, env=env)
    except OSError as error:
        raise UsageError(f"cannot run {command[0]}: {error.strerror}") from None
    finally:
        rendezvous.stop()


def choice_phrase(user, interface, why):
    """BERT_NETWORK_CHOICE: "ib0 (InfiniBand, on every node)", "NCCL_SOCKET_IFNAME=ib0 (set
    by you or the site); Gloo: eth0 (the route to the batch node)", ..."""
    chosen = f"{interface} ({why})"
    if not user:
        return chosen
    kept = ", ".join(f"{name}={value}" for name, value in user.items())
    rest = [label for name, label in (("HOROVOD_GLOO_IFACE", "Gloo"),
                                      ("NCCL_SOCKET_IFNAME", "NCCL's sockets"))
            if name not in user]
    return f"{kept} (set by you or the site)" + (f"; {' and '.join(rest)}: {chosen}"
                                                  if rest else "")


def _whole(env, name):
    value = env.get(name, "")
    if not value.isdigit():
        raise UsageError(f"{name}={value!r}: not a task started by srun (run the command "
                         "through `python -m runtime.slurm_launch server ... -- srun ...`)")
    return int(value)


def task_env(env):
    """The task role's environment: `env` (a task's, from srun) plus Horovod's variables for
    its slot of the plan, as horovodrun gives a rank."""
    missing = [name for name in (PLAN_ENV, ADDRESS_ENV, PORT_ENV) if not env.get(name)]
    if missing:
        raise UsageError(f"{', '.join(missing)} not set: start the tasks through `python -m "
                         "runtime.slurm_launch server ... -- srun ...` (srun's default "
                         "--export=ALL passes them on)")
    plan = host_plan(env[PLAN_ENV])
    rank, local_id = _whole(env, "SLURM_PROCID"), _whole(env, "SLURM_LOCALID")
    tasks = _whole(env, "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env
                   else "SLURM_NTASKS")
    node = env.get("SLURMD_NODENAME", "")
    if tasks != len(plan):
        raise UsageError(f"srun started {tasks} tasks, the plan ({env[PLAN_ENV]}) has "
                         f"{len(plan)} ranks: give srun --ntasks={len(plan)}")
    if rank >= len(plan):
        raise UsageError(f"SLURM_PROCID={rank}: the plan ({env[PLAN_ENV]}) has ranks 0 to "
                         f"{len(plan) - 1}")
    slot = plan[rank]
    if (node, local_id) != (slot.hostname, slot.local_rank):
        raise UsageError(
            f"srun put task {rank} on node {node} as local task {local_id}; the plan "
            f"({env[PLAN_ENV]}, ranks node by node) has rank {rank} on {slot.hostname} as "
            f"local rank {slot.local_rank}: use srun's block distribution "
            f"(SLURM_DISTRIBUTION={env.get('SLURM_DISTRIBUTION', 'unset')})")
    user = user_network(env)
    result = dict(env, PYTHONUNBUFFERED="1")
    result.update(create_slot_env_vars(slot))
    result[GLOO_TIMEOUT_ENV] = gloo_timeout(env)
    # The interface for the variables the user or the site left unset (none when both are set).
    interface = env.get(INTERFACE_ENV)
    if not interface and not {"HOROVOD_GLOO_IFACE", "NCCL_SOCKET_IFNAME"} <= user.keys():
        interface = interface_of(source_address(env[ADDRESS_ENV]))
    result.update({name: str(value) for name, value in create_run_env_vars(
        env[ADDRESS_ENV], [interface or ""], env[PORT_ENV]).items() if name not in user})
    result[CHOICE_ENV] = choice_phrase(user, interface, env.get(REASON_ENV) or ROUTE)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m runtime.slurm_launch",
        description="Horovod ranks started by srun, joined by Horovod's Gloo rendezvous.")
    roles = parser.add_subparsers(dest="role", required=True)
    server = roles.add_parser("server", help="the rendezvous server; runs srun after --")
    server.add_argument("--hosts", required=True, help="the plan: NODE:RANKS,... (Slurm's "
                        "node names, in the step's node order)")
    server.add_argument("--network-interface", default=None,
                        help="the interface every rank talks on (e.g. ib0)")
    roles.add_parser("task", help="one srun task: Horovod's variables, then exec the command")
    argv = sys.argv[1:] if argv is None else list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:split]), argv[split + 1:]
    try:
        if not command:
            raise UsageError(f"{args.role}: no command after --")
        if args.role == "server":
            return serve(args.hosts, args.network_interface, command)
        env = task_env(dict(os.environ))
        try:
            os.execvpe(command[0], command, env)
        except OSError as error:
            raise UsageError(f"cannot run {command[0]}: {error.strerror}") from None
    except UsageError as error:
        print(f"slurm_launch: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
