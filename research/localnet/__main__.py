"""``python -m research.localnet``: the command line of the local cluster
(``scripts/cluster/localnet.sh`` runs it; ``--help`` lists the commands)."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import sys

from research.localnet.cluster import (
    DEFAULT_NAME,
    REPO,
    Cluster,
    LocalnetError,
    _run,
    down,
    up,
)


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
    s.add_argument("host", help="a node (n1, n2, ...) or all")
    s.add_argument("rate", help="tc's rate: 1gbit, 10gbit, 100mbit, 1mbit")
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
