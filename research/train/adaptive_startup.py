"""The ``adaptive`` executor's start-up: every candidate set up before the steps.

Run by :meth:`research.train.adaptive.AdaptiveExecutor.start` on every rank
(collective), outside the steps' time, so that no step pays for what a
candidate sets up on first use: the update program of every state shape the
candidates use is compiled and timed (on a copy of the state, a zero
gradient), then every candidate's collective runs (top-k's on the executor's
own selection and buffers, which it first touches) and seeds the model
(:func:`research.comm.adaptive.seeding.seed`). The first step compiles the
gradient, as every strategy's first step does.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from research.comm.adaptive.seeding import seed
from research.train import step as steps


def _update(state: Any, grads: Any) -> float:
    """Compile and time the update for ``state``'s shape (on copies)."""

    def run() -> float:
        copy = jax.tree.map(jnp.copy, state)
        t0 = time.perf_counter()
        jax.block_until_ready(steps.apply_step(copy, grads, state.batch_stats).params)
        return time.perf_counter() - t0

    run()
    return run()


def startup(ex: Any, inner: Any, flat: Any, topks: dict) -> dict[str, Any]:
    """Set every candidate up and seed the model (module docstring); ``topks``:
    the top-k candidates' own objects (label -> ``TopKAllreduce``), warmed in
    place and their residuals zeroed after."""
    avg = ex.averager
    t0 = time.perf_counter()
    jax.block_until_ready(ex._unravel(jnp.zeros_like(flat)))  # the fold's unravel
    rng = np.random.default_rng([avg.rank, 7])
    noise = rng.standard_normal(int(flat.size)).astype(np.float32) * 1e-3
    grads = jax.tree.map(np.asarray, ex._unravel(jnp.asarray(noise)))
    zeros = jax.tree.map(np.zeros_like, grads)
    kept = {k: v for k, v in inner.strategy.items() if k != "residual"}
    host = _update(inner, zeros)
    sparse = _update(inner.replace(strategy=kept), zeros)  # top-k's own update
    out = seed(avg, grads, {"dense": host, "partial": host, "sparse": sparse}, topks)
    for topk in topks.values():  # the start-up's noise is no residual
        topk.residual.fill(0.0)
    out["update_ms"] = round(host * 1e3, 3)
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out
