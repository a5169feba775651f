"""``research.averaging``: every offered strategy behind ``avg(grads)``, under MPI.

Checked against independent references computed from every rank's gathered
inputs: the exact strategies return the mean; the partial ones apply every
gradient exactly once over their rounds and the drain; top-k sends exactly k
entries, keeps the rest in its residual (sent + kept = accumulated), and its
state resumes it exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mpi4py import MPI

import research
from research.strategies import registry

NOT_OFFERED = [n for n in registry.names() if registry.options_class(n).no_call_form]

SHAPES = {"b": (30,), "s": (), "w": (40, 30)}  # sorted: jax's flattening order


def _grads(rank: int, step: int) -> dict:
    """Small integers (exact sums in float32), different on every rank and step."""
    rng = np.random.default_rng([rank, step])
    return {
        k: jnp.asarray(rng.integers(-8, 9, s).astype(np.float32))
        for k, s in SHAPES.items()
    }


def _gathered_sum(world, tree) -> dict:
    every = world.allgather({k: np.asarray(v, np.float64) for k, v in tree.items()})
    return {k: sum(t[k] for t in every) for k in tree}


@pytest.mark.parametrize("name", ["fused", "host", "sync"])
def test_exact_strategies_return_the_mean_as_jax_arrays(world, name):
    avg = research.averaging(name, MPI.COMM_WORLD)
    for step in range(3):
        g = _grads(world.rank, step)
        out, info = avg(g)
        want = _gathered_sum(world, g)
        for k in SHAPES:
            assert isinstance(out[k], jax.Array), (name, k)
            np.testing.assert_allclose(
                np.asarray(out[k]), want[k] / world.size, rtol=1e-6, atol=1e-6
            )
        assert info.contributors == world.size
    assert avg.drain() is None and avg.state() == {}
    avg.close()


def test_fused_inside_the_users_jitted_step(world):
    avg = research.averaging("fused", world)

    @jax.jit
    def step(params, g):
        mean, _ = avg(g)  # traced into this program
        return jax.tree.map(lambda p, m: p - 0.5 * m, params, mean)

    g = _grads(world.rank, 0)
    params = jax.tree.map(jnp.zeros_like, g)
    got = step(params, g)
    want = _gathered_sum(world, g)
    for k in SHAPES:
        np.testing.assert_allclose(
            np.asarray(got[k]), -0.5 * want[k] / world.size, rtol=1e-6, atol=1e-6
        )


@pytest.mark.parametrize("name", ["solo", "majority"])
def test_partial_strategies_apply_every_gradient_once(world, name):
    """Whatever the rounds did, the results plus the drain sum to every rank's
    every gradient over P: nothing lost, nothing applied twice."""
    steps = 6
    with research.averaging(name, world, full_every=None) as avg:
        applied = {k: np.zeros(s) for k, s in SHAPES.items()}
        sent = {k: np.zeros(s) for k, s in SHAPES.items()}
        for step in range(steps):
            g = _grads(world.rank, step)
            out, info = avg(g)
            assert isinstance(out["w"], jax.Array)
            for k in SHAPES:
                applied[k] += np.asarray(out[k], np.float64)
                sent[k] += np.asarray(g[k], np.float64)
        rest = avg.drain()
        if rest is not None:
            for k in SHAPES:
                applied[k] += np.asarray(rest[0][k], np.float64)
        want = _gathered_sum(world, sent)
        for k in SHAPES:
            np.testing.assert_allclose(
                applied[k], want[k] / world.size, rtol=1e-6, atol=1e-5
            )
    assert len({repr(world.allgather(applied["b"].tolist()))}) == 1


def test_topk_sends_k_keeps_the_rest_and_resumes_exactly(world):
    density = 0.05
    avg = research.averaging("sparse", world, density=density)
    n = sum(int(np.prod(s)) for s in SHAPES.values())
    k = int(np.ceil(density * n))
    residual = np.zeros(n, np.float32)
    for step in range(3):
        g = _grads(world.rank, step)
        flat = np.concatenate([np.asarray(g[x]).reshape(-1) for x in SHAPES])
        acc = residual + flat
        out, info = avg(g)
        kept = avg.state()["residual"]
        sent = acc - kept
        assert np.count_nonzero(sent) <= k  # exactly k chosen (zeros may tie)
        np.testing.assert_array_equal(acc, sent + kept)  # bit for bit
        chosen = np.flatnonzero(kept != acc)
        assert np.all(kept[chosen] == 0)
        # The mean is the sum of every rank's sent entries over P.
        total = np.sum(world.allgather(sent.astype(np.float64)), axis=0)
        got = np.concatenate(
            [np.asarray(out[x], np.float64).reshape(-1) for x in SHAPES]
        )
        np.testing.assert_allclose(got, total / world.size, rtol=1e-6, atol=1e-6)
        residual = kept
    # A fresh one given the state continues exactly where this one is.
    twin = research.averaging("sparse", world, density=density)
    twin.load_state(avg.state())
    g = _grads(world.rank, 3)
    a, _ = avg(g)
    b, _ = twin(g)
    for x in SHAPES:
        np.testing.assert_array_equal(np.asarray(a[x]), np.asarray(b[x]))
    np.testing.assert_array_equal(avg.state()["residual"], twin.state()["residual"])


@pytest.mark.parametrize("name", NOT_OFFERED)
def test_strategies_without_the_form_say_why(world, name):
    with pytest.raises(
        ValueError, match="has no avg\\(grads\\) form: .*experiments.train"
    ):
        research.averaging(name, world)


def test_host_strategies_refuse_to_run_inside_jit(world):
    avg = research.averaging("host", world)
    with pytest.raises(TypeError, match="outside jit"):
        jax.jit(lambda g: avg(g)[0])(_grads(world.rank, 0))
    with pytest.raises(ValueError, match="no option"):
        research.averaging("host", world, density=0.1)
