"""A cluster on one box: nodes as network namespaces joined by shaped links.

A *node* here is what a cluster node is to MPI: its own hostname, its own
``/dev/shm`` (memory that only its processes share) and one network interface
whose bytes cross a link of a set rate. It is made of

* a network namespace ``<name>-<host>`` with ``eth0`` (a veth pair whose other end
  is a port of the bridge ``<name>-br`` in the root namespace) and ``lo``;
* a *holder* process, ``sleep infinity`` inside that network namespace and in
  new UTS, IPC and mount namespaces: the hostname is the host's name, ``/dev/shm``
  is a tmpfs of the node's own, System V IPC is the node's own. Everything that
  runs on the node enters the holder's namespaces (``nsenter``), so a job's ranks
  and a later job on the same node see the same ``/dev/shm``;
* ``tc tbf`` on both ends of the veth: each node's link carries ``rate`` bits per
  second in each direction, like a full-duplex NIC. This kernel has no ``netem``,
  so there is no added latency: a message costs what the veth, the bridge and
  TCP cost (measured in ``docs/results/network.md``).

Addresses: every address lives inside a namespace this module made (the nodes'
``eth0``, ``10.X.Y.Z/24``); the bridge and the root-side veths get none (and no
IPv6 link-local either), so the box's own network is never touched. Names
resolve through ``/etc/netns/<name>-<host>/hosts``, which ``ip netns exec``
mounts over ``/etc/hosts`` in the node.

MPI across the nodes: MPICH's ``mpiexec`` runs on the first node (as a batch
script runs on a job's first node) with ``-launcher ssh -launcher-exec
scripts/cluster/node-ssh -iface eth0``; ``node-ssh`` stands in for ssh and
enters the node named like the host. ``UCX_TLS=tcp,self``: otherwise UCX finds
shared memory across the namespaces and no byte crosses the link; ranks of one
node still talk through MPICH's own shared memory in their node's ``/dev/shm``.
Open MPI's ``mpirun`` (a site MPI, ``scripts/install.sh --site-mpi``) needs
``--mca plm_rsh_agent node-ssh``, ``--mca oob_tcp_if_include eth0``, ``--mca
btl_tcp_if_include eth0`` and ``--mca btl tcp,self,vader``
(:meth:`Cluster.openmpi_args`); Debian's Open MPI 4.1 ran across the nodes so.

Usage (root; ``scripts/cluster/localnet.sh`` runs this module)::

    scripts/cluster/localnet.sh up 2 --rate 1gbit   # nodes n1, n2
    scripts/cluster/localnet.sh status
    .venv/bin/python -m experiments.train --hosts n1,n2 --np 4
    scripts/cluster/localnet.sh rate n2 10gbit       # change a link while it runs
    scripts/cluster/localnet.sh link n2 down         # faults: link, freeze, kill
    scripts/cluster/localnet.sh down                 # removes all of it

The state (nodes, holders' pids, rate) is kept in ``/run/research-localnet/<name>``
(``RESEARCH_LOCALNET_DIR`` names it for the launcher and ``node-ssh``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: Where clusters keep their state: one folder per cluster name.
STATE_ROOT = Path("/run/research-localnet")
DEFAULT_NAME = "rs"
#: The environment variable naming a cluster's state folder.
DIR_ENV = "RESEARCH_LOCALNET_DIR"
REPO = Path(__file__).resolve().parent.parent
NODE_SSH = REPO / "scripts" / "cluster" / "node-ssh"
#: Environment every rank on the nodes gets (see the module docstring).
MPI_ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "eth0"}
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$")
_RATE_SCALE = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_NAME = re.compile(r"^[a-z][a-z0-9]{0,5}$")


class LocalnetError(Exception):
    """Something the user must fix or know; the message is one line."""


def parse_rate(rate: str) -> float:
    """``"1gbit"`` as bits per second (tc's units: bit kbit mbit gbit tbit)."""
    m = _RATE.match(rate.strip().lower())
    if not m or float(m.group(1)) <= 0:
        raise LocalnetError(
            f"bad rate {rate!r}: expected a number and one of bit kbit mbit gbit "
            "tbit, e.g. 1gbit, 10gbit, 1mbit"
        )
    return float(m.group(1)) * _RATE_SCALE[m.group(2)]


def tbf_args(rate: str) -> list[str]:
    """``tc`` arguments of a token bucket for ``rate``: a bucket of 1 ms of
    traffic (at least 64 KB, so a TSO segment passes whole) and 20 ms of queue."""
    bits = parse_rate(rate)
    burst = max(int(bits / 8 * 1e-3), 64 * 1024)
    return ["tbf", "rate", rate, "burst", str(burst), "latency", "20ms"]


@dataclass
class Node:
    host: str
    netns: str
    veth: str  # the root-namespace end, a port of the bridge
    ip: str
    pid: int = 0  # the holder
    rate: str = ""  # the link's, as last set

    def alive(self) -> bool:
        return self.pid > 0 and _pid_alive(self.pid)


@dataclass
class Cluster:
    """One cluster's state, as saved in its folder."""

    name: str
    subnet: str  # "10.X.Y"
    bridge: str
    rate: str
    shm_size: str
    nodes: list[Node] = field(default_factory=list)

    # -- state ------------------------------------------------------------------
    @staticmethod
    def folder(name: str = DEFAULT_NAME) -> Path:
        return STATE_ROOT / name

    @classmethod
    def load(cls, name: str | None = None) -> Cluster:
        """The cluster ``name`` (default: ``$RESEARCH_LOCALNET_DIR``, else ``rs``)."""
        path = (
            cls.folder(name)
            if name
            else Path(os.environ.get(DIR_ENV) or cls.folder(DEFAULT_NAME))
        )
        try:
            raw = json.loads((path / "cluster.json").read_text())
        except FileNotFoundError:
            raise LocalnetError(
                f"no local cluster at {path}: start one with "
                "`scripts/cluster/localnet.sh up 2`"
            ) from None
        raw["nodes"] = [Node(**n) for n in raw["nodes"]]
        return cls(**raw)

    @property
    def dir(self) -> Path:
        return self.folder(self.name)

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "hosts").mkdir(exist_ok=True)
        for node in self.nodes:  # read by node-ssh, which is a shell script
            (self.dir / "hosts" / node.host).write_text(f"{node.pid}\n")
        tmp = self.dir / "cluster.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(self.dir / "cluster.json")

    def node(self, host: str) -> Node:
        for node in self.nodes:
            if node.host == host:
                return node
        names = ", ".join(n.host for n in self.nodes)
        raise LocalnetError(f"no node {host!r} in cluster {self.name!r} ({names})")

    def hosts(self) -> list[str]:
        return [n.host for n in self.nodes]

    # -- running things on nodes --------------------------------------------------
    def enter(self, host: str, cwd: str | None = None) -> list[str]:
        """The command prefix that runs a program on ``host`` (its namespaces),
        in ``cwd`` (default: this process's working folder; the nodes share the
        file system, as a cluster's nodes share their home and project folders)."""
        node = self.node(host)
        if not node.alive():
            raise LocalnetError(f"node {host} is down (its holder {node.pid} is gone)")
        wd = cwd or os.getcwd()
        return [
            "nsenter",
            "-t",
            str(node.pid),
            "-n",
            "-u",
            "-m",
            "-i",
            f"--wd={wd}",
            "--",
        ]

    def pids(self, host: str, *, holder: bool = False) -> list[int]:
        """Processes on ``host`` (its network namespace's), the holder if asked."""
        node = self.node(host)
        out = _run(["ip", "netns", "pids", node.netns], check=False).stdout.split()
        return sorted(int(p) for p in out if holder or int(p) != node.pid)

    @staticmethod
    def launcher_args() -> list[str]:
        """MPICH ``mpiexec`` arguments that start proxies on the nodes."""
        return ["-launcher", "ssh", "-launcher-exec", str(NODE_SSH), "-iface", "eth0"]

    def mpiexec_args(self, hosts: list[tuple[str, int]]) -> list[str]:
        """``mpiexec`` arguments that start ranks on ``hosts`` ``[(host, ranks)]``."""
        for host, _ in hosts:
            self.node(host)
        spec = ",".join(f"{h}:{n}" for h, n in hosts)
        return [*self.launcher_args(), "-hosts", spec]

    def openmpi_args(self, hosts: list[tuple[str, int]]) -> list[str]:
        """Open MPI ``mpirun`` arguments that start ranks on ``hosts``: its rsh
        launcher through ``node-ssh``, its out-of-band and byte transfer over
        the nodes' ``eth0`` (TCP), shared memory (vader) within a node."""
        for host, _ in hosts:
            self.node(host)
        args = ["--host", ",".join(f"{h}:{n}" for h, n in hosts)]
        args += ["--mca", "plm_rsh_agent", str(NODE_SSH)]
        args += ["--mca", "oob_tcp_if_include", "eth0"]
        args += [
            "--mca",
            "btl_tcp_if_include",
            "eth0",
            "--mca",
            "btl",
            "tcp,self,vader",
        ]
        if os.geteuid() == 0:
            args.append("--allow-run-as-root")
        return args

    def env(self) -> dict[str, str]:
        """Environment for a job on the nodes (the launcher's and the ranks')."""
        return {**MPI_ENV, DIR_ENV: str(self.dir)}

    # -- faults and shaping ---------------------------------------------------------
    def set_rate(self, host: str, rate: str) -> None:
        """Change ``host``'s link to ``rate`` in both directions, now."""
        node = self.node(host)
        args = tbf_args(rate)
        _run(["tc", "-n", node.netns, "qdisc", "replace", "dev", "eth0", "root", *args])
        _run(["tc", "qdisc", "replace", "dev", node.veth, "root", *args])
        node.rate = rate
        self.save()

    def rates(self) -> str:
        """The links' rate (one when all nodes share it, else each node's)."""
        rates = {n.rate or self.rate for n in self.nodes}
        if len(rates) == 1:
            return rates.pop()
        return ", ".join(f"{n.host} {n.rate or self.rate}" for n in self.nodes)

    def set_link(self, host: str, up: bool) -> None:
        node = self.node(host)
        state = "up" if up else "down"
        _run(["ip", "-n", node.netns, "link", "set", "eth0", state])

    def signal(self, host: str, sig: int, *, holder: bool = False) -> list[int]:
        hit = []
        for pid in self.pids(host, holder=holder):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                hit.append(pid)
        return hit

    def kill(self, host: str) -> None:
        """Kill every process of ``host``, its holder too: the node and its
        ``/dev/shm`` are gone (``start`` brings a fresh one back)."""
        node = self.node(host)
        self.signal(host, signal.SIGCONT, holder=True)
        _kill_all(lambda: self.pids(host, holder=True))
        node.pid = 0
        self.save()

    def start(self, host: str) -> None:
        """(Re)start ``host``'s holder: a fresh hostname and an empty ``/dev/shm``."""
        node = self.node(host)
        if node.alive():
            raise LocalnetError(f"node {host} is already up (holder {node.pid})")
        node.pid = _start_holder(self.dir, node, self.shm_size)
        self.save()


