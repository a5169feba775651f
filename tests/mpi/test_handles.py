"""Asynchronous handles on the progress thread, under mpiexec -n 2 and -n 4.

Expectations are in terms of ``size``. Values are small integers in float64, so
sums are exact and compared with equality.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

from research.comm.asynchronous.handles import AsyncComm
from research.comm.asynchronous.progress import get_progress
from research.comm.link import Link


def data(rank: int, i: int, n: int, dtype=np.float64) -> np.ndarray:
    """Rank- and index-specific small integers, computable on any rank."""
    rng = np.random.default_rng((rank, i, n))
    return rng.integers(-50, 51, size=n).astype(dtype)


@pytest.fixture
def comm(world):
    with AsyncComm(world) as c:
        yield c


@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_each_collective_matches_blocking_mpi4py(world, comm, dtype):
    P, r, c = world.size, world.rank, world.comm
    n = 6 * P
    x = data(r, 0, n, dtype)

    ref = np.empty_like(x)
    c.Allreduce(x, ref)
    np.testing.assert_array_equal(comm.allreduce(x).wait(), ref)
    inplace = x.copy()
    assert comm.allreduce(inplace, out=inplace).wait() is inplace
    np.testing.assert_array_equal(inplace, ref)
    c.Allreduce(x, ref, op=MPI.MAX)
    np.testing.assert_array_equal(comm.allreduce(x, op=MPI.MAX).wait(), ref)

    ref = np.empty(n // P, dtype)
    c.Reduce_scatter_block(x, ref)
    np.testing.assert_array_equal(comm.reduce_scatter(x).wait(), ref)

    counts = [(i % 3) + 1 for i in range(P)]
    counts[-1] += n - sum(counts)
    ref = np.empty(counts[r], dtype)
    c.Reduce_scatter(x, ref, counts)
    np.testing.assert_array_equal(comm.reduce_scatter(x, counts).wait(), ref)

    ref = np.empty((P, n), dtype)
    c.Allgather(x, ref)
    np.testing.assert_array_equal(comm.allgather(x).wait(), ref)

    mine = x[: counts[r]].copy()
    ref = np.empty(n, dtype)
    c.Allgatherv(mine, [ref, counts])
    np.testing.assert_array_equal(comm.allgatherv(mine, counts).wait(), ref)

    ref = np.empty_like(x)
    c.Alltoall(x, ref)
    np.testing.assert_array_equal(comm.alltoall(x).wait(), ref)

    # alltoallv: rank r sends (r + j) % 3 + 1 elements to rank j.
    send = [(r + j) % 3 + 1 for j in range(P)]
    recv = [(j + r) % 3 + 1 for j in range(P)]
    xv = data(r, 1, sum(send), dtype)
    ref = np.empty(sum(recv), dtype)
    c.Alltoallv([xv, send], [ref, recv])
    np.testing.assert_array_equal(comm.alltoallv(xv, send, recv).wait(), ref)

    right, left = (r + 1) % P, (r - 1) % P
    ref = np.empty_like(x)
    c.Sendrecv(x, right, 7, ref, left, 7)
    np.testing.assert_array_equal(comm.sendrecv(x, right, left, tag=7).wait(), ref)
    np.testing.assert_array_equal(ref, data(left, 0, n, dtype))


def test_sendrecv_one_way(world, comm):
    if world.size < 2:
        pytest.skip("needs two ranks")
    x = data(world.rank, 3, 5)
    if world.rank == 0:
        assert comm.sendrecv(x, 1, None).wait() is None
    elif world.rank == 1:
        got = comm.sendrecv(None, None, 0, recv_shape=(5,), recv_dtype=np.float64)
        np.testing.assert_array_equal(got.wait(), data(0, 3, 5))


def _start(comm, kind: str, i: int, n: int):
    """Start op ``i`` of ``kind`` on ``n``-sized data; return (handle, expected)."""
    P, r = comm.size, comm.rank
    everyone = [data(q, i, n) for q in range(P)]
    x = everyone[r]
    if kind == "allreduce":
        return comm.allreduce(x), sum(everyone)
    if kind == "reduce_scatter":
        return comm.reduce_scatter(x), np.split(sum(everyone), P)[r]
    if kind == "allgather":
        return comm.allgather(x), np.stack(everyone)
    if kind == "alltoall":
        return comm.alltoall(x), np.concatenate([np.split(e, P)[r] for e in everyone])
    right, left = (r + 1) % P, (r - 1) % P
    return comm.sendrecv(x, right, left, tag=i), everyone[left]


def test_many_in_flight_waited_in_random_order(world, comm):
    P = world.size
    kinds = ["allreduce", "reduce_scatter", "allgather", "alltoall", "sendrecv"]
    sizes = [P, 8 * P, 1000 * P, 40_000 * P]
    started = [
        _start(comm, kinds[i % len(kinds)], i, sizes[(i // 2) % len(sizes)])
        for i in range(40)
    ]
    peak = comm.in_flight
    order = np.random.default_rng(1000 + world.rank).permutation(len(started))
    for i in order:
        handle, expected = started[i]
        np.testing.assert_array_equal(handle.wait(timeout=60), expected)
        assert handle.done() and handle.real_s >= 0 and handle.emulated_s == 0
    assert comm.in_flight == 0 and peak >= 1
    comm.drain()


def test_not_done_until_every_rank_started(world, comm):
    if world.size < 2:
        pytest.skip("needs two ranks")
    x = np.full(4, float(world.rank))
    if world.rank == 0:
        # Rank 0 starts only after every other rank saw its handle unfinished.
        for src in range(1, world.size):
            world.comm.recv(source=src, tag=99)
        h = comm.allreduce(x)
    else:
        h = comm.allreduce(x)
        assert not h.done()
        with pytest.raises(TimeoutError):
            h.wait(timeout=0.01)
        world.comm.send(None, dest=0, tag=99)
    np.testing.assert_array_equal(h.wait(), np.full(4, sum(range(world.size))))


def test_errors_are_raised_by_wait(world):
    P, r = world.size, world.rank
    with AsyncComm(world) as comm:
        if P > 1:
            with pytest.raises(ValueError, match="equal blocks"):
                comm.reduce_scatter(np.zeros(P + 1))
        with pytest.raises(ValueError, match="sum to"):
            comm.reduce_scatter(np.zeros(P + 1), [1] * P)
        with pytest.raises(ValueError, match="counts"):
            comm.allgatherv(np.zeros(2), [1] * P)
        with pytest.raises(TypeError, match="numpy"):
            comm.allreduce([1.0, 2.0])
        with pytest.raises(ValueError, match="contiguous"):
            comm.allreduce(np.zeros((4, 4))[:, 0])
        with pytest.raises(ValueError, match="rank"):
            comm.sendrecv(np.zeros(1), P, 0)
        # The own block is copied, never sent: what a rank sends itself must
        # be what it expects from itself.
        recv = [1] * P
        recv[r] = 2
        with pytest.raises(ValueError, match="itself"):
            comm.alltoallv(np.zeros(P), [1] * P, recv)
    comm = AsyncComm(world)
    ok = comm.allreduce(np.ones(3))
    # Every rank sends 8 elements and receives into room for 4: MPI reports a
    # truncation on the progress thread, and wait() raises it here.
    bad = comm.sendrecv(
        np.ones(8), (r + 1) % P, (r - 1) % P, recv_shape=(4,), recv_dtype=np.float64
    )
    np.testing.assert_array_equal(ok.wait(), np.full(3, float(P)))
    with pytest.raises(MPI.Exception) as info:
        bad.wait(timeout=30)
    assert info.value.Get_error_class() == MPI.ERR_TRUNCATE
    assert bad.done()
    with pytest.raises(RuntimeError, match="failed earlier"):
        comm.allreduce(np.ones(3))
    comm.close()  # local after a failure: no collective on an error path


def _runnable_s() -> float:
    """Seconds this thread ran or waited to run (schedstat): what a thread that
    spins accumulates at the wall-clock rate however loaded the machine is, and
    one that sleeps does not accumulate at all."""
    with open("/proc/thread-self/schedstat") as f:
        run_ns, queued_ns = f.read().split()[:2]
    return (int(run_ns) + int(queued_ns)) / 1e9


def test_waiting_does_not_spin(world, comm):
    x = np.ones(1000)
    comm.allreduce(x).wait()  # progress thread started, MPI warmed up
    world.barrier()
    progress = get_progress()
    rounds0, busy0, wall0 = progress.rounds, _runnable_s(), time.perf_counter()
    if world.rank == 0:
        time.sleep(0.5)  # the others start at once and wait for this rank
    h = comm.allreduce(x)
    out = h.wait()
    rounds, wall = progress.rounds - rounds0, time.perf_counter() - wall0
    busy = _runnable_s() - busy0
    np.testing.assert_array_equal(out, np.full(1000, float(world.size)))
    # The caller waits on an event; the progress thread tests with sleeps between
    # (50 us at first, rising to 1 ms as the wait grows: about 600 rounds in 0.5
    # s). A busy-polling thread would run a round every few microseconds. A count
    # of wake-ups, not CPU time: a loaded machine lowers it, never raises it.
    assert rounds < wall / 100e-6, f"{rounds} rounds of polls in {wall:.3f} s"
    if world.rank != 0:
        # The ranks that waited 0.5 s for rank 0 (rank 0 itself slept, then
        # found the others there: its runnable time is the wake-up's queueing on
        # a loaded machine, 0.29 of 0.79 s once with another worker's job beside).
        assert busy < 0.25 * wall, f"the waiting thread was runnable {busy:.3f} s"


def test_emulated_link_takes_at_least_the_model(world):
    P = world.size
    link = Link.parse("1gbps:1ms")
    with AsyncComm(world, link=link) as comm:
        x = data(world.rank, 5, 125_000)  # 1 MB
        t0 = time.perf_counter()
        h = comm.allreduce(x)
        out = h.wait()
        elapsed = time.perf_counter() - t0
        np.testing.assert_array_equal(out, sum(data(q, 5, 125_000) for q in range(P)))
        assert h.model_s == pytest.approx(link.allreduce(x.nbytes, P))
        # 1 ns of slack: perf_counter instants are summed and subtracted.
        assert h.total_s >= h.model_s - 1e-9 and elapsed >= h.model_s - 1e-9
        assert h.real_s <= h.total_s and h.emulated_s >= 0
        assert h.real_s + h.emulated_s >= h.model_s - 1e-9  # which part was which

        # Concurrent collectives share the link: the last one ends no earlier
        # than the first one's start plus every model.
        r = world.rank
        hs = [comm.reduce_scatter(data(r, i, 1000 * P)) for i in range(4)]
        hs.append(comm.sendrecv(x, (r + 1) % P, (r - 1) % P))
        for h in hs:
            h.wait()
        end = max(h.started_at + h.total_s for h in hs)
        assert end - hs[0].started_at >= sum(h.model_s for h in hs) - 1e-9
        assert hs[-1].model_s == pytest.approx(link.p2p(x.nbytes))
