"""A multi-node Ray cluster emulated on this machine: nodes as network namespaces with capped links.

Each node is a network namespace with its own address on a Linux bridge, its link to the bridge
capped by a token-bucket qdisc (`tc ... tbf`) in both directions, its own Ray node (`ray start
--address`) and its own cores (a cgroup v1 cpuset, the way a GPU node owns its devices). The Ray
head runs in the root namespace on the bridge's address, where the driver runs, and holds no
training workers. Ranks of one node talk over the node's own stack (fast); ranks of different
nodes cross the capped link. Compute is still this machine's CPU: an emulated cluster stands for
a cluster's *links*, not its speed (docs/emulated-cluster.md).

Everything is named with the `copus` prefix (namespaces copus-nI, links copus-vI, bridge
copusbr0, cpusets copus-*), so `down` finds and removes what any `up` left, whole or half made
(a crash or Ctrl-C midway), without a state file. Needs root, `ip`, `tc` and cgroup v1 cpusets.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from copus.core.topology import emulated_addresses

BRIDGE = "copusbr0"
NODE_IFNAME = "copus0"  # a node's end of its link: one name in every namespace (GLOO_SOCKET_IFNAME)
CPUSET_ROOT = Path("/sys/fs/cgroup/cpuset")
HEAD_CGROUP = "copus-head"
SLOT = "copus_slot"  # a node's training-worker slots: workers land on nodes in equal shares
OBJECT_STORE_BYTES = 256 * 1024**2
START_TIMEOUT_S = 120.0


class EmulationError(RuntimeError):
    """What stops an emulated cluster, phrased as one line."""


@dataclass(frozen=True)
class EmulatedSpec:
    """One emulated cluster, as plain values (read from cluster.emulate and the worker count)."""

    nodes: int
    link_mbit: float
    cores_per_node: int
    subnet: str
    port: int
    state_dir: str
    workers_per_node: int
    cpus_per_node: int  # the CPUs each node advertises to Ray: its workers' share, rounded up
    # The links' routes' TCP congestion control (host: the machine's). from_config always passes
    # the config's (cubic by default); this default is what a state file written before the field
    # existed means: its cluster was brought up with the machine's.
    congestion_control: str = "host"

    @classmethod
    def from_config(cls, cfg) -> EmulatedSpec:
        """From an experiment's config; the link at its rate on this machine (emulate_link)."""
        from copus.cluster.emulate_link import link_rate

        c, e = cfg.cluster, cfg.cluster.emulate
        per_node = c.num_workers // e.nodes
        return cls(
            nodes=e.nodes,
            link_mbit=link_rate(cfg).link_mbit,
            cores_per_node=e.cores_per_node,
            subnet=e.subnet,
            port=e.port,
            state_dir=str(e.state_dir),
            workers_per_node=per_node,
            cpus_per_node=max(1, math.ceil(per_node * c.cpus_per_worker - 1e-9)),
            congestion_control=e.congestion_control,
        )

    def describe(self) -> str:
        tcp = "" if self.congestion_control == "host" else f", TCP {self.congestion_control}"
        return (
            f"{self.nodes} nodes x {self.workers_per_node} workers, {self.cores_per_node} core(s) each, "
            f"links {self.link_mbit:g} Mbit/s{tcp}"
        )


def netns(i: int) -> str:
    return f"copus-n{i}"


def host_veth(i: int) -> str:
    return f"copus-v{i}"


def node_cgroup(i: int) -> str:
    return f"copus-n{i}"


def requirements_problem() -> str | None:
    """Why an emulated cluster cannot be made here (None when it can): one line naming the need."""
    if os.geteuid() != 0:
        return (
            "an emulated cluster needs root (network namespaces, tc, cpusets); run as root or leave cluster.emulate out"
        )
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"an emulated cluster needs `{tool}` (Debian's iproute2) on PATH"
    if not (CPUSET_ROOT / "cpuset.cpus").exists():
        return f"an emulated cluster needs cgroup v1 cpusets mounted at {CPUSET_ROOT}"
    if not Path("/var/run/netns").exists() and not _can_make_netns():
        return "an emulated cluster needs network namespaces (`ip netns add` failed)"
    return None


