"""The in-place allreduce custom call (research/comm/inplace.py) under mpiexec."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mpi4jax
import numpy as np
import pytest
from mpi4py import MPI

from research.comm import inplace
from research.comm.dense import FusedAllreduce


def test_builds_here(world):
    assert inplace.available(), inplace.unavailable_reason()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_sums_like_mpi(world, dtype):
    comm = world.dup("test-inplace")
    x = (np.arange(1000) * (world.rank + 1) + world.rank).astype(dtype)
    want = np.empty_like(x)
    comm.Allreduce(x, want, op=MPI.SUM)
    summed = jax.jit(lambda v: inplace.allreduce(v, op=MPI.SUM, comm=comm))
    got = summed(x)
    np.testing.assert_array_equal(np.asarray(got), want)
    # Not donated: XLA copies the parameter before summing in place, so the
    # caller's array is unchanged.
    y = jnp.asarray(x)
    jax.block_until_ready(summed(y))
    np.testing.assert_array_equal(np.asarray(y), x)


def test_ordered_with_mpi4jax(world):
    # Interleaved with mpi4jax calls in one program: one ordered effect, so
    # every rank issues the collectives in the same order (a mismatch hangs).
    comm = world.dup("test-inplace-order")

    def f(a, b):
        a = inplace.allreduce(a * 2, op=MPI.SUM, comm=comm)
        b = mpi4jax.allreduce(b, op=MPI.MAX, comm=comm)
        return inplace.allreduce(a + b, op=MPI.SUM, comm=comm), b

    a = jnp.full(7, float(world.rank + 1))
    b = jnp.full(7, float(world.rank))
    s, m = jax.jit(f)(a, b)
    total = sum(range(1, world.size + 1))
    np.testing.assert_array_equal(np.asarray(m), world.size - 1)
    np.testing.assert_allclose(np.asarray(s), world.size * (2 * total + world.size - 1))


def test_fused_in_place_equals_mpi4jax(world):
    rng = np.random.default_rng(world.rank)
    tree = {
        "big": jnp.asarray(rng.standard_normal((300, 300)), jnp.float32),
        "small": jnp.asarray(rng.standard_normal(17), jnp.float32),
        "half": jnp.asarray(rng.standard_normal(40), jnp.bfloat16),
        "count": jnp.arange(4, dtype=jnp.int32) * world.rank,
    }
    opts = dict(bucket_bytes=4096, alone_bytes=65536)
    a = jax.jit(FusedAllreduce(world, inplace=True, **opts).average_in_jit)(tree)
    b = jax.jit(FusedAllreduce(world, inplace=False, **opts).average_in_jit)(tree)
    for k in tree:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))
