"""The first large allreduce after small transfers: fresh vs reused buffers.

What a switch into a dense or partial method does: after steps of top-k's small
allgathers, the first round moves the whole model. Each trial runs ``--warm``
large nonblocking allreduces, ``--small`` small allgathers with a sleep between
them (a step's computation), then ``--after`` large allreduces again, three ways:

* ``fresh``: new send and receive buffers for every large allreduce (what the
  partial collectives do);
* ``reused``: the same two buffers every time;
* ``partial``: rounds of the project's :class:`~research.comm.partial.PartialAllreduce`
  (``mode="sync"``: every rank's gradient in every round) of one tree of that size.

Requests are completed by tests with 50 us sleeps, as the progress thread does.
It prints, per way, the median over trials of the first large allreduce after
the small ones, of the later ones, and their ratio (the slowest rank's times).
Run it where the claim is about a link: on two local nodes,
``scripts/cluster/localnet.sh up 2 --rate 10gbit`` then
``scripts/cluster/localnet.sh mpiexec -n 2 -hosts n1:1,n2:1 .venv/bin/python -m
scripts.bench_first_round``; ``python -m scripts.bench_first_round`` starts
itself under mpiexec on this machine (shared memory). About a minute.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from research.entry.cli import doc_parser
from scripts.mpibench import run_or_launch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = doc_parser("python -m scripts.bench_first_round", __doc__)
    p.add_argument("--ranks", type=int, default=2, help="ranks when self-launching")
    p.add_argument("--bytes", type=int, default=19_416_104, help="large message")
    p.add_argument("--small-bytes", type=int, default=1_300_000, help="per rank")
    p.add_argument("--small", type=int, default=30, help="small transfers between")
    p.add_argument("--gap", type=float, default=0.03, help="sleep after each, s")
    p.add_argument("--warm", type=int, default=5, help="large ones before")
    p.add_argument("--after", type=int, default=6, help="large ones after")
    p.add_argument("--trials", type=int, default=8, help="trials per way")
    return p.parse_args(argv)


def bench(args: argparse.Namespace) -> None:
    import numpy as np
    from mpi4py import MPI

    from research.comm.partial import PartialAllreduce
    from research.comm.world import get_world, install_abort_on_error

    install_abort_on_error()
    world = get_world()
    comm = world.comm
    n, k = args.bytes // 4, args.small_bytes // 4
    kept = np.ones(n, np.float32), np.empty(n, np.float32)

    def polled(req) -> None:
        while not req.Test():
            time.sleep(50e-6)

    def small() -> None:
        a, b = np.ones(k, np.float32), np.empty(k * comm.Get_size(), np.float32)
        polled(comm.Iallgather(a, b))
        time.sleep(args.gap)

    def slowest(t: float) -> float:
        return comm.allreduce(t, op=MPI.MAX)

    def large(way: str, pa) -> float:
        comm.Barrier()
        t = time.perf_counter()
        if way == "partial":
            pa.reduce({"g": kept[0]})
        else:
            a, b = (
                kept
                if way == "reused"
                else (np.ones(n, np.float32), np.empty(n, np.float32))
            )
            polled(comm.Iallreduce(a, b))
        return slowest(time.perf_counter() - t)

    world.log(
        f"{world.size} ranks, load {os.getloadavg()[0]:.2f}; {args.bytes} B after "
        f"{args.small} x {args.small_bytes} B allgathers, {args.trials} trials"
    )
    world.log(f"{'way':>8} {'first':>9} {'later':>9} {'ratio':>6}")
    for way in ("fresh", "reused", "partial"):
        pa = PartialAllreduce(comm, mode="sync") if way == "partial" else None
        firsts, laters = [], []
        for _ in range(args.trials):
            for _ in range(args.warm):
                large(way, pa)
            for _ in range(args.small):
                small()
            after = [large(way, pa) for _ in range(args.after)]
            firsts.append(after[0])
            laters += after[2:]
        if pa is not None:
            pa.close()
        first, later = statistics.median(firsts), statistics.median(laters)
        world.log(
            f"{way:>8} {first * 1e3:>7.1f}ms {later * 1e3:>7.1f}ms "
            f"{first / later:>5.2f}x"
        )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run_or_launch("scripts.bench_first_round", args.ranks, argv, lambda: bench(args))


if __name__ == "__main__":
    main()
