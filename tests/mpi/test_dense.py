"""Dense averaging under mpiexec: fused (mpi4jax in jit) and host (mpi4py) agree
with the exact mean, on every rank, for mixed dtypes and many leaves."""

from __future__ import annotations

import json
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.comm.dense import FusedAllreduce, HostAllreduce
from research.strategies.base import Strategy
from research.strategies.fused import Fused
from research.strategies.host import Host
from research.strategies.registry import create as get_strategy
from research.strategies.registry import names as list_strategies
from research.trace import Tracer, tracing
from tests.rank_trees import assert_mean, exact_mean, rank_tree

MIXED_SMALL = dict(bucket_bytes=16_384, alone_bytes=32_768)  # a few of each kind


def checksum(tree) -> int:
    crc = 0
    for leaf in jax.tree.leaves(tree):
        crc = zlib.crc32(np.ascontiguousarray(np.asarray(leaf)).tobytes(), crc)
    return crc


def assert_identical_on_all_ranks(world, tree) -> None:
    sums = world.allgather(checksum(tree))
    assert len(set(sums)) == 1, f"ranks disagree: {sums}"


# -- registry ----------------------------------------------------------------


def test_registry_names_and_errors(world) -> None:
    names = list_strategies()
    assert {"fused", "host"} <= set(names)
    avg = get_strategy("fused", world, bucket_bytes=1 << 20)
    assert isinstance(avg, Fused) and isinstance(avg.mean, FusedAllreduce)
    assert avg.options.bucket_bytes == 1 << 20
    host = get_strategy("host", world)
    assert isinstance(host, Host) and isinstance(host.mean, HostAllreduce)
    assert isinstance(host, Strategy)
    with pytest.raises(ValueError, match="fused") as err:
        get_strategy("no-such-strategy", world)
    assert "host" in str(err.value)


# -- values ------------------------------------------------------------------


#: Each case names its allreduce: with ``auto`` every case compiled both
#: candidates' programs besides its own step, three programs where one tests
#: the averaging (``auto`` itself: tests/mpi/test_ring.py and the contract).
#: Both paths run, with and without division folded into the ring.
@pytest.mark.parametrize(
    "options",
    [
        dict(**MIXED_SMALL, allreduce="ring"),
        dict(bucket_bytes=16_384, alone_bytes=None, allreduce="mpi"),
        dict(bucket_bytes=1 << 30, allreduce="ring"),
        dict(bucket_bytes=16_384, sequential=False, allreduce="mpi"),
        dict(**MIXED_SMALL, prescale=False, allreduce="ring"),
        dict(**MIXED_SMALL, prescale=False, allreduce="mpi"),
    ],
    ids=[
        "solo+fused",
        "all-fused",
        "one-bucket",
        "unsequenced",
        "divide-after-ring",
        "divide-after-mpi",
    ],
)
def test_fused_is_exact_mean(world, options) -> None:
    tree = rank_tree(world.rank)
    avg = FusedAllreduce(world, **options)

    @jax.jit
    def step(t):  # averaging inside a larger jitted function, as in a train step
        return avg.average_in_jit(jax.tree.map(lambda x: x * 1, t))

    out = step(tree)
    assert_mean(out, tree, exact_mean(world, tree))
    assert_identical_on_all_ranks(world, out)
    assert avg.plan(tree).nbytes > 0
    assert avg.allreduce_choice["path"] == options["allreduce"]


def test_host_is_exact_mean_and_reports(world) -> None:
    tree = rank_tree(world.rank)
    avg = HostAllreduce(world, bucket_bytes=4096)
    expected = exact_mean(world, tree)
    for step in (1, 2):
        out, info = avg.reduce(tree)
        assert_mean(out, tree, expected)
        assert_identical_on_all_ranks(world, out)
        assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(out))
        assert info.bytes == avg.plan(tree).nbytes > 0
        assert info.contributors == world.size
        assert info.staleness == 0 and info.round == step and info.wait_s > 0
    out, _ = HostAllreduce(world, as_jax=True).reduce(tree)
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(out))


