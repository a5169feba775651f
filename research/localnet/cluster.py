"""Nodes on one box and their state: making, removing, shaping and faults.

See :mod:`research.localnet` for what a node is and how MPI runs across them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: Where clusters keep their state: one folder per cluster name.
STATE_ROOT = Path("/run/research-localnet")
DEFAULT_NAME = "rs"
#: The environment variable naming a cluster's state folder.
DIR_ENV = "RESEARCH_LOCALNET_DIR"
REPO = Path(__file__).resolve().parents[2]
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


# -- making and removing a cluster --------------------------------------------
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
