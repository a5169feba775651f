"""Rank-dependent test data and the exact means to hold averages against.

Shared by the allreduce tests under mpiexec (tests/mpi: ring, staged ring,
dense) and on local nodes (tests/multinode): every rank builds its own data
from its rank; the expected mean comes from an allgather of the inputs, so it
is independent of every allreduce under test.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def rank_data(world, n, dtype):
    """Integers that every float type holds exactly (so sums are exact in any
    order): ``n`` of them, of ``dtype``, different on each rank."""
    return ((np.arange(n) % 1000) * (world.rank + 1) + world.rank).astype(dtype)


def mixed_tree(rank, half, count):
    """A solo float32 leaf, a small one, ``half`` bfloat16s, ``count`` int32s."""
    rng = np.random.default_rng(rank)
    return {
        "big": jnp.asarray(rng.standard_normal((300, 300)), jnp.float32),
        "small": jnp.asarray(rng.standard_normal(17), jnp.float32),
        "half": jnp.asarray(rng.standard_normal(half), jnp.bfloat16),
        "count": jnp.arange(count, dtype=jnp.int32) * rank,
    }


def mean64(world, x):
    """The mean of every rank's ``x`` in float64 (complex128), computed from
    the gathered inputs: independent of every allreduce under test."""
    wide = np.complex128 if np.iscomplexobj(x) else np.float64
    return np.mean([np.asarray(a, wide) for a in world.allgather(np.asarray(x))], 0)


def agreed(world, averager):
    """The allreduce choice of ``averager``, checked to be every rank's."""
    choice = averager.allreduce_choice
    assert len({repr(c) for c in world.allgather(choice)}) == 1, "ranks agree"
    return choice


def rank_tree(rank: int, n_leaves: int = 24) -> dict:
    """Rank-dependent gradients: float32 and bfloat16, odd shapes, a scalar."""
    rng = np.random.default_rng(1000 + rank)
    tree = {}
    for i in range(n_leaves):
        shape = [(), (7,), (3, 5), (33, 17), (2, 3, 4, 5), (1500,)][i % 6]
        dtype = jnp.bfloat16 if i % 5 == 3 else jnp.float32
        tree[f"layer{i:02d}"] = jnp.asarray(rng.standard_normal(shape) + rank, dtype)
    tree["big"] = jnp.asarray(rng.standard_normal((64, 200)) * (rank + 1), jnp.float32)
    tree["steps"] = jnp.arange(5, dtype=jnp.int32) + 7 * rank  # integers: floor mean
    return tree


def exact_mean(world, tree) -> dict:
    """The mean of every rank's tree, in float64, from an allgather."""
    trees = world.allgather(jax.tree.map(lambda x: np.asarray(x, np.float64), tree))
    return jax.tree.map(lambda *xs: np.mean(np.stack(xs), axis=0), *trees)


def assert_mean(out, tree, expected) -> None:
    for got, orig, want in zip(
        jax.tree.leaves(out),
        jax.tree.leaves(tree),
        jax.tree.leaves(expected),
        strict=True,
    ):
        assert got.shape == orig.shape
        assert np.dtype(got.dtype) == np.dtype(orig.dtype)
        if np.issubdtype(np.dtype(orig.dtype), np.integer):
            np.testing.assert_array_equal(np.asarray(got), np.floor(want))
        elif np.dtype(orig.dtype) == np.dtype(jnp.bfloat16):
            # Summed in float32, rounded once to bfloat16 (8 mantissa bits).
            np.testing.assert_allclose(
                np.asarray(got, np.float64), want, rtol=2**-8, atol=2**-8
            )
        else:
            np.testing.assert_allclose(
                np.asarray(got, np.float64), want, rtol=1e-6, atol=1e-6
            )
