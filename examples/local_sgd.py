"""Local SGD in your own loop: H local steps, then the ranks average their state.

    mpiexec -n 2 python examples/local_sgd.py [--local-steps 8] [--steps 200]

Every rank takes ``--local-steps`` optimizer steps on its own batches,
communicating nothing; then parameters and optimizer state are replaced by
their mean over ranks (one host allreduce of both). The strategy object is the
one ``experiments.train --strategy local_sgd`` runs: it takes the state after
each local update and returns the mean where one is due. Replicas are identical
after the final drain (checked at the end).
"""

from __future__ import annotations

import argparse

import jax
import optax
from _common import batches, digits, init, loss_fn, tested

import research
from research.comm.world import get_world


def main(local_steps: int, steps: int) -> float:
    world = get_world()
    (x, y), test = digits(world.rank, world.size)
    model, params, tx, opt = init()

    @jax.jit
    def local_update(params, opt, xb, yb):  # this rank's step: no communication
        grads = jax.grad(lambda p: loss_fn(model, p, xb, yb))(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt

    averages = 0
    with research.averaging("local_sgd", world, local_steps=local_steps) as avg:
        for s in range(steps):
            params, opt = local_update(params, opt, *batches(x, y, 32, s))
            (params, opt), info = avg((params, opt))  # the mean, every H-th step
            averages += info.extra["averaged"]
        rest = avg.drain()  # steps taken since the last average: averaged now
        if rest is not None:
            (params, opt), _ = rest
            averages += 1
    acc = tested(world, model, params, test)
    world.log(
        f"local_sgd: {steps} steps, {averages} averages (H={local_steps}), "
        f"test accuracy {acc:.4f}"
    )
    return acc


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--local-steps", type=int, default=8, help="H, steps per average")
    p.add_argument("--steps", type=int, default=200)
    a = p.parse_args()
    main(a.local_steps, a.steps)
