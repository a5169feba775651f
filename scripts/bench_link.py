"""The link model against the network: every modelled collective, timed over TCP.

For each collective the project models (:mod:`research.comm.link`), run the
way the project runs it, this times it across nodes of a local cluster
(``research/localnet.py``: network namespaces joined by ``tc tbf``-shaped veth
links, ``UCX_TLS=tcp,self``) and prints the model's time beside the measured one
with the error:

* ``allreduce ring``: the ring of the host path (``ring.host_allreduce``, mean
  folded in), blocking, as :class:`~research.comm.dense.HostAllreduce` calls it;
* ``allreduce mpi``, ``reduce-scatter``, ``allgather``, ``alltoallv``,
  ``sendrecv``: :class:`~research.comm.asynchronous.handles.AsyncComm` handles (MPI's
  nonblocking collectives on the progress thread), started and waited; the
  sendrecv sends to the next rank and receives from the previous one;
* ``sparse ssar_rd``, ``ssar_sag``, ``dsar_sag``, ``dense``:
  :func:`~research.comm.sparse.algorithms.sparse_allreduce` of top-k-sized
  random contributions (each rank its own indices) of a ResNet-50-sized vector,
  as the ``sparse`` strategy calls it; their model is what the strategy charges,
  ``link.sparse(bytes sent, messages)`` of the slowest rank.

Every point: one warm-up call, then ``--reps`` calls in a rotating order of the
collectives, each timed on every rank after a barrier; a call's time is its
slowest rank's, the figure is the median over calls (the spread is printed).
A calibration block measures what the model's constants stand for: the one-way
time of an 8-byte message (ping-pong), the payload rate of a bidirectional
neighbour exchange, and the host's summing rate (``numpy.add`` in place).

One rank per node: the model's assumption (one rank per link, and nothing else
using the node's CPU). Two ways to run it::

    # one configuration, on nodes that are up (the link's rate read from the
    # cluster, or --link): prints the table
    python -m scripts.bench_link --hosts n1,n2
    # the sweep behind docs/results/network.md: makes its own cluster (--cluster),
    # 1 and 10 Gb/s, 2 and 4 nodes, writes a run folder, removes the cluster
    python -m scripts.bench_link --sweep
    python -m scripts.results runs/network-<time>

Run it under ``flock /work/bench.lock`` on a shared machine; the table records
the load average, and the page says what else was running (``--note``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from research.entry.cli import doc_parser

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from research.studies.network import format_table, render  # noqa: E402
from scripts.mpibench import drop_values, root_on_path  # noqa: E402

#: The sparse points' vector: a ResNet-50 gradient's length.
SPARSE_DIM = 25_557_032
DENSE = ("allreduce ring", "allreduce mpi", "reduce-scatter", "allgather",
         "alltoallv", "sendrecv")  # fmt: skip
SPARSE = ("ssar_rd", "ssar_sag", "dsar_sag", "dense")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = doc_parser("python -m scripts.bench_link", __doc__)
    p.add_argument(
        "--hosts",
        help="nodes of a running local cluster, one rank each (e.g. n1,n2)",
    )
    p.add_argument(
        "--link",
        help="the modelled link (default: the cluster's rate, e.g. 1gbps); any "
        "--link spec of research.comm.link",
    )
    p.add_argument(
        "--sweep",
        action="store_true",
        help="make a cluster, run every --rates x --nodes, write a run folder",
    )
    p.add_argument("--rates", default="1gbit,10gbit", help="sweep: link rates (tc)")
    p.add_argument("--nodes", default="2,4", help="sweep: node counts")
    p.add_argument(
        "--cluster",
        default="lmb",
        help="sweep: the cluster's name (made and removed; default lmb)",
    )
    p.add_argument("--run-dir", help="sweep: run folder (default runs/network-<time>)")
    p.add_argument(
        "--sizes",
        default="1e6,16e6,100e6",
        help="dense message sizes in bytes (default 1e6,16e6,100e6)",
    )
    p.add_argument(
        "--densities",
        default="0.001,0.01",
        help="sparse: fraction of the vector each rank sends (default 0.001,0.01)",
    )
    p.add_argument("--reps", type=int, default=5, help="timed calls per point")
    p.add_argument(
        "--render",
        metavar="RUN_DIR",
        help="rewrite RUN_DIR/table.md from its results.json with today's model",
    )
    p.add_argument("--job", help=argparse.SUPPRESS)  # the sweep's name for a job
    p.add_argument("--json", help=argparse.SUPPRESS)  # where a job's results go
    return p.parse_args(argv)


# -- under MPI: the measurements ------------------------------------------------------
def _slowest(comm, samples: list[float]) -> list[float]:
    import numpy as np
    from mpi4py import MPI

    out = np.empty(len(samples))
    comm.Allreduce(np.asarray(samples, float), out, op=MPI.MAX)
    return out.tolist()


def _time_points(comm, points: dict, reps: int) -> dict[str, list[float]]:
    """``{name: fn}`` -> each's per-call slowest-rank seconds (rotating order)."""
    names = list(points)
    for name in names:
        points[name]()  # warm-up: connections, buffers, the ring's library
    samples: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            comm.Barrier()
            t0 = time.perf_counter()
            points[name]()
            samples[name].append(time.perf_counter() - t0)
    return {n: _slowest(comm, s) for n, s in samples.items()}


