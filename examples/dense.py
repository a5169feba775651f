"""Synchronous data parallelism in your own jitted step: ``fused`` averaging.

    mpiexec -n 2 python examples/dense.py [--steps 200]

The gradient's mean over ranks is taken inside the jitted step, so gradient,
allreduce and update are one XLA program; every rank ends with the same
parameters (checked at the end).
"""

from __future__ import annotations

import argparse

import jax
import optax
from _common import accuracy, batches, digits, init, loss_fn
from _common import digest as params_digest

import research
from research.comm.world import get_world


def main(steps: int) -> float:
    world = get_world()  # MPI started; a failing rank now ends the job
    avg = research.averaging("fused", world)  # "host": call avg outside jit
    (x, y), (tx_, ty_) = digits(world.rank, world.size)
    model, params, tx, opt = init()

    @jax.jit
    def step(params, opt, xb, yb):
        grads = jax.grad(lambda p: loss_fn(model, p, xb, yb))(params)
        grads, _ = avg(grads)  # the mean over every rank, in this program
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt

    for s in range(steps):
        params, opt = step(params, opt, *batches(x, y, 32, s))
    acc = accuracy(model, params, tx_, ty_)
    digest = params_digest(params)
    assert len(set(world.allgather(digest))) == 1, "replicas differ"
    world.log(f"{world.size} ranks, {steps} steps: test accuracy {acc:.4f}")
    return acc


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    main(p.parse_args().steps)
