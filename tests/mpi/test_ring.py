"""The ring allreduce custom call (research/comm/dense/ring.py) under mpiexec."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mpi4jax
import numpy as np
import pytest
from mpi4py import MPI

from research.comm.dense import FusedAllreduce, ring
from tests.rank_trees import agreed, mean64, mixed_tree, rank_data


def test_builds_here(world):
    assert ring.available(), ring.unavailable_reason()


def _x64(dtype):
    """64-bit dtypes stay 64-bit inside jit only with x64 enabled."""
    return jax.enable_x64(np.dtype(dtype).itemsize == 8)


# Sizes around the ring's edges: below ring_min_bytes (MPI_Allreduce), not a
# multiple of the size, more segments than one, a chunk one element longer.
SIZES = [1, 7, 16_383, 16_384 * 4 + 3, 262_147]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("in_place", [False, True], ids=["fresh", "in-place"])
def test_sums_like_mpi(world, n, dtype, in_place):
    comm = world.dup("test-ring")
    x = rank_data(world, n, dtype)
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
    with pytest.raises(ValueError, match="float32/64 or complex SUM"):
        ring.allreduce(jnp.ones(4, jnp.int32), op=MPI.SUM, comm=comm, divisor=2)
    with pytest.raises(ValueError, match="float32/64 or complex SUM"):
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


@pytest.mark.parametrize("in_place", [False, True], ids=["fresh", "in-place"])
def test_fused_ring_equals_mpi4jax(world, in_place):
    tree = mixed_tree(world.rank, half=40, count=4)
    opts = dict(bucket_bytes=4096, alone_bytes=65536)
    fused = FusedAllreduce(
        world, allreduce="ring", in_place=in_place, segment_bytes=8192, **opts
    )
    assert fused.uses_ring()
    a = jax.jit(fused.average_in_jit)(tree)
    b = jax.jit(FusedAllreduce(world, allreduce="mpi", **opts).average_in_jit)(tree)
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

    tree = mixed_tree(world.rank, half=40_000, count=70_000)
    opts = dict(bucket_bytes=4096, alone_bytes=65536)
    a, _ = HostAllreduce(world, **opts).reduce(tree)
    b, _ = HostAllreduce(world, allreduce="mpi", **opts).reduce(tree)
    for k in ("big", "small", "half"):
        # Both within a bfloat16 rounding of the float64 mean of the inputs
        # (at 3 ranks they divide at different points, so their bits differ).
        want = mean64(world, np.asarray(tree[k], np.float64))
        for got in (a[k], b[k]):
            np.testing.assert_allclose(
                np.asarray(got, np.float64), want, rtol=2**-7, atol=2**-7
            )
    for got in (a["count"], b["count"]):
        np.testing.assert_array_equal(
            np.asarray(got), np.arange(70_000) * (world.size - 1) // 2
        )


ANY_TREE_DTYPES = [
    jnp.float32,
    jnp.float64,
    jnp.bfloat16,
    jnp.float16,
    jnp.complex64,
    jnp.complex128,
]


def _any_tree(world):
    rng = np.random.default_rng(world.rank)
    tree = {}
    for dt in ANY_TREE_DTYPES:
        for n in (5, 70_001):  # a packed leaf and a solo one
            v = rng.integers(-50, 50, n).astype(np.float64)
            if np.issubdtype(np.dtype(dt), np.complexfloating):
                v = v + 1j * rng.integers(-50, 50, n)
            tree[f"{np.dtype(dt).name}-{n}"] = v.astype(dt)
    return tree


@pytest.mark.parametrize("strategy", ["fused", "host"])
def test_any_tree_averages_and_the_ring_ran(world, strategy):
    """Every float and complex dtype averages to the float64 mean of the
    gathered inputs, and the ring's own counter (in the C library, which the
    MPI_Allreduce fallback never touches) shows that the ring summed them."""
    from research.comm.dense import HostAllreduce

    with jax.enable_x64(True):
        tree = _any_tree(world)
        if strategy == "fused":
            avg = FusedAllreduce(
                world, allreduce="ring", bucket_bytes=65536, alone_bytes=262144
            )
            choice = agreed(world, avg)
            assert choice["path"] == "ring" and choice["ring"] is True
            assert choice["allreduce"] == "ring" and choice["candidates"] == ["ring"]
            assert choice["reason"] == "allreduce=ring: the ring forced"
            assert not choice.get("pending")
            before = ring.ring_calls()
            out = jax.jit(avg.average_in_jit)(jax.tree.map(jnp.asarray, tree))
        else:
            avg = HostAllreduce(
                world, allreduce="ring", bucket_bytes=65536, alone_bytes=262144
            )
            assert agreed(world, avg)["ring"]
            before = ring.ring_calls()
            out, _ = avg.reduce(tree)
        out = jax.tree.map(np.asarray, out)
    assert ring.ring_calls() > before, "the ring summed at least one bucket"
    for k, v in tree.items():
        assert out[k].dtype == v.dtype, k
        # Tolerance by the precision of the leaf's real part.
        tol = {2: 1e-2, 4: 1e-6, 8: 1e-12}[jnp.finfo(v.dtype).bits // 8]
        np.testing.assert_allclose(
            out[k].astype(np.complex128 if np.iscomplexobj(v) else np.float64),
            mean64(world, v),
            rtol=tol,
            atol=tol,
            err_msg=k,
        )


@pytest.mark.parametrize("strategy", ["fused", "host"])
def test_auto_times_both_and_every_rank_keeps_the_same(world, strategy):
    """allreduce=auto (the default): pending until the first call, which times
    the ring and MPI_Allreduce on the real buckets (one node: the hierarchical
    path is no candidate); every rank then holds the same
    figures and choice, the faster by the slowest rank's figures, and the next
    call takes that path (the ring's C counter moves only if the ring won)."""
    from research.comm.dense import HostAllreduce

    tree = {
        "big": np.full(300_000, world.rank, np.float32),
        "small": np.arange(5, dtype=np.float32) * world.rank,
    }
    if strategy == "fused":
        avg = FusedAllreduce(world, bucket_bytes=65536, alone_bytes=262144)
        run = jax.jit(avg.average_in_jit)
        jtree = jax.tree.map(jnp.asarray, tree)

        def call():
            return jax.tree.map(np.asarray, run(jtree))
    else:
        avg = HostAllreduce(world, bucket_bytes=65536, alone_bytes=262144)

        def call():
            return avg.reduce(tree)[0]

    assert avg.allreduce_choice["allreduce"] == "auto"
    assert avg.allreduce_choice["pending"]
    assert avg.allreduce_choice["candidates"] == ["ring", "mpi"]
    call()  # the first: times both, then averages
    choice = agreed(world, avg)
    assert "pending" not in choice
    m = choice["measured"]
    assert m["ring_s"] > 0 and m["mpi_s"] > 0 and m["reps"] >= 1
    assert m["buckets"] == len(avg.plan(tree).buckets)
    assert m["bytes"] == 300_005 * 4
    assert choice["ring"] == (m["ring_s"] <= m["mpi_s"])
    assert ("ring kept" if choice["ring"] else "MPI_Allreduce kept") in (
        choice["reason"]
    )
    before = ring.ring_calls()
    out = call()
    assert (ring.ring_calls() > before) == choice["ring"]
    for k, v in tree.items():
        np.testing.assert_allclose(out[k], mean64(world, v), rtol=1e-6)


@pytest.mark.parametrize("slowed", ["ring", "mpi"])
def test_auto_keeps_the_faster_by_the_slowest_ranks_figures(world, slowed):
    """One path made slower on the last rank only: every rank still keeps the
    other one, because the choice is made from the figures MAX-reduced over
    ranks (a rank's own timings would have said either)."""
    import time

    from research.comm.dense import choose

    comm = world.dup("test-choose")
    buf = np.ones(200_000, np.float32)

    def path(name):
        def run():
            if name == slowed and world.rank == world.size - 1:
                time.sleep(0.03)
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

        return run

    pending = choose.agree(comm, "auto")
    assert pending["pending"] and pending["allreduce"] == "auto"
    paths = {"ring": path("ring"), "mpi": path("mpi")}
    settled = choose.settle(comm, pending, paths, nbytes=buf.nbytes, buffers=1)
    assert len({repr(c) for c in world.allgather(settled)}) == 1, "ranks agree"
    assert settled["ring"] is (slowed == "mpi")
    m = settled["measured"]
    assert m[f"{slowed}_s"] >= 0.03 > m[f"{'mpi' if slowed == 'ring' else 'ring'}_s"]
    assert choose.MIN_REPS <= m["reps"] <= choose.MAX_REPS
    assert choose.settle(comm, settled, paths, nbytes=0, buffers=0) is settled
    forced = choose.agree(comm, "ring")
    assert forced["ring"] and not forced.get("pending")
    assert choose.agree(comm, "mpi")["ring"] is False
    assert choose.agree(comm, "hierarchical")["path"] == "hierarchical"
    with pytest.raises(ValueError, match="allreduce must be"):
        choose.agree(comm, "fast")


def test_host_float64_numpy_leaf_without_x64(world):
    """A float64 numpy leaf under default jax (x64 off) travels as float32
    (the canonical dtype) instead of failing on the dtype mismatch."""
    from research.comm.dense import HostAllreduce

    x = np.arange(70_001, dtype=np.float64) * (world.rank + 1)
    out, _ = HostAllreduce(world).reduce({"w": x})
    np.testing.assert_allclose(np.asarray(out["w"], np.float64), mean64(world, x))


def test_fallback_does_not_move_the_counter(world):
    """allreduce=mpi takes MPI_Allreduce: same mean, counter unchanged (the
    counter tells the two paths apart)."""
    x = jnp.asarray(np.full(100_000, world.rank, np.float32))
    avg = FusedAllreduce(world, allreduce="mpi")
    assert avg.allreduce_choice["ring"] is False
    before = ring.ring_calls()
    out = jax.jit(avg.average_in_jit)({"x": x})["x"]
    np.testing.assert_allclose(np.asarray(out), mean64(world, np.asarray(x)))
    assert ring.ring_calls() == before


@pytest.mark.parametrize("bad", [-1, 0, 2**40, 1.5, True])
def test_bad_segment_bytes_refused_before_communication(world, bad):
    from research.strategies.registry import problem as check_options

    comm = world.dup("test-ring")
    x = np.zeros(100_000, np.float32)
    with pytest.raises(ValueError, match="segment_bytes"):
        ring.host_allreduce(x, x, comm=comm, segment_bytes=bad)
    with pytest.raises(ValueError, match="segment_bytes"):
        ring.allreduce(jnp.asarray(x), op=MPI.SUM, comm=comm, segment_bytes=bad)
    with pytest.raises(ValueError, match="segment_bytes"):
        FusedAllreduce(world, segment_bytes=bad)
    assert "segment_bytes" in check_options("fused", {"segment_bytes": bad})


@pytest.mark.parametrize("n", [10_007, 3 * 4096])
def test_large_buffers_go_in_pieces(world, monkeypatch, n):
    """Buffers over MAX_COUNT elements (2^31 - 1 for real) are summed in pieces
    of MAX_COUNT, each piece a ring of its own; shrunk here to test the cut
    without allocating 8 GB."""
    monkeypatch.setattr(ring, "MAX_COUNT", 4096)
    monkeypatch.setattr(ring, "RING_MIN_BYTES_PER_RANK", 1024)
    comm = world.dup("test-ring")
    x = (np.arange(n) % 977 * (world.rank + 1)).astype(np.float64)
    pieces = -(-n // 4096)
    before = ring.ring_calls()
    dst = np.empty_like(x)
    ring.host_allreduce(x, dst, comm=comm, divisor=world.size, segment_bytes=1000)
    assert ring.ring_calls() - before == pieces
    np.testing.assert_allclose(dst, mean64(world, x), rtol=1e-12)
    with jax.enable_x64(True):
        got = jax.jit(
            lambda v: ring.allreduce(v, op=MPI.SUM, comm=comm, divisor=world.size)
        )(jnp.asarray(x))
    assert ring.ring_calls() - before == 2 * pieces
    np.testing.assert_allclose(np.asarray(got), mean64(world, x), rtol=1e-12)


def test_a_resumed_run_adopts_the_recorded_path(world):
    """allreduce=auto on resume: the recorded path, not a new measurement (the
    paths differ in the last bit at 3 ranks); records written before ``path``
    (``ring`` only) read the same; a forced or settled choice, or a path that is
    no candidate here (no ring, another layout of nodes), is left alone."""
    from research.comm.dense import choose

    comm = world.dup("test-adopt")
    pending = choose.agree(comm, "auto")
    for ring_then in (True, False):
        got = choose.adopt(pending, {"ring": ring_then, "measured": {"ring_s": 1}})
        assert got["ring"] is ring_then and "pending" not in got
        assert "as the run this one resumes took" in got["reason"]
    assert choose.adopt(pending, None) is pending
    assert choose.adopt(pending, {"ring": True, "pending": True}) is pending
    for path in ("ring", "mpi"):
        got = choose.adopt(pending, {"path": path, "ring": path == "ring"})
        assert got["path"] == path and "pending" not in got
    forced = choose.agree(comm, "mpi")
    assert choose.adopt(forced, {"ring": True}) is forced
    no_ring = dict(pending, candidates=["mpi"])
    assert choose.adopt(no_ring, {"ring": True}) is no_ring
    assert choose.adopt(pending, {"path": "hierarchical"}) is pending


def test_the_old_native_spelling_is_refused(world):
    """native=true|false|auto, the spelling before allreduce= (never released):
    a keyword the collectives do not take, a bad value named in one line."""
    from research.comm.dense import HostAllreduce

    with pytest.raises(TypeError, match="native"):
        FusedAllreduce(world, native=True)
    with pytest.raises(TypeError, match="native"):
        HostAllreduce(world, native=False)
    with pytest.raises(ValueError, match="allreduce must be one of auto, ring"):
        HostAllreduce(world, allreduce="native")