# -- making and removing a cluster -----------------------------------------------------
def check_can_run() -> None:
    """One line saying why nodes cannot be made here, raised; else nothing."""
    if os.geteuid() != 0:
        raise LocalnetError(
            "needs root (network namespaces, veth pairs and tc): run as root, "
            "e.g. `sudo scripts/cluster/localnet.sh up 2`"
        )
    for tool in ("ip", "tc", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            raise LocalnetError(
                f"{tool} not found: install iproute2 and util-linux "
                "(apt-get install iproute2 util-linux)"
            )
    probe = f"rsprobe{os.getpid() % 100000}"
    made = _run(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        raise LocalnetError(
            f"cannot make a network namespace here (`ip netns add`: "
            f"{made.stderr.strip() or 'failed'}); a container needs CAP_SYS_ADMIN"
        )
    _run(["ip", "netns", "del", probe], check=False)


def up(
    n: int,
    *,
    rate: str = "1gbit",
    name: str = DEFAULT_NAME,
    shm_size: str = "4g",
) -> Cluster:
    """Make ``n`` nodes ``n1..n{n}`` joined through one bridge at ``rate`` each.

    Leaves nothing behind when it fails half-way (everything made is removed).
    """
    if not _NAME.match(name):
        raise LocalnetError(
            f"bad cluster name {name!r}: 1-6 lowercase letters and digits, "
            "starting with a letter (interface names are at most 15 characters)"
        )
    if not 1 <= n <= 64:
        raise LocalnetError(f"a cluster has 1 to 64 nodes, not {n}")
    parse_rate(rate)
    check_can_run()
    exists = (Cluster.folder(name) / "cluster.json").exists()
    if exists or any(_leftovers(name).values()):
        option = "" if name == DEFAULT_NAME else f" --name {name}"
        raise LocalnetError(
            f"cluster {name!r} exists already (or its leftovers do): "
            f"`scripts/cluster/localnet.sh{option} down` first"
        )
    digest = zlib.crc32(name.encode())
    subnet = f"10.{200 + digest % 50}.{digest // 50 % 250}"
    cluster = Cluster(
        name=name, subnet=subnet, bridge=f"{name}-br", rate=rate, shm_size=shm_size
    )
    try:
        _run(["ip", "link", "add", cluster.bridge, "type", "bridge"])
        _no_addresses(cluster.bridge)
        _run(["ip", "link", "set", cluster.bridge, "up"])
        hosts = [f"n{i}" for i in range(1, n + 1)]
        etc_hosts = "127.0.0.1 localhost\n" + "".join(
            f"{subnet}.{i} {h}\n" for i, h in enumerate(hosts, start=1)
        )
        for i, host in enumerate(hosts, start=1):
            node = Node(
                host=host,
                netns=f"{name}-{host}",
                veth=f"{name}-{host}",
                ip=f"{subnet}.{i}",
            )
            cluster.nodes.append(node)
            etc = Path("/etc/netns") / node.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(etc_hosts)
            (etc / "hostname").write_text(host + "\n")
            _run(["ip", "netns", "add", node.netns])
            _run(["ip", "link", "add", node.veth, "type", "veth", "peer", "name",
                  "eth0", "netns", node.netns])  # fmt: skip
            _no_addresses(node.veth)
            _run(["ip", "link", "set", node.veth, "master", cluster.bridge, "up"])
            _run(
                ["ip", "-n", node.netns, "addr", "add", f"{node.ip}/24", "dev", "eth0"]
            )
            _run(["ip", "-n", node.netns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", node.netns, "link", "set", "lo", "up"])
            cluster.set_rate(host, rate)
            node.pid = _start_holder(cluster.dir, node, shm_size)
            cluster.save()
    except BaseException:
        down(name)
        raise
    return cluster


def down(name: str = DEFAULT_NAME) -> list[str]:
    """Remove cluster ``name``: every process on its nodes, the namespaces, links,
    bridge, ``/etc/netns`` files and state. Works on a half-made or half-removed
    cluster too (it finds the leftovers by name). Returns what it removed."""
    removed = []
    for netns in _leftovers(name)["netns"]:
        _kill_all(lambda ns=netns: _netns_pids(ns))
        _run(["ip", "netns", "del", netns], check=False)
        removed.append(f"netns {netns}")
    for link in _leftovers(name)["links"]:
        _run(["ip", "link", "del", link], check=False)
        removed.append(f"link {link}")
    for etc in Path("/etc/netns").glob(f"{name}-n*"):
        shutil.rmtree(etc, ignore_errors=True)
    if Cluster.folder(name).exists():
        shutil.rmtree(Cluster.folder(name), ignore_errors=True)
        removed.append(f"state {Cluster.folder(name)}")
    return removed


def _leftovers(name: str) -> dict[str, list[str]]:
    netns = [
        line.split()[0]
        for line in _run(["ip", "netns", "list"], check=False).stdout.splitlines()
        if line.split() and re.fullmatch(rf"{name}-n\d+", line.split()[0])
    ]
    links = []
    for line in _run(["ip", "-o", "link", "show"], check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            dev = parts[1].strip().split("@")[0]
            if re.fullmatch(rf"{name}-(n\d+|br)", dev):
                links.append(dev)
    return {"netns": netns, "links": links}


def _no_addresses(dev: str) -> None:
    """No IPv6 link-local address on a device of the root namespace."""
    _run(["ip", "link", "set", "dev", dev, "addrgenmode", "none"], check=False)


def _start_holder(state: Path, node: Node, shm_size: str) -> int:
    state.mkdir(parents=True, exist_ok=True)
    pidfile = state / f"{node.host}.holder"
    pidfile.unlink(missing_ok=True)
    script = (
        f"hostname {node.host} && "
        f"mount -t tmpfs -o size={shm_size},mode=1777 tmpfs /dev/shm && "
        f"echo $$ > {pidfile} && exec sleep infinity"
    )
    cmd = ["ip", "netns", "exec", node.netns, "unshare", "--uts", "--ipc",
           "--mount", "--propagation", "private", "sh", "-c", script]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if pidfile.exists() and pidfile.read_text().strip():
            return int(pidfile.read_text())
        if proc.poll() is not None:
            raise LocalnetError(
                f"node {node.host} did not start: {proc.stderr.read().decode().strip()}"
            )
        time.sleep(0.02)
    proc.kill()
    raise LocalnetError(f"node {node.host} did not start within 10 s")


def _netns_pids(netns: str) -> list[int]:
    out = _run(["ip", "netns", "pids", netns], check=False).stdout.split()
    return [int(p) for p in out]


def _kill_all(list_pids, timeout: float = 10.0) -> None:
    """SIGKILL (after SIGCONT) whatever ``list_pids()`` lists until it lists nothing."""
    deadline = time.monotonic() + timeout
    while pids := list_pids():
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise LocalnetError(f"processes {pids} did not end within {timeout:.0f} s")
        time.sleep(0.05)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise LocalnetError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()}")
    return proc


# -- host lists for launchers -------------------------------------------------
def parse_hosts(spec: str, np_: int) -> list[tuple[str, int]]:
    """``"n1,n2"`` or ``"n1:2,n2:1"`` and a rank count as ``[(host, ranks)]``.

    Without counts the ranks are spread in blocks (node-contiguous ranks, the
    first ``np % hosts`` hosts one more); with counts they must add up to ``np``.
    """
    items = [s.strip() for s in spec.split(",") if s.strip()]
    if not items:
        raise ValueError("--hosts: give at least one host, e.g. n1,n2")
    names, counts = [], []
    for item in items:
        host, _, count = item.partition(":")
        if not host:
            raise ValueError(f"--hosts: empty host name in {spec!r}")
        if count:
            if not count.isdigit() or int(count) < 1:
                raise ValueError(
                    f"--hosts: bad rank count in {item!r} (want host:N, N >= 1)"
                )
            counts.append(int(count))
        names.append(host)
    if len(set(names)) != len(names):
        raise ValueError(f"--hosts: a host appears twice in {spec!r}")
    if counts and len(counts) != len(names):
        raise ValueError(
            f"--hosts: give a rank count for every host or none ({spec!r})"
        )
    if counts:
        if sum(counts) != np_:
            raise ValueError(
                f"--hosts {spec} places {sum(counts)} ranks but --np is {np_}"
            )
        return list(zip(names, counts))
    if np_ < len(names):
        raise ValueError(f"--np {np_} is fewer than the {len(names)} hosts of --hosts")
    base, extra = divmod(np_, len(names))
    return [(h, base + (i < extra)) for i, h in enumerate(names)]


def find_cluster(hosts: list[str]) -> Cluster | None:
    """The running local cluster that has every one of ``hosts``, or None.

    ``$RESEARCH_LOCALNET_DIR`` names the cluster when set (only it is looked
    at); else the one cluster under :data:`STATE_ROOT` that has all the hosts.

    Raises:
      LocalnetError: several clusters have them (set the variable to choose).
    """
    if os.environ.get(DIR_ENV):
        folder = Path(os.environ[DIR_ENV])
        try:
            cluster = Cluster.load(folder.name)
        except (LocalnetError, OSError, ValueError, TypeError):
            return None
        return cluster if set(hosts) <= set(cluster.hosts()) else None
    found = []
    for folder in sorted(STATE_ROOT.iterdir()) if STATE_ROOT.is_dir() else []:
        try:
            cluster = Cluster.load(folder.name)
        except (LocalnetError, OSError, ValueError, TypeError):
            continue
        if set(hosts) <= set(cluster.hosts()):
            found.append(cluster)
    if len(found) > 1:
        names = ", ".join(f"{DIR_ENV}={c.dir}" for c in found)
        raise LocalnetError(
            f"several local clusters have {','.join(hosts)}: choose one ({names})"
        )
    return found[0] if found else None


# -- the command line ---------------------------------------------------------
def _status(cluster: Cluster) -> str:
    lines = [f"cluster {cluster.name}: {len(cluster.nodes)} nodes, bridge "
             f"{cluster.bridge}, state {cluster.dir}"]  # fmt: skip
    for node in cluster.nodes:
        link = _run(["ip", "-n", node.netns, "-o", "link", "show", "eth0"], check=False)
        state = "up" if "state UP" in link.stdout or ",UP" in link.stdout else "down"
        qdisc = _run(["tc", "-n", node.netns, "qdisc", "show", "dev", "eth0"],
                     check=False).stdout  # fmt: skip
        rate = re.search(r"rate (\S+)", qdisc)
        alive = "up" if node.alive() else "DOWN"
        lines.append(
            f"  {node.host:4s} {node.ip:15s} node {alive:4s} link {state:4s} "
            f"rate {rate.group(1) if rate else '?':8s} "
            f"processes {len(cluster.pids(node.host)) if alive == 'up' else 0}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="localnet.sh",
        description="Nodes on one box: network namespaces with their own hostname "
        "and /dev/shm, joined by shaped links (root).",
    )
    p.add_argument("--name", default=DEFAULT_NAME, help="cluster name (default rs)")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("up", help="make N nodes n1..nN")
    s.add_argument("n", type=int)
    s.add_argument("--rate", default="1gbit", help="each node's link (default 1gbit)")
    s.add_argument("--shm-size", default="4g", help="each node's /dev/shm (default 4g)")
    sub.add_parser("down", help="remove every node, link and process of the cluster")
    sub.add_parser("status", help="nodes, links, rates, processes")
    sub.add_parser(
        "env", help="print the environment a job on the nodes needs (for eval)"
    )
    s = sub.add_parser("exec", help="run a command on a node: exec n1 -- CMD...")
    s.add_argument("host")
    s.add_argument("command", nargs="*", help="the command (after --)")
    s = sub.add_parser("rate", help="change a link's rate: rate n2 10gbit (or all)")
    s.add_argument("host")
    s.add_argument("rate")
    s = sub.add_parser("link", help="take a node's link down or up")
    s.add_argument("host")
    s.add_argument("state", choices=["up", "down"])
    for verb, text in (
        ("freeze", "stop every process on a node (SIGSTOP)"),
        ("thaw", "continue a frozen node's processes (SIGCONT)"),
        ("kill", "kill every process on a node, its /dev/shm too"),
        ("start", "bring a killed node back (empty /dev/shm)"),
        ("pids", "list the processes on a node"),
    ):
        sub.add_parser(verb, help=text).add_argument("host")
    s = sub.add_parser(
        "mpiexec",
        help="run MPICH's mpiexec on n1 with the nodes' launcher: "
        "mpiexec -n 4 -hosts n1:2,n2:2 PROGRAM...",
    )
    s.add_argument("args", nargs="*", help="mpiexec's arguments")
    argv = sys.argv[1:] if argv is None else list(argv)
    # exec and mpiexec pass the rest of the line on untouched (argparse would read
    # the program's own options).
    raw = None
    for verb in ("exec", "mpiexec"):
        if verb in argv:
            i = argv.index(verb)
            if verb == "exec" and i + 1 < len(argv):
                argv, raw = argv[: i + 2], argv[i + 2 :]
            elif verb == "mpiexec":
                argv, raw = argv[: i + 1], argv[i + 1 :]
            break
    a = p.parse_args(argv)
    if raw is not None:
        a.args = a.command = raw[1:] if raw[:1] == ["--"] else raw
    try:
        if a.cmd == "up":
            cluster = up(a.n, rate=a.rate, name=a.name, shm_size=a.shm_size)
            print(_status(cluster))
            return 0
        if a.cmd == "down":
            for item in down(a.name):
                print(f"removed {item}")
            return 0
        cluster = Cluster.load(a.name)
        hosts = cluster.hosts() if getattr(a, "host", None) == "all" else None
        if a.cmd == "status":
            print(_status(cluster))
        elif a.cmd == "env":
            print(" ".join(f"export {k}={v};" for k, v in cluster.env().items()))
        elif a.cmd == "exec":
            cmd = a.command
            if not cmd:
                raise LocalnetError("exec: give a command, e.g. exec n1 -- hostname")
            env = dict(os.environ, **cluster.env())
            os.execvpe(cluster.enter(a.host)[0], [*cluster.enter(a.host), *cmd], env)
        elif a.cmd == "rate":
            for host in hosts or [a.host]:
                cluster.set_rate(host, a.rate)
        elif a.cmd == "link":
            cluster.set_link(a.host, a.state == "up")
        elif a.cmd == "freeze":
            print(f"stopped {len(cluster.signal(a.host, signal.SIGSTOP))} processes")
        elif a.cmd == "thaw":
            print(f"continued {len(cluster.signal(a.host, signal.SIGCONT))} processes")
        elif a.cmd == "kill":
            cluster.kill(a.host)
        elif a.cmd == "start":
            cluster.start(a.host)
        elif a.cmd == "pids":
            print(" ".join(map(str, cluster.pids(a.host))))
        elif a.cmd == "mpiexec":
            args = a.args
            mpiexec = str(REPO / ".venv" / "bin" / "mpiexec")
            if not os.path.exists(mpiexec):
                mpiexec = shutil.which("mpiexec") or "mpiexec"
            launch = cluster.launcher_args()
            env = dict(os.environ, **cluster.env())
            cmd = [*cluster.enter(cluster.hosts()[0]), mpiexec, *launch, *args]
            os.execvpe(cmd[0], cmd, env)
    except LocalnetError as e:
        print(f"localnet: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
