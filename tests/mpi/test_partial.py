"""Invariants of the partial allreduce (eager-SGD), run under mpiexec -n 2 and -n 4.

Expectations are written in terms of ``size`` so they hold at any rank count.
Gradients are small integers in float32, so sums are exact and conservation is
checked with equality, not a tolerance.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np
import pytest
from mpi4py import MPI

from research.comm.partial import PartialAllreduce
from research.strategies.partial import SyncOptions


def tree_of(rank: int, step: int, seed: int = 0) -> dict:
    """A small pytree of integer-valued floats, distinct per rank and step."""
    rng = np.random.default_rng((seed, rank, step))
    return {
        "w": rng.integers(-8, 9, size=(3, 4)).astype(np.float32),
        "b": [
            rng.integers(-8, 9, size=5).astype(np.float32),
            np.float32(rng.integers(-8, 9)),
        ],
    }


def flat(tree) -> np.ndarray:
    return np.concatenate(
        [np.ravel(tree["w"]), np.ravel(tree["b"][0]), np.ravel(tree["b"][1])]
    ).astype(np.float64)


def digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def run_steps(pa, world, steps, delay_fn, seed=0):
    """Run ``steps`` reduce calls with sleeps; returns (results, infos, own grads)."""
    results, infos, own = [], [], np.zeros(18)
    world.barrier()
    for s in range(steps):
        d = delay_fn(s)
        if d:
            time.sleep(d)
        g = tree_of(world.rank, s, seed)
        own += flat(g)
        out, info = pa.reduce(g)
        results.append(flat(out))
        infos.append(info)
    return results, infos, own


@pytest.mark.parametrize(
    "mode,full_every", [("sync", None), ("solo", 1), ("majority", 1)]
)
def test_synchronous_rounds_equal_allreduce(world, mode, full_every):
    rng = np.random.default_rng(world.rank)
    with PartialAllreduce(world.comm, mode=mode, full_every=full_every) as pa:
        for r in range(1, 11):
            tree = {
                "x": rng.normal(size=(7, 3)).astype(np.float32),
                "y": rng.normal(size=11),
            }  # float64 leaf: a float64 buffer
            out, info = pa.reduce(tree)
            for key in tree:
                ref = np.empty_like(tree[key])
                world.comm.Allreduce(tree[key], ref, op=MPI.SUM)
                # The float32 leaf travels in the float64 buffer: float32 rounding.
                tol = 1e-6 if tree[key].dtype == np.float32 else 1e-12
                np.testing.assert_allclose(
                    out[key], ref / world.size, rtol=tol, atol=tol
                )
                assert out[key].dtype == tree[key].dtype
            assert info.round == r
            assert info.contributors == world.size
            assert info.staleness == 0 and info.extra["fresh"] and info.extra["full"]


def one_hot(rank: int, step: int, size: int, steps: int) -> np.ndarray:
    """Rank ``rank``'s gradient of ``step``: 1 in a slot of its own, else 0."""
    g = np.zeros(size * steps, np.float32)
    g[rank * steps + step] = 1.0
    return g


