"""DeepFreeze checkpoints in your own loop: save without stopping, resume exactly.

    mpiexec -n 2 python examples/checkpoint.py --run-dir runs/ex-ckpt --steps 60
    mpiexec -n 2 python examples/checkpoint.py --run-dir runs/ex-ckpt --steps 120

``save`` blocks only for a snapshot of the state; each rank's helper process
writes its shard of it (a fast node-local tier first, then the run folder) while
training goes on. The second command finds the newest step that every rank
committed, restores it on every rank and trains on from there, ending exactly
where one uninterrupted 120-step run would (the data order depends on the step
only). Kill the first run at any moment: the second still resumes from the last
committed step.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from _common import accuracy, batches, digits, init, loss_fn
from _common import digest as params_digest

import research
from research.checkpoint import CheckpointConfig
from research.comm.world import get_world


def main(run_dir: str, steps: int, every: int) -> str:
    world = get_world()
    (x, y), (tx_, ty_) = digits(world.rank, world.size)
    model, params, tx, opt = init()
    avg = research.averaging("fused", world)  # replicas: as in examples/dense.py

    @jax.jit
    def step(params, opt, xb, yb):
        grads = jax.grad(lambda p: loss_fn(model, p, xb, yb))(params)
        updates, opt = tx.update(avg(grads)[0], opt, params)
        return optax.apply_updates(params, updates), opt

    # The state to save is any pytree of arrays, the same on every rank (each
    # rank writes a share of it): here parameters, optimizer state and the step.
    # ``save`` saves whenever it is called; ``config.due`` follows ``every``.
    state = {"params": params, "opt": opt, "step": jnp.zeros((), jnp.int32)}
    config = CheckpointConfig(saver="deepfreeze", every=every, final=True)
    ckpt = config.create(world, Path(run_dir))
    restored = ckpt.restore(state)  # collective; None when nothing is committed
    if restored is not None:
        state = restored.state
        world.log(f"resumed from step {restored.step}")
    params, opt, start = state["params"], state["opt"], int(state["step"])
    for s in range(start, steps):
        params, opt = step(params, opt, *batches(x, y, 32, s))
        if config.due(s + 1, steps):
            state = {"params": params, "opt": opt, "step": jnp.int32(s + 1)}
            ckpt.save(s + 1, state)  # returns once the snapshot is taken
    ckpt.close()  # waits for the writes and commits (collective)
    digest = params_digest(params)
    acc = accuracy(model, params, tx_, ty_)
    world.log(f"step {steps}: test accuracy {acc:.4f}, parameters {digest[:16]}")
    return digest


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=20)
    a = p.parse_args()
    main(a.run_dir, a.steps, a.every)
