"""Measure the sparse allreduce's cost model on this machine and save it.

Run under the launcher with the rank count the model is for (it is per size)::

    mpiexec -n 4 python -m scripts.calibrate_sparse [--out PATH]

It takes a few seconds: pairwise exchanges from 64 B to 8 MiB (alpha, beta),
dense Allreduce from 8 B to 16 MiB (ar_alpha, ar_beta), a sparse merge (gamma)
and a scatter-add (delta); each rank measures and the slowest figure is kept.
Rank 0 writes ``--out``, else ``$RESEARCH_SPARSE_COST``, else the cache file
for this machine, MPI and P (``~/.cache/research/sparse_cost_<P>_<key>.json``),
which ``sparse_allreduce(..., algorithm="auto")`` loads. Optional: without it,
the first ``auto`` call measures the same parameters briefly and saves them
(``research/comm/sparse/calibration.py``); this measures them more carefully.
"""

from __future__ import annotations

import argparse
import dataclasses


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m scripts.calibrate_sparse", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", default=None, help="JSON file to write")
    p.add_argument(
        "--reps", type=int, default=9, help="timed repetitions (fastest kept)"
    )
    args = p.parse_args(argv)
    from research.comm.sparse.calibration import calibrate
    from research.comm.world import get_world

    world = get_world()
    model = calibrate(world.comm, args.out, reps=args.reps)
    for k, v in dataclasses.asdict(model).items():
        world.log(f"{k:9s} {v}")


if __name__ == "__main__":
    main()
