"""The asynchronous parameter server baseline, under mpiexec -n 2 and -n 4."""

from __future__ import annotations

import time

import numpy as np
import pytest

from research.comm.ps import ParameterServer, optimizer_update
from research.strategies.base import StepContext
from research.strategies.ps import PSOptions


def sgd(lr):
    return lambda params, grads: {k: params[k] - lr * grads[k] for k in params}


def grads_of(rank, step):
    rng = np.random.default_rng((rank, step))
    return {
        "w": rng.integers(-4, 5, size=(2, 3)).astype(np.float32),
        "b": rng.integers(-4, 5, size=3).astype(np.float32),
    }


def test_every_push_is_applied_once(world):
    init = {"w": np.zeros((2, 3), np.float32), "b": np.ones(3, np.float32)}
    rng = np.random.default_rng(world.rank)
    own = {"w": np.zeros((2, 3)), "b": np.zeros(3)}
    rounds = []
    with ParameterServer(world.comm) as ps:
        ps.bind(init, sgd(0.5))
        for s in range(25):
            time.sleep(rng.uniform(0, 0.004))
            g = grads_of(world.rank, s)
            for k in own:
                own[k] += g[k]
            params, info = ps.push_pull(g)
            assert info.staleness >= 0 and info.contributors == 1
            rounds.append(info.round)
        final, finfo = ps.finish()
    # Plain SGD commutes: the final parameters are init - lr * (all gradients).
    for k in init:
        expect = init[k] - 0.5 * world.comm.allreduce(own[k])
        np.testing.assert_array_equal(final[k], expect)
        assert final[k].dtype == init[k].dtype
    assert finfo.round == 25 * world.size
    assert rounds == sorted(rounds) and len(set(rounds)) == 25
    assert len(set(world.comm.allgather(final["w"].tobytes()))) == 1


def test_workers_do_not_wait_for_each_other(world):
    if world.size < 2:
        pytest.skip("needs two ranks")
    # The last rank pushes once, then waits until every other worker has made all
    # its pushes, and only then makes its own. If a push waited for the other
    # workers, the fast ones could never finish and the straggler's deadline
    # would fail the test: an ordering enforced by messages, not by sleeps.
    init = {"w": np.zeros(4, np.float32)}
    steps, straggler = 10, world.size - 1
    side = world.comm.Dup()  # the test's own messages, apart from the server's
    with ParameterServer(world.comm) as ps:
        ps.bind(init, sgd(0.1))
        ps.push_pull({"w": np.ones(4, np.float32)})
        if world.rank == straggler:
            pending = [side.irecv(source=r, tag=7) for r in range(straggler)]
            deadline = time.monotonic() + 120
            while not all(req.Test() for req in pending):
                assert time.monotonic() < deadline, "fast workers were held back"
                time.sleep(1e-3)
        else:
            for _ in range(steps - 1):
                _, info = ps.push_pull({"w": np.ones(4, np.float32)})
            side.send(info.round, dest=straggler, tag=7)
        for _ in range(steps - 1 if world.rank == straggler else 0):
            ps.push_pull({"w": np.ones(4, np.float32)})
        final, finfo = ps.finish()
    side.Free()
    assert finfo.round == steps * world.size
    np.testing.assert_allclose(final["w"], -0.1 * steps * world.size, rtol=1e-6)


def test_optimizer_update_and_the_strategy(world):
    """The ``ps`` strategy over the server: started with the run's optimizer
    (scaled for P pushes: ``StepContext.optimizer(P)``), ranks unbounded apart."""
    import types

    optax = pytest.importorskip("optax")
    init = {"w": np.full(3, 2.0, np.float32)}
    av = PSOptions().create(world)
    assert av.drift is None  # the stop agreement waits without bound
    with pytest.raises(RuntimeError, match="bind"):
        av.reduce(init)
    asked = []

    def optimizer(pushes, weight_decay=None):
        asked.append(pushes)
        return None, optax.sgd(0.1, momentum=0.9)

    av.start(types.SimpleNamespace(params=init), StepContext(optimizer))
    assert asked == [world.size]
    for s in range(5):
        params, info = av.reduce({"w": np.full(3, float(world.rank + s), np.float32)})
        assert params["w"].shape == (3,)
    final, info = av.carried()
    digests = world.comm.allgather(np.asarray(final["w"]).tobytes())
    assert len(set(digests)) == 1
    assert info.round == 5 * world.size
    av.close()
    av.close()


def test_optimizer_update_matches_plain_sgd():
    optax = pytest.importorskip("optax")
    params = {"w": np.ones(3, np.float32)}
    update = optimizer_update(optax.sgd(0.25), params)
    out = update(params, {"w": np.full(3, 2.0, np.float32)})
    np.testing.assert_allclose(out["w"], 0.5)


def test_emulated_link_serialises_the_servers_port(world):
    # Every remote worker pushes at once: the server's port takes their pushes
    # one after another, then sends the replies one after another, so the last
    # reply cannot come before (P - 1) inbound plus one outbound transfer.
    from research.comm.link import Link

    link = Link.parse("0.2gbps:1ms")
    init = {"w": np.zeros(50_000, np.float32)}  # 200 kB: 9 ms per message
    with ParameterServer(world.comm, link=link) as ps:
        ps.bind(init, sgd(0.1))
        world.barrier()
        t0 = time.perf_counter()
        _, info = ps.push_pull({"w": np.ones(50_000, np.float32)})
        took = time.perf_counter() - t0
        final, _ = ps.finish()
    np.testing.assert_allclose(final["w"], -0.1 * world.size)
    one = link.p2p(info.bytes)
    if not ps.is_server:
        assert took >= one  # its own push's transfer, at the least
    slowest = max(world.comm.allgather(took))
    if world.size > 1:
        assert slowest >= world.size * one - 1e-3  # sleep granularity
