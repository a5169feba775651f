"""Asynchronous handles: several collectives in flight vs one after another.

Three measurements in one run (medians over repetitions of the slowest rank):

1. ``overlap``: K allreduces of S bytes each, as K blocking mpi4py
   ``Allreduce`` calls in a row (the baseline), as handles started and waited one
   at a time (``serial``), and as K handles started together then waited
   (``in flight``). Ratios are to the baseline.
2. ``link``: the same serial vs in-flight handles on an emulated link; for the
   last in-flight batch on rank 0, how long MPI took (first start to last real
   completion) and how long the link emulation held results after that.
3. ``idle``: rank 0 arrives ``--late`` seconds late to one small allreduce; the
   CPU time the other ranks burn meanwhile in a blocking ``Allreduce`` vs in a
   handle's progress thread: sleeps capped at 50 us, 200 us or 1 ms throughout,
   and the default (50 us, rising to ``progress.LONG_SLEEP`` as the wait grows);
   with each, the median time of a small allreduce when nobody is late.

Run ``python -m scripts.bench_handles`` (it starts itself under mpiexec) or
``mpiexec -n 2 python -m scripts.bench_handles``. Kept under a minute.
"""

from __future__ import annotations

import argparse
import os
import time

from research.entry.cli import doc_parser
from scripts.mpibench import run_or_launch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = doc_parser("python -m scripts.bench_handles", __doc__)
    p.add_argument("--ranks", type=int, default=2, help="ranks when self-launching")
    p.add_argument("--count", type=int, default=8, help="collectives per batch (K)")
    p.add_argument(
        "--sizes", default="4096,262144,4194304", help="bytes per collective (S)"
    )
    p.add_argument("--reps", type=int, default=7, help="timed batches per variant")
    p.add_argument("--link", default="1gbps:20us", help="emulated link for part 2")
    p.add_argument("--late", type=float, default=0.3, help="rank 0's delay, part 3")
    return p.parse_args(argv)


def _slowest_median(comm, samples: list[float]) -> float:
    import numpy as np
    from mpi4py import MPI

    per_rep = np.empty(len(samples))
    comm.Allreduce(np.asarray(samples), per_rep, op=MPI.MAX)
    return float(np.median(per_rep))


def bench(args: argparse.Namespace) -> None:
    import numpy as np

    from research.comm.asynchronous.handles import AsyncComm
    from research.comm.asynchronous.progress import (
        LONG_SLEEP,
        ProgressThread,
        get_progress,
    )
    from research.comm.world import get_world, install_abort_on_error

    install_abort_on_error()
    world = get_world()
    comm, K = world.comm, args.count
    say = world.log

    def batch(fn, reps: int = args.reps) -> float:
        fn()  # warm-up
        samples = []
        for _ in range(reps):
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        return _slowest_median(comm, samples)

    say(f"{world.size} ranks, load {os.getloadavg()[0]:.2f}; K={K} collectives")
    eng = AsyncComm(world)
    emul = AsyncComm(world, link=args.link)
    say("\n1. overlap (real link)")
    say(f"{'bytes':>9} {'blocking':>10} {'serial':>10} {'in flight':>10}  ratios")
    for size in (int(s) for s in args.sizes.split(",")):
        bufs = [np.ones(size // 8) for _ in range(K)]
        outs = [np.empty_like(b) for b in bufs]

        def blocking(bufs=bufs, outs=outs):
            for b, o in zip(bufs, outs):
                comm.Allreduce(b, o)

        def serial(bufs=bufs, outs=outs, eng=eng):
            for b, o in zip(bufs, outs):
                eng.allreduce(b, out=o).wait()

        def inflight(bufs=bufs, outs=outs, eng=eng):
            for h in [eng.allreduce(b, out=o) for b, o in zip(bufs, outs)]:
                h.wait()

        tb, ts, ti = batch(blocking), batch(serial), batch(inflight)
        say(
            f"{size:>9} {tb * 1e3:>8.2f}ms {ts * 1e3:>8.2f}ms {ti * 1e3:>8.2f}ms  "
            f"{ts / tb:.2f} {ti / tb:.2f}"
        )

    eng.close()

    say(f"\n2. {emul.link.describe()}: serial vs in flight (one NIC per rank)")
    say(
        f"{'bytes':>9} {'model':>9} {'serial':>10} {'in flight':>10} "
        f"{'real':>9} {'held':>9}"
    )
    for size in (int(s) for s in args.sizes.split(",")):
        bufs = [np.ones(size // 8) for _ in range(K)]
        handles: list = []

        def serial(bufs=bufs):
            for b in bufs:
                emul.allreduce(b).wait()

        def inflight(bufs=bufs, handles=handles):
            handles[:] = [emul.allreduce(b) for b in bufs]
            for h in handles:
                h.wait()

        ts, ti = batch(serial, 3), batch(inflight, 3)
        model = K * emul.link.allreduce(bufs[0].nbytes, world.size)
        first = min(h.started_at for h in handles)
        real = max(h.started_at + h.real_s for h in handles) - first
        held = max(h.started_at + h.total_s for h in handles) - first - real
        say(
            f"{size:>9} {model * 1e3:>7.2f}ms {ts * 1e3:>8.2f}ms {ti * 1e3:>8.2f}ms "
            f"{real * 1e3:>7.2f}ms {held * 1e3:>7.2f}ms"
        )

    say(f"\n3. idle: CPU seconds while rank 0 is {args.late} s late (rank 1)")
    x, out = np.ones(128), np.empty(128)

    def late_cpu(run) -> float:
        comm.Barrier()
        if world.rank == 0:
            time.sleep(args.late)
        return run()

    def blocking_cpu() -> float:
        t0 = time.thread_time()
        comm.Allreduce(x, out)
        return time.thread_time() - t0

    cpu = late_cpu(blocking_cpu)
    if world.rank == 1:
        say(f"  blocking Allreduce: {cpu:.3f} s CPU", all_ranks=True)
    variants = [(f"{c * 1e6:4.0f} us cap throughout", c, c) for c in (5e-5, 2e-4, 1e-3)]
    variants.append((f"default: 50 us, up to {LONG_SLEEP * 1e3:g} ms", 5e-5, None))
    for label, cap, long_sleep in variants:
        thread = (
            get_progress()
            if long_sleep is None
            else ProgressThread("bench-progress", long_sleep=long_sleep)
        )
        eng = AsyncComm(world, max_sleep=cap, progress=thread)

        def handle_cpu(eng=eng, ident=thread.thread.ident) -> float:
            clock = time.pthread_getcpuclockid(ident)
            t0 = time.clock_gettime(clock)
            eng.allreduce(x, out=out).wait()
            return time.clock_gettime(clock) - t0

        cpu = late_cpu(handle_cpu)
        t = batch(lambda eng=eng: eng.allreduce(x, out=out).wait(), 50)
        if world.rank == 1:
            say(
                f"  handle, {label}: {cpu:.3f} s CPU; "
                f"on time: {t * 1e6:.0f} us per 1 KB allreduce",
                all_ranks=True,
            )
        eng.close()
        if long_sleep is not None:
            thread.close()
    emul.close()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run_or_launch("scripts.bench_handles", args.ranks, argv, lambda: bench(args))


if __name__ == "__main__":
    main()