@pytest.mark.parametrize(
    "mode,full_every",
    [("solo", None), ("solo", 4), ("majority", None), ("majority", 3)],
)
def test_rounds_reconstructed_from_their_results(world, mode, full_every):
    # Every (rank, step) gradient owns one slot, so each round's result says
    # exactly whose gradients of which step it applied. The code's own counts
    # (contributors, staleness, fresh, carried) are checked against that
    # reconstruction, and the semantics against it, whatever the timing: the
    # rank-dependent sleeps only make partial rounds likely, nothing relies on
    # them.
    P, steps = world.size, 24
    rng = np.random.default_rng((17, world.rank))
    infos, rounds = [], []
    with PartialAllreduce(world.comm, mode=mode, full_every=full_every, seed=7) as pa:
        world.barrier()
        for s in range(steps):
            time.sleep(rng.uniform(0, 0.004) * world.rank)
            out, info = pa.reduce(one_hot(world.rank, s, P, steps))
            rounds.append(out)
            infos.append(info)
        rest, finfo = pa.drain()
        rounds.append(rest)
        initiators = [pa.initiator(b) for b in range(1, steps + 1)]
    assert len(set(world.allgather(digest(rounds)))) == 1
    counts = [np.rint(r.astype(np.float64) * P).astype(int) for r in rounds]
    assert all(set(np.unique(c)) <= {0, 1} for c in counts)
    # Applied exactly once: every slot in exactly one round (the drain included).
    np.testing.assert_array_equal(np.sum(counts, axis=0), np.ones(P * steps, int))
    for b, (info, c) in enumerate(zip(infos, counts), start=1):
        slots = np.flatnonzero(c)
        applied = [(int(i) // steps, int(i) % steps) for i in slots]
        fresh = {r for r, s in applied if s == b - 1}
        ages = [b - 1 - s for r, s in applied if r == world.rank]
        assert all(s <= b - 1 for _, s in applied), "a gradient before its step"
        assert info.round == b
        assert info.contributors == len(fresh), (b, info.contributors, applied)
        assert info.extra["fresh"] == (world.rank in fresh)
        assert info.staleness == max(ages, default=0), (b, ages)
        assert info.extra["carried_total"] == len(applied) - len(fresh)
        if full_every is not None and b % full_every == 0:
            assert info.extra["full"] and fresh == set(range(P))
            # Everything carried is delivered there: no step before b is left.
            delivered = np.sum(counts[:b], axis=0).reshape(P, steps)
            assert delivered[:, :b].all(), f"sync round {b} left gradients behind"
        elif mode == "majority":
            assert initiators[b - 1] in fresh, (b, initiators[b - 1], fresh)
        else:
            assert fresh, f"solo round {b} ran with no fresh gradient"
        if full_every is not None:
            assert max(ages, default=0) <= full_every - 1
    # The drain delivers whatever was still carried, and nothing fresh.
    assert finfo.contributors == 0 and finfo.round == steps + 1


@pytest.mark.parametrize(
    "mode,full_every",
    [("solo", None), ("solo", 5), ("majority", None), ("majority", 4)],
)
def test_conservation_and_identical_results(world, mode, full_every):
    rng = np.random.default_rng((11, world.rank))
    delays = rng.exponential(0.004, size=60) * (rng.random(60) < 0.5)
    with PartialAllreduce(world.comm, mode=mode, full_every=full_every) as pa:
        results, infos, own = run_steps(pa, world, 60, lambda s: delays[s], seed=3)
        rest, finfo = pa.drain()
    results.append(flat(rest))
    # Every gradient computed is applied exactly once: P * sum(results) == sum(g).
    # Each round's sum is an integer; divided by a P that is not a power of two it
    # is rounded, so the sums are taken back to integers round by round.
    everyone = world.comm.allreduce(own)
    sums = np.rint(world.size * np.asarray(results, np.float64))
    np.testing.assert_array_equal(sums.sum(axis=0), everyone)
    # Every rank applied the identical sequence of round results.
    assert len(set(world.allgather(digest(results)))) == 1
    assert [i.round for i in infos] == list(range(1, 61))
    assert finfo.round == 61 and finfo.contributors == 0 and finfo.extra["full"]
    if full_every is not None:
        assert max(i.staleness for i in infos) <= full_every - 1
        assert all(
            i.contributors == world.size for i in infos if i.round % full_every == 0
        )
    assert min(i.contributors for i in infos) >= 1


def test_identical_parameters_after_many_steps(world):
    # SGD on a toy quadratic with random per-rank delays: replicas must match
    # bit for bit after the same number of steps.
    rng = np.random.default_rng((5, world.rank))
    params = {"w": np.ones((4, 4), np.float32), "b": np.zeros(4, np.float32)}
    with PartialAllreduce(world.comm, mode="solo", full_every=8) as pa:
        for _ in range(80):
            time.sleep(rng.uniform(0, 0.003))
            grads = {
                k: v - rng.normal(size=v.shape).astype(np.float32)
                for k, v in params.items()
            }
            avg, _ = pa.reduce(grads)
            params = {k: params[k] - np.float32(0.1) * avg[k] for k in params}
        rest, _ = pa.drain()
        params = {k: params[k] - np.float32(0.1) * rest[k] for k in params}
    assert len(set(world.allgather(digest(params.values())))) == 1


def test_majority_initiator_sequence_is_shared(world):
    with PartialAllreduce(world.comm, mode="majority", seed=42) as pa:
        seq = [pa.initiator(r) for r in range(1, 201)]
    assert all(other == seq for other in world.allgather(seq))
    assert set(seq) == set(range(world.size))  # every rank gets to initiate


@pytest.mark.parametrize("mode,full_every", [("solo", None), ("majority", 32)])
def test_thousand_rounds_random_delays(world, mode, full_every):
    rng = np.random.default_rng((99, world.rank))
    own = np.zeros(3)
    total = np.zeros(3)
    t0 = time.perf_counter()
    with PartialAllreduce(world.comm, mode=mode, full_every=full_every) as pa:
        world.barrier()
        for _ in range(1000):
            if rng.random() < 0.3:
                time.sleep(rng.uniform(0, 0.002))
            g = rng.integers(-4, 5, size=3).astype(np.float32)
            own += g
            out, _ = pa.reduce(g)
            total += np.rint(world.size * out.astype(np.float64))  # see above
        rest, _ = pa.drain()
        total += np.rint(world.size * rest.astype(np.float64))
    np.testing.assert_array_equal(total, world.comm.allreduce(own))
    assert time.perf_counter() - t0 < 60


def test_background_sleeps_while_idle(world):
    from research.comm.asynchronous.progress import get_progress

    with PartialAllreduce(world.comm, mode="solo") as pa:
        pa.reduce(np.zeros(4, np.float32))
        world.barrier()
        rounds0, wall0 = get_progress().rounds, time.perf_counter()
        time.sleep(0.5)  # the background task awaits the next activation
        rounds = get_progress().rounds - rounds0
        wall = time.perf_counter() - wall0
        pa.drain()
    # Sleeping between polls (rising to 1 ms while nothing comes): hundreds of
    # wake-ups in 0.5 s, where a busy-polling task would make one every few
    # microseconds. A count, so a loaded machine lowers it and cannot fail it.
    assert rounds < wall / 100e-6, f"idle task polled {rounds} times in {wall:.3f} s"


def test_drain_then_no_message_left(world):
    pa = PartialAllreduce(world.comm, mode="solo", full_every=None)
    side = world.comm.Dup()
    # Rank 0 makes all its calls before any other rank makes one (a message
    # orders them, not a sleep): it activates every round alone, and the others
    # carry all five of their gradients into the drain.
    if world.rank > 0:
        side.recv(source=0, tag=3)
    total = np.zeros(2)
    for s in range(5):
        out, _ = pa.reduce(np.full(2, s + 1.0, np.float32))
        total += np.rint(world.size * out.astype(np.float64))
    if world.rank == 0:
        for r in range(1, world.size):
            side.send(None, dest=r, tag=3)
    out, info = pa.drain()
    total += np.rint(world.size * out.astype(np.float64))
    side.Free()
    # Every rank's 1..5, each applied once (sums / P, rounded back to integers).
    np.testing.assert_array_equal(total, np.full(2, 15.0 * world.size))
    assert info.extra["carried_total"] == 5 * (world.size - 1)
    world.barrier()
    assert not pa._comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
    pa.close()
    pa.close()  # idempotent
    with pytest.raises(RuntimeError):
        pa.reduce(np.zeros(2, np.float32))


def test_mismatched_calls_are_detected(world):
    if world.size < 2:
        pytest.skip("needs two ranks")
    pa = PartialAllreduce(world.comm, mode="solo")
    pa.reduce(np.zeros(2, np.float32))
    # Rank 0 drains while the others reduce: the round sees both (every rank
    # raises) or a peer ran it as a partial round first (rank 0 raises).
    try:
        if world.rank == 0:
            pa.drain()
        else:
            pa.reduce(np.zeros(2, np.float32))
        raised = False
    except RuntimeError as exc:
        assert "same number of reduce() calls" in str(exc)
        raised = True
    assert raised or world.rank != 0
    pa.__exit__(RuntimeError, None, None)  # local stop: a peer may have gone on


def test_the_strategy_over_the_collective(world):
    with pytest.raises(TypeError):  # full_every's old name (never released)
        SyncOptions(sync_every=2)
    av = SyncOptions(full_every=2).create(world)
    assert av.pa.full_every == 2 and av.pa.mode == "sync" and av.drift == 0
    tree = {"a": np.full(3, float(world.rank), np.float32)}
    out, info = av.reduce(tree)
    assert info.round == 1
    out, info = av.reduce(tree)  # round 2 is full
    np.testing.assert_array_equal(out["a"], np.mean(range(world.size)))
    assert av.carried() is None  # nothing carried after a full round
    assert av.drain() is None  # the one call's drain: the same
    av.close()


def test_left_open_does_not_hang_finalize(world):
    # Deliberately never closed: the atexit hook stops the task before
    # MPI_Finalize. A hang here would time the whole file out.
    pa = PartialAllreduce(world.comm, mode="majority")
    pa.reduce(np.ones(2, np.float32))
    pa.drain()


@pytest.mark.parametrize("mode", ["sync", "solo"])
def test_emulated_link_holds_each_round(world, mode):
    from research.comm.link import Link

    link = Link.parse("1gbps:1ms")
    with PartialAllreduce(world.comm, mode=mode, link=link) as pa:
        infos = run_steps(pa, world, 3, lambda s: 0.0)[1]
        pa.drain()
    nbytes = infos[0].bytes + (5 + world.size) * 4  # payload + metadata, float32
    model = link.allreduce(nbytes, world.size)
    for info in infos:
        # A lower bound only: activation to result covers the modelled time.
        assert info.extra["round_s"] >= model - 1e-9
        assert info.extra["emulated_s"] >= 0
