"""SparCML's top-k with error feedback in your own loop: a sparse allreduce.

    mpiexec -n 2 python examples/sparse.py [--density 0.01] [--steps 200]

Each step every rank sends only the ``--density`` largest entries of its
gradient plus what it held back before (error feedback); the rest stays in its
residual for the next step. The sparse allreduce sums the ranks' entries and
every rank applies the same mean, so replicas stay identical (checked at the
end). Compare the bytes sent per step with ``examples/dense.py``'s whole
gradient. The residual is per-rank state: checkpoint ``avg.state()``.
"""

from __future__ import annotations

import argparse

import jax
from _common import batches, digits, host_step, init, tested

import research
from research.comm.world import get_world


def main(density: float, steps: int) -> float:
    world = get_world()
    (x, y), test = digits(world.rank, world.size)
    model, params, tx, opt = init()
    grad, apply = host_step(model, tx)
    avg = research.averaging("sparse", world, density=density)
    sent = 0
    for s in range(steps):
        g = grad(params, *batches(x, y, 32, s))
        mean, info = avg(g)  # top-k of (g + residual), summed over ranks, / P
        params, opt = apply(params, opt, mean)
        sent += info.bytes
    dense = sum(p.size for p in jax.tree.leaves(params)) * 4
    acc = tested(world, model, params, test)
    world.log(
        f"density {density}: {steps} steps, test accuracy {acc:.4f}, "
        f"{sent / steps / 1e3:.1f} KB sent per step (dense: {dense / 1e3:.1f} KB)"
    )
    return acc


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--steps", type=int, default=200)
    a = p.parse_args()
    main(a.density, a.steps)