def _calibrate(world, comm, eng, sum_bytes: int) -> dict[str, float]:
    """One-way time of 8 bytes (ping-pong), the payload rate each way of an
    exchange of ``2 sum_bytes`` with the neighbours (every rank at once), once
    blocking (``Sendrecv``) and once through a handle (``eng.sendrecv``: the
    progress thread's sleeping tests), and the summing rate (``numpy.add`` in
    place on ``sum_bytes``)."""
    import numpy as np

    r, P = world.rank, world.size
    small = np.zeros(8, np.uint8)
    one_way = []
    for i in range(230):
        comm.Barrier()
        t0 = time.perf_counter()
        if r == 0:
            comm.Send(small, 1)
            comm.Recv(small, 1)
        elif r == 1:
            comm.Recv(small, 0)
            comm.Send(small, 0)
        if i >= 30:
            one_way.append((time.perf_counter() - t0) / 2)
    one_way = comm.bcast(float(np.median(one_way)), root=0)
    n = 2 * sum_bytes
    a, b = np.ones(n, np.uint8), np.empty(n, np.uint8)

    def exchange():
        comm.Sendrecv(a, (r + 1) % P, recvbuf=b, source=(r - 1) % P)

    def handle_exchange():
        eng.sendrecv(a, (r + 1) % P, (r - 1) % P, out=b).wait()

    t = _time_points(comm, {"x": exchange}, 5)["x"]
    th = _time_points(comm, {"x": handle_exchange}, 5)["x"]
    x, y = np.ones(sum_bytes // 4, np.float32), np.ones(sum_bytes // 4, np.float32)
    adds = []
    for _ in range(7):
        t0 = time.perf_counter()
        np.add(x, y, out=x)
        adds.append(time.perf_counter() - t0)
    add = _slowest(comm, [float(np.median(adds))])[0]
    return {
        "one_way_s": one_way,
        "exchange_bytes_per_s": n / float(np.median(t)),
        "handle_exchange_bytes_per_s": n / float(np.median(th)),
        "add_bytes_per_s": x.nbytes / add,
    }


def _dense_points(world, eng, ring_comm, nbytes: int) -> tuple[dict, dict]:
    """The dense collectives on ``nbytes`` (float32) and what the project
    charges each on a link (``research.studies.network.model_of``)."""
    import numpy as np

    from research.comm.dense import ring

    P, r = world.size, world.rank
    n = nbytes // 4 // P * P
    x = np.full(n, r + 1.0, np.float32)
    out = np.empty_like(x)
    part = np.full(n // P, r + 1.0, np.float32)
    counts = [n // P] * P
    nb = n * 4
    points = {
        "allreduce ring": lambda: ring.host_allreduce(
            x, out, comm=ring_comm, divisor=P
        ),
        "allreduce mpi": lambda: eng.allreduce(x, out=out).wait(),
        "reduce-scatter": lambda: eng.reduce_scatter(x).wait(),
        "allgather": lambda: eng.allgather(part, out=out).wait(),
        "alltoallv": lambda: eng.alltoallv(x, counts, counts, out=out).wait(),
        "sendrecv": lambda: eng.sendrecv(x, (r + 1) % P, (r - 1) % P, out=out).wait(),
    }
    costs = {
        "allreduce ring": ["allreduce", nb],
        "allreduce mpi": ["allreduce", nb],
        "reduce-scatter": ["reduce_scatter", nb],
        "allgather": ["allgather", nb],
        "alltoallv": ["alltoall", nb - nb // P],
        "sendrecv": ["p2p", nb],
    }
    return points, {k: (lambda v=v: v) for k, v in costs.items()}


def _sparse_points(world, density: float, algorithms) -> tuple[dict, dict]:
    """The sparse allreduce algorithms on random top-k-sized contributions, and
    what each sent on this rank (its cost on a link)."""
    import numpy as np

    from research.comm.sparse.algorithms import sparse_allreduce
    from research.comm.sparse.vector import SparseVector

    rng = np.random.default_rng([7, world.rank])
    k = max(1, int(density * SPARSE_DIM))
    idx = np.sort(rng.choice(SPARSE_DIM, k, replace=False)).astype(np.int32)
    vec = SparseVector(idx, rng.standard_normal(k).astype(np.float32), SPARSE_DIM)
    stats: dict[str, tuple[int, int]] = {}

    def run(algorithm: str) -> None:
        _, s = sparse_allreduce(world.comm, vec, algorithm, return_stats=True)
        stats[algorithm] = (s.bytes_sent, s.messages)

    points = {f"sparse {a}": (lambda a=a: run(a)) for a in algorithms}
    costs = {f"sparse {a}": (lambda a=a: ["sparse", *stats[a]]) for a in algorithms}
    return points, costs


def _floats(text: str) -> list[float]:
    return [float(s) for s in text.split(",") if s.strip()]


def run_job(args: argparse.Namespace) -> dict:
    """Every point on this world; rank 0 returns the results (others: {})."""
    import numpy as np

    from research.comm.asynchronous.handles import AsyncComm
    from research.comm.link import Link
    from research.comm.world import get_world

    world = get_world()
    comm, P = world.comm, world.size
    if P < 2:
        raise SystemExit("bench_link needs at least 2 ranks (one per node)")
    link = Link.parse(args.link)
    eng = AsyncComm(world, name="bench-link")
    ring_comm = world.dup("bench-link-ring")
    load0 = os.getloadavg()
    nodes = world.topology.nodes if world.topology else 1
    world.log(f"{P} ranks on {nodes} node(s), {link.describe()}, load {load0[0]:.2f}")
    calib = _calibrate(world, comm, eng, int(max(_floats(args.sizes))) // 2)
    rows = []
    groups = [(f"{s / 1e6:g} MB", _dense_points(world, eng, ring_comm, int(s)))
              for s in _floats(args.sizes)]  # fmt: skip
    densities = sorted(_floats(args.densities))
    for d in densities:
        # The dense algorithm does not depend on the density: timed once.
        algorithms = SPARSE if d == densities[0] else SPARSE[:3]
        groups.append((f"{d:g} density", _sparse_points(world, d, algorithms)))
    for label, (points, costs) in groups:
        times = _time_points(comm, points, args.reps)
        for name, ts in times.items():
            # Every rank's cost: the slowest rank's is the call's.
            cost = comm.allgather(costs[name]())
            rows.append({"collective": name, "size": label, "times_s": ts,
                         "costs": cost})  # fmt: skip
            world.log(f"  {name:18s} {label:>13s} {np.median(ts) * 1e3:9.2f} ms")
    eng.close()
    if not world.is_root:
        return {}
    return {
        "ranks": P,
        "nodes": nodes,
        "hosts": world.topology.record()["hosts"] if world.topology else None,
        "link": str(link),
        "calibration": calib,
        "rows": rows,
        "load_average": [round(x, 2) for x in load0],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "reps": args.reps,
    }


# -- outside MPI: launching --------------------------------------------------------
def _launch(argv: list[str], hosts: str, np_: int, out: Path,
            job: str | None = None) -> dict:  # fmt: skip
    """Run one job of this benchmark on ``hosts`` (``n1:1,n2:1``); its results."""
    from research.entry.launch import launch_command, launch_env
    from research.threads import thread_env

    env = launch_env(dict(os.environ))
    env.update(thread_env(1))
    launcher, extra = launch_command(np_, hosts)
    env.update(extra)
    env = root_on_path(env)
    forward = drop_values(argv, ("--json", "--hosts", "--job", "--run-dir"))
    forward = [a for a in forward if a != "--sweep"]
    cmd = [*launcher, sys.executable, "-m", "scripts.bench_link", *forward]
    cmd += ["--hosts", hosts, "--json", str(out)] + (["--job", job] if job else [])
    proc = subprocess.run(cmd, cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"bench_link: the job on {hosts} exited {proc.returncode}")
    return json.loads(out.read_text())


def _rate_link(rate: str) -> str:
    """A tc rate (``1gbit``) as a link spec (``1gbps:0us``)."""
    from research.comm.link import Link
    from research.localnet import parse_rate

    return str(Link(bits_per_s=parse_rate(rate)))


def _with_link(argv: list[str], spec: str) -> list[str]:
    return [*drop_values(argv, ("--link",)), "--link", spec]


def _one(args: argparse.Namespace, argv: list[str]) -> int:
    """``--hosts``: one job on running nodes, and one on the first of them
    alone (shared memory); print the table."""
    import tempfile

    from research.localnet import find_cluster

    hosts = [h.split(":")[0] for h in args.hosts.split(",") if h.strip()]
    if len(hosts) < 2 or len(set(hosts)) != len(hosts):
        raise SystemExit("bench_link: --hosts needs two or more distinct nodes")
    if not args.link:
        cluster = find_cluster(hosts)
        if cluster is None:
            raise SystemExit(
                f"bench_link: {args.hosts} are not nodes of a running local cluster: "
                "give --link (the rate of their network, e.g. 10gbps)"
            )
        argv = _with_link(argv, _rate_link(cluster.rates()))
    P = len(hosts)
    with tempfile.TemporaryDirectory() as tmp:
        shm = _launch(argv, f"{hosts[0]}:{P}", P, Path(tmp) / "one.json")
        job = _launch(argv, ",".join(f"{h}:1" for h in hosts), P, Path(tmp) / "j.json")
    print(format_table([job], {P: shm}), end="")
    return 0


def _sweep(args: argparse.Namespace, argv: list[str]) -> int:
    """``--sweep``: a cluster of its own, every rate x node count, a run folder."""
    from research import localnet, provenance
    from research.rundir import default_run_dir

    nodes = sorted({int(n) for n in args.nodes.split(",")})
    rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    if not nodes or min(nodes) < 2 or not rates:
        raise SystemExit("bench_link: --nodes 2 or more each, and some --rates")
    try:
        for rate in rates:
            localnet.parse_rate(rate)
        localnet.check_can_run()
    except localnet.LocalnetError as e:
        raise SystemExit(f"bench_link: {e}") from None
    root = Path(args.run_dir or default_run_dir("network"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        cluster = localnet.up(max(nodes), rate=rates[0], name=args.cluster)
    except localnet.LocalnetError as e:
        raise SystemExit(f"bench_link: {e}") from None
    os.environ[localnet.DIR_ENV] = str(cluster.dir)
    one_node, jobs = {}, []

    def run(name: str, hosts: str, n: int, link: str, spans: bool = False) -> dict:
        nodes = None
        if spans:  # one rank per node: the page's head names the nodes and link
            nodes = {
                "hosts": [h.split(":")[0] for h in hosts.split(",")],
                "network": "TCP over a tc-shaped link per node, local cluster; "
                "rates in the table",
            }
        provenance.record_job(
            root, "network", n, module="scripts.bench_link", nodes=nodes
        )
        print(f"bench_link: {name}", flush=True)
        return _launch(_with_link(argv, link), hosts, n, root / f"{name}.json", name)

    try:
        for n in nodes:  # the emulation's own part: the same calls on one node
            one_node[n] = run(f"one-node-{n}", f"n1:{n}", n, _rate_link(rates[0]))
        for rate in rates:
            for host in cluster.hosts():
                cluster.set_rate(host, rate)
            for n in nodes:
                spec = ",".join(f"n{i}:1" for i in range(1, n + 1))
                jobs.append(run(f"{rate}-{n}nodes", spec, n, _rate_link(rate), True))
                (root / "table.md").write_text(format_table(jobs, one_node))
    finally:
        localnet.down(args.cluster)
    results = {"jobs": jobs, "one_node": list(one_node.values())}
    (root / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(format_table(jobs, one_node), end="")
    print(f"wrote {root}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from research.comm.process.env import launched_by_mpi

    if launched_by_mpi():
        result = run_job(args)
        if result and args.json:
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        elif result:
            print(format_table([result]), end="")
        return 0
    if args.render:
        print(render(Path(args.render)), end="")
        return 0
    if args.sweep == bool(args.hosts):
        raise SystemExit("bench_link: give --hosts (nodes that are up) or --sweep")
    return _sweep(args, argv) if args.sweep else _one(args, argv)


if __name__ == "__main__":
    raise SystemExit(main())
