"""Synchronous data parallelism in your own jitted step: ``fused`` averaging.

    mpiexec -n 2 python examples/dense.py [--steps 200] [--allreduce xla]

The gradient's mean over ranks is taken inside the jitted step, so gradient,
allreduce and update are one XLA program; every rank ends with the same
parameters (checked at the end). ``--allreduce xla``: XLA's own collectives
(NCCL on GPUs, gloo on the CPU), whose runtime starts before JAX computes, and
the step one program of all ranks (``xla_collective.Spmd``).
"""

from __future__ import annotations

import argparse

import jax
import optax
from _common import accuracy, batches, digits, init, loss_fn
from _common import digest as params_digest

import research
from research.comm import xla_collective
from research.comm.world import get_world


def main(steps: int, allreduce: str = "auto") -> float:
    world = get_world()  # MPI started, one GPU per rank; a failing rank ends the job
    if allreduce == "xla":
        xla_collective.start(world)  # JAX's distributed runtime: before JAX computes
    # "host": call avg outside jit
    avg = research.averaging("fused", world, allreduce=allreduce)
    (x, y), (tx_, ty_) = digits(world.rank, world.size)
    model, params, tx, opt = init()

    def body(state, xb, yb):
        params, opt = state
        grads = jax.grad(lambda p: loss_fn(model, p, xb, yb))(params)
        grads, _ = avg(grads)  # the mean over every rank, in this program
        updates, opt = tx.update(grads, opt, params)
        return (optax.apply_updates(params, updates), opt), None

    step = xla_collective.Spmd(body) if allreduce == "xla" else jax.jit(body)
    state = (params, opt)
    for s in range(steps):
        state, _ = step(state, *batches(x, y, 32, s))
    if allreduce == "xla":
        state = step.local(state)  # this rank's arrays again
    params, opt = state
    acc = accuracy(model, params, tx_, ty_)
    digest = params_digest(params)
    assert len(set(world.allgather(digest))) == 1, "replicas differ"
    world.log(f"{world.size} ranks, {steps} steps: test accuracy {acc:.4f}")
    return acc


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--allreduce", choices=("auto", "ring", "mpi", "xla"))
    args = p.parse_args()
    main(args.steps, args.allreduce or "auto")
