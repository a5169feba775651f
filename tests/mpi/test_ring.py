"""The ring allreduce custom call (research/comm/ring.py) under mpiexec."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mpi4jax
import numpy as np
import pytest
from mpi4py import MPI

from research.comm import ring
from research.comm.dense import FusedAllreduce


def test_builds_here(world):
    assert ring.available(), ring.unavailable_reason()


def _x64(dtype):
    """64-bit dtypes stay 64-bit inside jit only with x64 enabled."""
    return jax.enable_x64(np.dtype(dtype).itemsize == 8)


def _rank_data(world, n, dtype):
    # Integers that every float type holds exactly, so sums are exact in any order.
    return ((np.arange(n) % 1000) * (world.rank + 1) + world.rank).astype(dtype)


# Sizes around the ring's edges: below ring_min_bytes (MPI_Allreduce), not a
# multiple of the size, more segments than one, a chunk one element longer.
SIZES = [1, 7, 16_383, 16_384 * 4 + 3, 262_147]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("in_place", [False, True], ids=["fresh", "in-place"])
def test_sums_like_mpi(world, n, dtype, in_place):
    comm = world.dup("test-ring")
    x = _rank_data(world, n, dtype)
    want = np.empty_like(x)
    comm.Allreduce(x, want, op=MPI.SUM)
    summed = jax.jit(
        lambda v: ring.allreduce(
            v, op=MPI.SUM, comm=comm, in_place=in_place, segment_bytes=4096
        )
    )
    with _x64(dtype):
        y = jnp.asarray(x)
        got = summed(y)
        assert got.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got), want)
    # Not donated: the caller's array is unchanged (XLA copies it first when
    # the result aliases it).
    np.testing.assert_array_equal(np.asarray(y), x)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mean_folded_in_is_the_sum_divided(world, n, dtype):
    comm = world.dup("test-ring")
    x = np.random.default_rng(world.rank).standard_normal(n).astype(dtype)
    total = np.empty_like(x)
    comm.Allreduce(x, total, op=MPI.SUM)
    mean = jax.jit(
        lambda v: ring.allreduce(
            v, op=MPI.SUM, comm=comm, divisor=world.size, segment_bytes=4096
        )
    )
    with _x64(dtype):
        got = mean(x)
        assert got.dtype == dtype
    got = np.asarray(got)
    want = (total / np.asarray(world.size, dtype)).astype(dtype)
    if world.size == 2:
        # One addition (same bits in any order), then a division by a power of
        # two, which the ring does as an exact multiplication.
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    sums = world.allgather(got.tobytes())
    assert len(set(sums)) == 1, "every rank holds the same bits"


def test_divisor_needs_a_float_sum(world):
    comm = world.dup("test-ring")
    with pytest.raises(ValueError, match="float32 or float64 SUM"):
        ring.allreduce(jnp.ones(4, jnp.int32), op=MPI.SUM, comm=comm, divisor=2)
    with pytest.raises(ValueError, match="float32 or float64 SUM"):
        ring.allreduce(jnp.ones(4), op=MPI.MAX, comm=comm, divisor=2)
    with pytest.raises(ValueError, match=">= 1"):
        ring.allreduce(jnp.ones(4), op=MPI.SUM, comm=comm, divisor=0)


def test_other_ops_go_to_mpi(world):
    comm = world.dup("test-ring")
    x = np.arange(100_000, dtype=np.float32) + world.rank
    got = jax.jit(lambda v: ring.allreduce(v, op=MPI.MAX, comm=comm))(x)
    np.testing.assert_array_equal(np.asarray(got), x - world.rank + world.size - 1)


def test_ordered_with_mpi4jax(world):
    # Interleaved with mpi4jax calls in one program: one ordered effect, so
    # every rank issues the collectives in the same order (a mismatch hangs).
    comm = world.dup("test-ring-order")

    def f(a, b):
        a = ring.allreduce(a * 2, op=MPI.SUM, comm=comm)
        b = mpi4jax.allreduce(b, op=MPI.MAX, comm=comm)
        return ring.allreduce(a + b, op=MPI.SUM, comm=comm), b

    a = jnp.full(70_000, float(world.rank + 1))
    b = jnp.full(70_000, float(world.rank))
    s, m = jax.jit(f)(a, b)
    total = sum(range(1, world.size + 1))
    np.testing.assert_array_equal(np.asarray(m), world.size - 1)
    np.testing.assert_allclose(np.asarray(s), world.size * (2 * total + world.size - 1))


def _mixed_tree(rank, half, count):
    """A solo float32 leaf, a small one, ``half`` bfloat16s, ``count`` int32s."""
    rng = np.random.default_rng(rank)
    return {
        "big": jnp.asarray(rng.standard_normal((300, 300)), jnp.float32),
        "small": jnp.asarray(rng.standard_normal(17), jnp.float32),
        "half": jnp.asarray(rng.standard_normal(half), jnp.bfloat16),
        "count": jnp.arange(count, dtype=jnp.int32) * rank,
    }


@pytest.mark.parametrize("in_place", [False, True], ids=["fresh", "in-place"])
def test_fused_ring_equals_mpi4jax(world, in_place):
    tree = _mixed_tree(world.rank, half=40, count=4)
    opts = dict(bucket_bytes=4096, alone_bytes=65536)
    fused = FusedAllreduce(world, in_place=in_place, segment_bytes=8192, **opts)
    assert fused.uses_ring()
    a = jax.jit(fused.average_in_jit)(tree)
    b = jax.jit(FusedAllreduce(world, native=False, **opts).average_in_jit)(tree)
    for k in tree:
        if world.size == 2:
            # (a/2 + b/2) and (a + b)/2 are the same bits.
            np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))
        else:
            np.testing.assert_allclose(
                np.asarray(a[k], np.float64),
                np.asarray(b[k], np.float64),
                rtol=2**-7,
                atol=1e-6,
            )


@pytest.mark.parametrize("in_place", [False, True], ids=["fresh", "in-place"])
def test_host_ring_reads_a_jax_array_and_divides(world, in_place):
    comm = world.dup("test-ring")
    x = np.random.default_rng(world.rank).standard_normal(100_003).astype(np.float32)
    total = np.empty_like(x)
    comm.Allreduce(x, total, op=MPI.SUM)
    src = np.asarray(jnp.asarray(x))  # read-only view of a jax array
    dst = src.copy() if in_place else np.empty_like(x)
    out = ring.host_allreduce(
        dst if in_place else src, dst, comm=comm, divisor=world.size
    )
    assert out is dst
    np.testing.assert_allclose(dst, total / world.size, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(src, x)  # the source is only read
    assert len(set(world.allgather(dst.tobytes()))) == 1


def test_host_ring_rejects_bad_buffers(world):
    comm = world.dup("test-ring")
    a = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="differ"):
        ring.host_allreduce(a, np.zeros(10, np.float64), comm=comm)
    with pytest.raises(ValueError, match="writable"):
        ring.host_allreduce(a, np.asarray(jnp.zeros(10)), comm=comm)
    with pytest.raises(ValueError, match="float32/float64 SUM"):
        ring.host_allreduce(
            np.zeros(10, np.int32), np.zeros(10, np.int32), comm=comm, divisor=2
        )


def test_host_averager_ring_equals_mpi4py(world):
    from research.comm.dense import HostAllreduce

    tree = _mixed_tree(world.rank, half=40_000, count=70_000)
    opts = dict(bucket_bytes=4096, alone_bytes=65536)
    a, _ = HostAllreduce(world, **opts).reduce(tree)
    b, _ = HostAllreduce(world, native=False, **opts).reduce(tree)
    for k in tree:
        np.testing.assert_allclose(
            np.asarray(a[k], np.float64), np.asarray(b[k], np.float64), rtol=2**-7
        )
    np.testing.assert_array_equal(
        np.asarray(a["count"]), np.arange(70_000) * (world.size - 1) // 2
    )
