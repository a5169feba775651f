"""Micro-benchmark of the sparse allreduce: each algorithm, auto and dense.

For each density it times every algorithm on random uniform sparse vectors (each
rank its own indices), the median over repetitions of the slowest rank, prints
the ratio to the dense ``MPI_Allreduce`` measured in the same run, the measured
bytes sent per rank against ``predicted_bytes``, and what ``auto`` chose::

    mpiexec -n 4 python -m scripts.bench_sparse [--dim 25557032] [--reps 5]

Default dim is 2**22 (quick); ``--dim 25557032`` is a ResNet-50 gradient.
``auto`` measures its cost model briefly on first use (cached per machine, MPI
and rank count); ``python -m scripts.calibrate_sparse`` under the same mpiexec
measures it more carefully.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench_sparse", description=__doc__.split("\n")[0]
    )
    p.add_argument("--dim", type=int, default=2**22)
    p.add_argument("--densities", default="0.001,0.01,0.1,0.5")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--bits", type=int, default=None, choices=(2, 4, 8))
    args = p.parse_args(argv)
    from mpi4py import MPI

    from research.comm.sparse import ALGORITHMS, SparseVector, sparse_allreduce
    from research.comm.sparse.cost import predicted_bytes
    from research.comm.world import get_world

    world = get_world()
    comm, P = world.comm, world.size
    world.log(f"P={P} dim={args.dim} bits={args.bits} reps={args.reps}")
    world.log(
        f"{'density':>8} {'algorithm':>9} {'ms':>9} {'/dense':>7} "
        f"{'MB sent':>9} {'model':>9} {'auto':>9}"
    )
    for density in (float(x) for x in args.densities.split(",")):
        rng = np.random.default_rng(world.rank)
        k = round(args.dim * density)
        idx = np.sort(rng.choice(args.dim, k, replace=False))
        vec = SparseVector(idx, rng.standard_normal(k).astype(np.float32), args.dim)
        rows = {}
        for alg in (*ALGORITHMS, "auto"):
            times, stats = [], None
            for rep in range(args.reps + 1):  # the first is a warm-up
                comm.Barrier()
                t0 = time.perf_counter()
                _, stats = sparse_allreduce(
                    comm, vec, alg, bits=args.bits, rng=rng, return_stats=True
                )
                dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
                if rep:
                    times.append(dt)
            sent = comm.allreduce(stats.bytes_sent) / P
            rows[alg] = (float(np.median(times)), sent, stats.algorithm)
        base = rows["dense"][0]
        for alg, (t, sent, chosen) in rows.items():
            model = predicted_bytes(
                chosen, comm.allgather(vec.nnz), args.dim, P, bits=args.bits
            )
            world.log(
                f"{density:8.4f} {alg:>9} {1e3 * t:9.2f} {t / base:7.2f} "
                f"{sent / 1e6:9.3f} {model / 1e6:9.3f} "
                f"{chosen if alg == 'auto' else '':>9}"
            )


if __name__ == "__main__":
    main()
