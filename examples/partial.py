"""eager-SGD's partial allreduce in your own loop, with a straggler you inject.

    mpiexec -n 2 python examples/partial.py [--mode solo|majority] [--steps 200]

Each step one rank (drawn alike on every rank) sleeps ``--delay`` seconds after
its gradient. With ``solo`` the first rank to arrive starts the round and the
others contribute what they hold; a gradient that missed its round goes into the
next one, so every gradient is applied exactly once and every rank applies the
same round results (replicas stay identical: checked at the end). Run it with
``--mode sync`` to see the synchronous time for the same work.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _common import batches, digits, host_step, init, tested

import research
from research.comm.world import get_world


def main(mode: str, steps: int, delay: float) -> float:
    world = get_world()
    (x, y), test = digits(world.rank, world.size)
    model, params, tx, opt = init()
    grad, apply = host_step(model, tx)
    straggler = np.random.default_rng(1)  # the same draws on every rank
    t0 = time.perf_counter()
    with research.averaging(mode, world, full_every=8) as avg:
        for s in range(steps):
            g = grad(params, *batches(x, y, 32, s))
            if straggler.integers(world.size) == world.rank:
                time.sleep(delay)
            mean, info = avg(g)  # a round's sum over ranks / P
            params, opt = apply(params, opt, mean)
        rest = avg.drain()  # what missed its round; None: nothing carried
        if rest is not None:  # (a zero gradient would still move momentum)
            params, opt = apply(params, opt, rest[0])
    seconds = time.perf_counter() - t0
    acc = tested(world, model, params, test)
    world.log(f"{mode}: {steps} steps in {seconds:.1f} s, test accuracy {acc:.4f}")
    return acc


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("solo", "majority", "sync"), default="solo")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--delay", type=float, default=0.02, help="straggler's sleep, s")
    a = p.parse_args()
    main(a.mode, a.steps, a.delay)