AVAILABLE_CONGESTION = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")


def congestion_problem(name: str) -> str | None:
    """Why `cluster.emulate.congestion_control: name` cannot be used here (None when it can)."""
    if name == "host":
        return None
    available = AVAILABLE_CONGESTION.read_text().split() if AVAILABLE_CONGESTION.exists() else []
    if name not in available:
        return (
            f"cluster.emulate.congestion_control: {name!r} is not available in this kernel "
            f"(available: {', '.join(available) or 'none listed'}, or host)"
        )
    return None


def _set_congestion(spec: EmulatedSpec, dev: str, ip: str, namespace: str | None) -> None:
    """The route to the subnet through `dev` with the spec's TCP congestion control: every
    socket over the links uses it, whatever the machine's default (no sysctl needed)."""
    if spec.congestion_control == "host":
        return
    net = str(ipaddress.IPv4Network(spec.subnet, strict=False))
    cmd = ["ip", *(["-n", namespace] if namespace else []), "route", "replace", net, "dev", dev]
    _run([*cmd, "proto", "kernel", "scope", "link", "src", ip, "congctl", spec.congestion_control], f"routing {dev}")


def _can_make_netns() -> bool:
    probe = "copus-probe"
    ok = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ok


def _run(cmd: list[str], what: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise EmulationError(f"{what} failed: {' '.join(cmd)}: {detail[-1] if detail else f'exit {done.returncode}'}")
    return done.stdout


def _machine_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def node_cores(i: int, cores_per_node: int, machine: list[int]) -> list[int]:
    """Node i's cores (i from 1): consecutive blocks of the machine's, wrapping round when the
    nodes ask for more cores than it has (then nodes share)."""
    start = (i - 1) * cores_per_node
    return [machine[(start + k) % len(machine)] for k in range(cores_per_node)]


def _make_cpuset(name: str, cores: list[int]) -> None:
    path = CPUSET_ROOT / name
    path.mkdir(exist_ok=True)
    mems = (CPUSET_ROOT / "cpuset.mems").read_text().strip()
    (path / "cpuset.mems").write_text(mems)
    (path / "cpuset.cpus").write_text(",".join(str(c) for c in cores))


def shape_link(dev: str, mbit: float, namespace: str | None = None) -> None:
    """Cap `dev`'s outgoing traffic at `mbit` with a token bucket. Its burst holds at least one
    timer tick of traffic at that rate (so the rate is reachable) and 32 kbit at the least."""
    burst_bytes = max(4096, int(mbit * 1e6 / 8 / 250))
    cmd = ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{mbit:g}mbit"]
    cmd += ["burst", str(burst_bytes), "latency", "50ms"]
    _run(["ip", "netns", "exec", namespace, *cmd] if namespace else cmd, f"shaping {dev}")


def _make_network(spec: EmulatedSpec) -> tuple[str, list[str]]:
    head_ip, node_ips = emulated_addresses(spec.subnet, spec.nodes)
    prefix = spec.subnet.split("/")[1]
    _run(["ip", "link", "add", BRIDGE, "type", "bridge"], "making the bridge")
    _run(["ip", "addr", "add", f"{head_ip}/{prefix}", "dev", BRIDGE], "addressing the bridge")
    _run(["ip", "link", "set", BRIDGE, "up"], "raising the bridge")
    _set_congestion(spec, BRIDGE, head_ip, None)
    for i, ip in enumerate(node_ips, start=1):
        ns, veth = netns(i), host_veth(i)
        _run(["ip", "netns", "add", ns], f"making namespace {ns}")
        _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", NODE_IFNAME, "netns", ns], f"linking {ns}")
        _run(["ip", "link", "set", veth, "master", BRIDGE, "up"], f"bridging {veth}")
        _run(["ip", "-n", ns, "addr", "add", f"{ip}/{prefix}", "dev", NODE_IFNAME], f"addressing {ns}")
        _run(["ip", "-n", ns, "link", "set", NODE_IFNAME, "up"], f"raising {ns}'s link")
        _run(["ip", "-n", ns, "link", "set", "lo", "up"], f"raising {ns}'s loopback")
        _set_congestion(spec, NODE_IFNAME, ip, ns)
        shape_link(veth, spec.link_mbit)  # traffic into the node
        shape_link(NODE_IFNAME, spec.link_mbit, ns)  # traffic out of it
    return head_ip, node_ips


def _ray_env(state_dir: Path, ifname: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(client_env(state_dir))
    env.update({"GLOO_SOCKET_IFNAME": ifname, "RAY_USAGE_STATS_ENABLED": "0"})
    return env


def client_env(state_dir: Path | str) -> dict[str, str]:
    """What a Ray client (driver, `ray job submit`) needs in its environment to join: the
    cluster's own token (Ray 2.60 enables token authentication)."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(Path(state_dir) / "auth_token")}


def in_node_command(cgroup: str, namespace: str | None, argv: list[str]) -> list[str]:
    """`argv` run inside `cgroup` and `namespace` (the cgroup joined first: `ip netns exec`
    remounts /sys, hiding the cgroup tree); its children inherit both."""
    inner = (["ip", "netns", "exec", namespace] if namespace else []) + argv
    procs = CPUSET_ROOT / cgroup / "cgroup.procs"
    return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *inner]


def node_popen(i: int, argv: list[str], **kwargs) -> subprocess.Popen:
    """A process on emulated node i (its namespace and cores), e.g. a link benchmark's end."""
    return subprocess.Popen(in_node_command(node_cgroup(i), netns(i), argv), **kwargs)


def _ray_start(starts: list[tuple[str, str | None, list[str], dict]], log: Path) -> None:
    """`ray start ARGS` on each (cgroup, namespace or None for the head, args, env), one after
    the other: nodes share the head's session directory, and Ray picks its socket names there
    by trying (two at once can take the same). Their daemons stay in the node's namespace and
    cpuset."""
    for cgroup, namespace, args, env in starts:
        argv = [sys.executable, "-m", "ray.scripts.scripts", "start", *args, "--disable-usage-stats"]
        with open(log, "a") as out:
            try:
                code = subprocess.run(
                    in_node_command(cgroup, namespace, argv),
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=START_TIMEOUT_S,
                ).returncode
            except subprocess.TimeoutExpired:
                raise EmulationError(
                    f"`ray start` for {namespace or 'the head'} took over {START_TIMEOUT_S:.0f} s"
                ) from None
        if code != 0:
            lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
            raise EmulationError(
                f"`ray start` for {namespace or 'the head'} failed (exit {code}): {lines[-1] if lines else '?'}"
            )


def _free_agent_ports() -> list[str]:
    """The head shares the root namespace with any other Ray on the machine (a user's, a test's
    local instance): its agents take free ports instead of Ray's fixed defaults. The nodes have
    namespaces, hence ports, of their own."""
    names = ("dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port")
    names += ("metrics-export-port", "ray-client-server-port")
    return [f"--{name}={_free_port()}" for name in names]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _start_ray(spec: EmulatedSpec, head_ip: str, node_ips: list[str], state_dir: Path) -> None:
    log = state_dir / "ray-start.log"
    machine = _machine_cores()
    _make_cpuset(HEAD_CGROUP, machine)
    head = ["--head", f"--node-ip-address={head_ip}", f"--port={spec.port}", "--num-cpus=0"]
    head += [f"--temp-dir={state_dir / 'ray'}", f"--object-store-memory={OBJECT_STORE_BYTES}"]
    head += [f"--dashboard-host={head_ip}", f"--dashboard-port={spec.port + 1}", *_free_agent_ports()]
    _ray_start([(HEAD_CGROUP, None, head, _ray_env(state_dir, BRIDGE))], log)
    starts = []
    for i, ip in enumerate(node_ips, start=1):
        _make_cpuset(node_cgroup(i), node_cores(i, spec.cores_per_node, machine))
        starts.append(_node_start(spec, i, ip, head_ip, state_dir))
    _ray_start(starts, log)


def _node_start(spec: EmulatedSpec, i: int, ip: str, head_ip: str, state_dir: Path) -> tuple:
    """What `ray start` needs for node i: its cpuset, namespace, arguments and environment."""
    node = [f"--address={head_ip}:{spec.port}", f"--node-ip-address={ip}", f"--num-cpus={spec.cpus_per_node}"]
    node += [f"--resources={json.dumps({SLOT: spec.workers_per_node})}"]
    node += [f"--object-store-memory={OBJECT_STORE_BYTES}"]
    return node_cgroup(i), netns(i), node, _ray_env(state_dir, NODE_IFNAME)


def kill_node(state_dir: Path | str, i: int) -> int:
    """Lose node i as a machine is lost: SIGKILL every process of its namespace (its Ray node,
    its training ranks). Its namespace, link and cpuset stay, for `restart_node`. Only the
    processes there when it is lost must die: the cluster's supervisor may start a replacement
    Ray node in the namespace before they have (as a replaced machine joins), and that one lives."""
    lost = set(_namespace_pids(netns(i)))
    return _kill_all(lambda: lost & set(_namespace_pids(netns(i))), grace_s=0.0)


def restart_node(state_dir: Path | str, i: int) -> None:
    """Bring node i back as a fresh Ray node (the way a replaced machine rejoins), with the
    address, slots and cores it had."""
    state = read_state(state_dir)
    if state is None:
        raise EmulationError(f"no emulated cluster is up (state in {state_dir})")
    spec = EmulatedSpec(**state["spec"])
    _kill_all(lambda: set(_namespace_pids(netns(i))), grace_s=0.0)  # a raylet that outlived its death
    ip = state["nodes"][i - 1]["ip"]
    _ray_start([_node_start(spec, i, ip, state["head_ip"], Path(state_dir))], Path(state_dir) / "ray-start.log")


def _raylet_alive(namespace: str) -> bool:
    for pid in _namespace_pids(namespace):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet":
                return True
    return False


def supervise(state_dir: Path | str, poll_s: float = 1.0) -> None:
    """Restart every node whose Ray node has died, as a cluster manager replaces a failed
    machine: one killed, or one the head declared dead while its link was cut (its raylet exits
    when it hears so). Started by `up` in the head's cpuset; ends with the state file."""
    while True:
        state = read_state(state_dir)
        if state is None:
            return
        for i, node in enumerate(state["nodes"], start=1):
            if not _raylet_alive(node["name"]):
                try:
                    restart_node(state_dir, i)
                    print(f"{time.strftime('%H:%M:%S')} restarted {node['name']}", flush=True)
                except EmulationError as err:  # its link may still be down: try again next round
                    print(f"{time.strftime('%H:%M:%S')} {node['name']}: {err}", flush=True)
        time.sleep(poll_s)


def _start_supervisor(state_dir: Path) -> None:
    argv = [sys.executable, "-m", "copus.cluster.emulate", "supervise", str(state_dir)]
    with open(state_dir / "supervisor.log", "a") as out:
        subprocess.Popen(
            in_node_command(HEAD_CGROUP, None, argv), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def state_path(state_dir: Path | str) -> Path:
    return Path(state_dir) / "state.json"


def read_state(state_dir: Path | str) -> dict | None:
    """The state file of the cluster that is up (None when there is none, or it is unreadable:
    a cluster whose `up` did not finish has no state file)."""
    try:
        return json.loads(state_path(state_dir).read_text())
    except (OSError, ValueError):
        return None


def _write_state(state_dir: Path, state: dict) -> None:
    tmp = state_path(state_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(state_path(state_dir))


# Run by a fresh interpreter: Ray reads its authentication mode when first used, so a client of
# the emulated cluster needs client_env() in its environment before `import ray`.
_COUNT_NODES = """
import sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
deadline = time.monotonic() + float(sys.argv[3])
while True:
    alive = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get(sys.argv[2])]
    if len(alive) >= int(sys.argv[4]) or time.monotonic() > deadline:
        break
    time.sleep(0.5)
print(len(alive))
"""


def _wait_for_nodes(address: str, spec: EmulatedSpec, state_dir: Path) -> None:
    """Until every node has joined with its slots (Ray's own view, from a short-lived client)."""
    env = {**os.environ, **client_env(state_dir)}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-c", _COUNT_NODES, address, SLOT, str(START_TIMEOUT_S), str(spec.nodes)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S + 60)
    joined = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
    if not joined or int(joined[0]) < spec.nodes:
        why = f"{joined[0]} of {spec.nodes} nodes joined" if joined else (done.stderr.strip().splitlines() or ["?"])[-1]
        raise EmulationError(f"the emulated cluster at {address} did not come up: {why}")


def up(spec: EmulatedSpec, echo: Callable[[str], None] = print) -> dict:
    """Bring the emulated cluster up and return its state. Idempotent for the same spec while it
    is up; refuses in one line when another is up. Whatever a failed or interrupted `up` made is
    taken down again before the error goes on."""
    problem = requirements_problem() or congestion_problem(spec.congestion_control)
    if problem:
        raise EmulationError(problem)
    state_dir = Path(spec.state_dir)
    current = status(state_dir)
    if current is not None and current["healthy"]:
        if current["spec"] == asdict(spec):
            return current
        raise EmulationError(
            f"another emulated cluster is up ({EmulatedSpec(**current['spec']).describe()}); `copus cluster down` first"
        )
    down(state_dir, echo=lambda _: None)  # leftovers of a crashed `up` or of dead nodes
    try:
        return _bring_up(spec, state_dir, echo)
    except BaseException:
        down(state_dir, echo=lambda _: None)
        raise


def _bring_up(spec: EmulatedSpec, state_dir: Path, echo: Callable[[str], None]) -> dict:
    started = time.monotonic()
    state_dir.mkdir(parents=True, exist_ok=True)
    token = state_dir / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    head_ip, node_ips = _make_network(spec)
    _start_ray(spec, head_ip, node_ips, state_dir)
    address = f"{head_ip}:{spec.port}"
    _wait_for_nodes(address, spec, state_dir)
    state = {
        "spec": asdict(spec),
        "address": address,
        "dashboard": f"http://{head_ip}:{spec.port + 1}",
        "head_ip": head_ip,
        "nodes": [{"name": netns(i), "ip": ip, "link": host_veth(i)} for i, ip in enumerate(node_ips, start=1)],
        "env": client_env(state_dir),
        "started_at": time.time(),
    }
    _write_state(state_dir, state)
    _start_supervisor(state_dir)
    echo(f"emulated cluster up in {time.monotonic() - started:.0f} s: {spec.describe()}, head {address}")
    return state


def reshape(state_dir: Path | str, link_mbit: float) -> dict:
    """Re-cap every node's link of the cluster that is up at `link_mbit` (both directions), in
    place: Ray and its workers keep running (a sweep over link rates needs no restart)."""
    state = status(state_dir)
    if state is None or not state["healthy"]:
        raise EmulationError(f"no healthy emulated cluster is up (state in {state_dir})")
    for node in state["nodes"]:
        shape_link(node["link"], link_mbit)
        shape_link(NODE_IFNAME, link_mbit, node["name"])
    state["spec"]["link_mbit"] = float(link_mbit)
    _write_state(Path(state_dir), {k: v for k, v in state.items() if k != "healthy"})
    return state


def status(state_dir: Path | str) -> dict | None:
    """The state of the cluster that is up, with `healthy`: every node's namespace and processes
    there and the head answering. None when no `up` finished here."""
    state = read_state(state_dir)
    if state is None:
        return None
    namespaces = set(_our_namespaces())
    nodes_ok = all(n["name"] in namespaces and _namespace_pids(n["name"]) for n in state["nodes"])
    state["healthy"] = bool(nodes_ok and _cgroup_pids(HEAD_CGROUP) and _answers(state["address"]))
    return state


def _answers(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=2):
        return True
    return False


def _our_namespaces() -> list[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in done.stdout.splitlines() if line.startswith("copus-")]


def _namespace_pids(ns: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()]


def _our_cgroups() -> list[Path]:
    return sorted(CPUSET_ROOT.glob("copus-*")) if CPUSET_ROOT.exists() else []


def _cgroup_pids(name: str) -> list[int]:
    try:
        return [int(p) for p in (CPUSET_ROOT / name / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _our_pids() -> set[int]:
    pids = {p for cg in _our_cgroups() for p in _cgroup_pids(cg.name)}
    pids.update(p for ns in _our_namespaces() for p in _namespace_pids(ns))
    pids.discard(os.getpid())
    return pids


def _kill_all(pids_of: Callable[[], set[int]], grace_s: float = 3.0) -> int:
    """SIGTERM every process `pids_of` names, then SIGKILL what is left after `grace_s` (at
    once, with no SIGTERM, when it is 0: a machine lost, not stopped)."""
    first = pids_of()
    stages = ([(signal.SIGTERM, grace_s)] if grace_s > 0 else []) + [(signal.SIGKILL, 5.0)]
    for sig, wait in stages:
        for pid in pids_of():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while pids_of() and time.monotonic() < deadline:
            time.sleep(0.2)
    left = pids_of()
    if left:
        raise EmulationError(f"processes of the emulated cluster would not die: {sorted(left)[:8]}")
    return len(first)


def _our_links() -> list[str]:
    done = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True)
    names = [line.split(":")[1].strip().split("@")[0] for line in done.stdout.splitlines() if ":" in line]
    return [n for n in names if n == BRIDGE or n.startswith("copus-v")]


def down(state_dir: Path | str, echo: Callable[[str], None] = print) -> dict:
    """Take down whatever an emulated cluster left on this machine, whole or half made: its
    processes, namespaces, links (and their qdiscs), cpusets and state directory. Safe to call
    when nothing is up. Returns what it removed, by kind."""
    removed = {"processes": _kill_all(_our_pids)}
    namespaces = _our_namespaces()
    for ns in namespaces:
        _run(["ip", "netns", "del", ns], f"removing namespace {ns}")
    links = _our_links()  # the host ends of the veths go with their namespace's end
    for link in links:
        subprocess.run(["ip", "link", "del", link], capture_output=True)
    cgroups = _our_cgroups()
    for cg in cgroups:
        cg.rmdir()
    removed.update(namespaces=len(namespaces), links=len(links), cpusets=len(cgroups))
    state_dir = Path(state_dir)
    if state_dir.exists():
        shutil.rmtree(state_dir, ignore_errors=True)  # a file another `down` removed first is fine
        if state_dir.exists():
            raise EmulationError(f"could not remove the emulated cluster's state directory {state_dir}")
        removed["state_dir"] = str(state_dir)
    if any(removed[k] for k in ("processes", "namespaces", "links", "cpusets")):
        echo(
            f"emulated cluster down: {removed['processes']} processes, {removed['namespaces']} namespaces, "
            f"{removed['links']} links, {removed['cpusets']} cpusets removed"
        )
    else:
        echo("no emulated cluster was up")
    return removed


@contextlib.contextmanager
def emulated_cluster(spec: EmulatedSpec, echo: Callable[[str], None] = print) -> Iterator[dict]:
    """The emulated cluster for a command: the one that is up when it matches `spec`, else one
    brought up for this command and taken down after it."""
    current = status(spec.state_dir)
    if current is not None and current["healthy"] and current["spec"] == asdict(spec):
        yield current
        return
    state = up(spec, echo)
    try:
        yield state
    finally:
        _leave_ray()
        down(spec.state_dir, echo)


def _leave_ray() -> None:
    """Disconnect this process from the cluster about to be taken down: a driver still attached
    when its head is killed has Ray's error-listener thread print a traceback after the command's
    own output (`ray_listen_error_messages`: "Received http2 header with status: 404")."""
    if "ray" in sys.modules:  # only a command that used Ray joined it
        import ray

        if ray.is_initialized():
            ray.shutdown()


if __name__ == "__main__":  # `python -m copus.cluster.emulate supervise STATE_DIR` (started by `up`)
    if sys.argv[1:2] == ["supervise"] and len(sys.argv) == 3:
        supervise(sys.argv[2])
    else:
        sys.exit("usage: python -m copus.cluster.emulate supervise STATE_DIR")