def test_host_on_an_emulated_link_takes_at_least_the_model(world) -> None:
    import time

    from research.comm.link import Link

    tree = rank_tree(world.rank)
    avg = HostAllreduce(world, bucket_bytes=4096, link="0.1gbps:1ms")
    model = sum(
        Link.parse("0.1gbps:1ms").allreduce(b.nbytes, world.size)
        for b in avg.plan(tree).buckets
    )
    t0 = time.perf_counter()
    out, info = avg.reduce(tree)
    took = time.perf_counter() - t0
    assert_mean(out, tree, exact_mean(world, tree))
    if world.size > 1:
        assert took >= model > 0  # a lower bound: the real allreduce may be slower
        assert 0 <= info.extra["emulated_s"] <= model


def test_fused_and_host_agree(world) -> None:
    tree = rank_tree(world.rank, n_leaves=120)
    # Across paths: the ring inside jit against MPI's allreduce on the host.
    fused = jax.jit(
        FusedAllreduce(world, **MIXED_SMALL, allreduce="ring").average_in_jit
    )(tree)
    host, _ = HostAllreduce(world, bucket_bytes=40_000, allreduce="mpi").reduce(tree)
    for a, b in zip(jax.tree.leaves(fused), jax.tree.leaves(host), strict=True):
        tol = 2**-7 if np.dtype(a.dtype) == np.dtype(jnp.bfloat16) else 1e-6
        np.testing.assert_allclose(
            np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol, atol=tol
        )


def test_host_result_survives_next_call(world) -> None:
    avg = HostAllreduce(world, bucket_bytes=4096)
    first, _ = avg.reduce(rank_tree(world.rank))
    kept = jax.tree.map(np.copy, first)
    avg.reduce(rank_tree(world.rank + 7))  # reuses the buckets, not the results
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(kept), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_host_span_on_comm_track(world, tmp_path) -> None:
    tree = rank_tree(world.rank, n_leaves=6)
    avg = HostAllreduce(world, bucket_bytes=4096)
    with tracing(Tracer(tmp_path, rank=world.rank, size=1)):
        _, info = avg.reduce(tree)
    events = json.loads((tmp_path / "trace" / f"rank{world.rank}.json").read_text())
    spans = [e for e in events if e.get("ph") == "X" and e["cat"] == "comm"]
    assert len(spans) == 1 and spans[0]["args"]["bytes"] == info.bytes


# -- size 1 -------------------------------------------------------------------


class _Alone:
    """A world of one whose communicator must never be touched."""

    rank, size = 0, 1

    def dup(self, name):  # pragma: no cover - the point is that it is not called
        raise AssertionError("size 1 must not create communicators")


def test_size_one_skips_mpi() -> None:
    tree = rank_tree(0, n_leaves=5)
    fused = FusedAllreduce(_Alone())
    out = jax.jit(fused.average_in_jit)(tree)
    text = jax.jit(fused.average_in_jit).lower(tree).as_text()
    assert "mpi" not in text
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(tree), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    out, info = HostAllreduce(_Alone()).reduce(tree)
    assert out is tree and info.contributors == 1 and info.bytes == 0


def test_every_averager_takes_an_mpi_communicator(world):
    """Issue 23's trap: ``FusedAllreduce(MPI.COMM_WORLD)`` raised AttributeError.
    Every strategy now takes an mpi4py communicator as well as a World; the
    dense ones average over exactly the ranks of the communicator they get (a
    split into even and odd ranks: each half's own mean)."""
    from mpi4py import MPI

    from research.comm.world import as_world

    for name in list_strategies():
        avg = get_strategy(name, MPI.COMM_WORLD)
        assert avg is not None, name
        if hasattr(avg, "drain"):
            avg.drain()
    half = MPI.COMM_WORLD.Split(world.rank % 2, world.rank)
    mine = [r for r in range(world.size) if r % 2 == world.rank % 2]
    want = np.mean([np.full(300_000, r, np.float64) for r in mine], 0)
    x = {"w": jnp.full(300_000, world.rank, jnp.float32)}
    fused = FusedAllreduce(half)
    got = jax.jit(fused.average_in_jit)(x)["w"]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    host, _ = HostAllreduce(half).reduce({"w": np.asarray(x["w"])})
    np.testing.assert_allclose(np.asarray(host["w"]), want, rtol=1e-6)
    assert as_world(half) is as_world(half)  # one private duplicate per communicator
    with pytest.raises(TypeError, match="MPI.COMM_WORLD"):
        FusedAllreduce("world")
