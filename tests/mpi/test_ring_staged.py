"""The ring staged through host memory (research/comm/dense/ring.py, ``staged``)
under mpiexec: what runs on GPU arrays, where the custom call does not lower.
Here the buffers are the CPU's, so the same code runs with XLA's host callback
copying between host buffers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mpi4jax
import numpy as np
import pytest
from mpi4py import MPI

from research.comm.dense import FusedAllreduce, ring
from tests.rank_trees import agreed, mean64, mixed_tree, rank_data


@pytest.fixture
def x64_everywhere():
    """64-bit types in every thread: the host callback runs on XLA's thread,
    which ``jax.enable_x64`` (a context of the calling thread) does not reach."""
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)


@pytest.mark.parametrize("n", [7, 16_384 * 4 + 3, 262_147])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_staged_sums_as_the_custom_call_does(world, n, dtype, x64_everywhere):
    comm = world.dup("test-ring-staged")
    x = rank_data(world, n, dtype)
    want = np.empty_like(x)
    comm.Allreduce(x, want, op=MPI.SUM)
    calls = ring.ring_calls()
    got = jax.jit(
        lambda v: ring.allreduce(
            v, op=MPI.SUM, comm=comm, staged=True, segment_bytes=4096
        )
    )(jnp.asarray(x))
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got), want)
    # Above the threshold the ring ran (its C counter), below MPI_Allreduce.
    assert (ring.ring_calls() > calls) == (x.nbytes >= ring.ring_min_bytes(comm))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_staged_folds_the_mean_into_the_same_bits(world, dtype, x64_everywhere):
    """Staged or not, the same C code divides: the same bits on every rank and
    the same bits as the custom call's."""
    comm = world.dup("test-ring-staged")
    x = np.random.default_rng(world.rank).standard_normal(100_003).astype(dtype)

    def mean(staged):
        return jax.jit(
            lambda v: ring.allreduce(
                v, op=MPI.SUM, comm=comm, divisor=world.size, staged=staged
            )
        )

    staged, custom = np.asarray(mean(True)(x)), np.asarray(mean(False)(x))
    assert staged.dtype == dtype
    np.testing.assert_array_equal(staged, custom)
    np.testing.assert_allclose(staged, mean64(world, x), rtol=1e-6, atol=1e-6)
    assert len(set(world.allgather(staged.tobytes()))) == 1


def test_staged_calls_keep_one_order(world):
    """Independent staged calls, mpi4jax's and the custom call beside them, in
    one program: mpi4jax's token orders them all, the same on every rank (out
    of order, collectives on one communicator take each other's messages or
    hang)."""
    comm = world.dup("test-ring-staged-order")

    def f(a, b, c):
        s = [ring.allreduce(v, op=MPI.SUM, comm=comm, staged=True) for v in (a, b)]
        m = mpi4jax.allreduce(c, op=MPI.MAX, comm=comm)
        r = ring.allreduce(c, op=MPI.SUM, comm=comm, staged=False)
        return s[0], s[1] * 2, m, r + s[0]

    n = 70_000
    a, b, c = (jnp.full(n, float(world.rank + k)) for k in (1, 2, 3))
    sa, sb, m, r = (np.asarray(v) for v in jax.jit(f)(a, b, c))
    total = sum(range(world.size))
    np.testing.assert_array_equal(sa, total + world.size)
    np.testing.assert_array_equal(sb, 2 * (total + 2 * world.size))
    np.testing.assert_array_equal(m, world.size - 1 + 3)
    np.testing.assert_array_equal(r, 2 * total + 4 * world.size)


def test_on_a_gpu_the_fused_ring_is_staged_and_forced_only(world, monkeypatch):
    """Where JAX's backend is not the CPU (faked here: the arrays stay on the
    CPU), ``allreduce=ring`` takes the staged ring and says so in its record;
    ``auto`` does not time it (not yet run on a GPU); the host averager's
    ring, on host buffers, is not staged."""
    from research.comm.dense import HostAllreduce

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    tree = mixed_tree(world.rank, half=40, count=4)
    opts = dict(bucket_bytes=4096, alone_bytes=65536)
    forced = FusedAllreduce(world, allreduce="ring", in_place=True, **opts)
    auto = FusedAllreduce(world, **opts)
    host = HostAllreduce(world, allreduce="ring")
    monkeypatch.undo()
    choice = agreed(world, forced)
    assert choice["path"] == "ring" and choice["staged"] is True
    assert "staged through host memory" in choice["reason"]
    assert "staged through host" in forced.path()
    assert agreed(world, auto)["candidates"] == ["mpi"]
    assert "not a candidate of auto" in auto.allreduce_choice["reason"]
    assert auto.allreduce_choice["path"] == "mpi"
    assert host.allreduce_choice["path"] == "ring"
    assert not host.allreduce_choice.get("staged")
    before = ring.ring_calls()
    a = jax.jit(forced.average_in_jit)(tree)
    assert ring.ring_calls() > before  # the ring ran, through the callback
    b = jax.jit(FusedAllreduce(world, allreduce="ring", **opts).average_in_jit)(tree)
    for k in tree:  # the same C code on the same buckets: the same bits
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))
