"""The ``adaptive`` strategy's first figures: every candidate's collective once.

Before the model has seen a step of a candidate it needs that candidate's
figures: :func:`seed` runs each candidate's collective four times on a tree
shaped like the gradients and takes the median time of the last three (top-k:
its selection and its sparse allreduce, with the cost model it agrees on; a
partial collective: its rounds, what they carried taken back and dropped,
then left resting unless it runs first; the dense allreduce: its timed choice
of path first), and a tiny dense allreduce's, the latency the model takes as
dense's own fixed part. Collective: every rank runs it at the same point (the
Trainer's start, the one-call form at its first call), so every
candidate's buffers, communicators and choices also exist before a step needs
them.

Every rank's figures are gathered; a synchronous collective's time is the
least over the ranks (the last to arrive waits least), a partial one's the
most (the one that started the round waited for all of it). Returns the
figures for ``summary.json``.

:func:`startup` is the Trainer's start-up of the strategy (collective, outside
the steps' time), so that no step pays for what a candidate sets up on first
use: the update program of every state shape the candidates use is compiled
and timed (on a copy of the state, a zero gradient), then :func:`seed` runs
(top-k's on the strategy's own selection and buffers, which it first touches).
The first step compiles the gradient, as every strategy's first step does.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from research.steps import jitted as steps
from research.strategies.adaptive.candidates import DENSE, PARTIAL, SPARSE


def _timed(fn, *args, reps: int = 3) -> tuple[Any, float]:
    """The result of the last of ``reps + 1`` calls and the median time of
    the last ``reps`` (the first sets things up)."""
    out = fn(*args)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn(*args)
        times.append(time.perf_counter() - t0)
    return out, float(np.median(times))


def seed(
    avg: Any, grads: Any, other: dict[str, float] | None = None,
    topks: dict[str, Any] | None = None,
) -> dict:  # fmt: skip
    """Measure every candidate of ``avg`` (an :class:`Adaptive`) on
    ``grads`` (numpy leaves) and seed its model; ``other``: seconds per step
    besides the collective, by kind (``"dense"``, ``"sparse"``, ``"partial"``:
    the update; top-k's selection is added here); ``topks``: the top-k objects
    that will run (label -> ``TopKAllreduce``, started), so that their own
    buffers are set up here (the caller zeroes their residuals), else one is
    made for the measurement."""
    other, topks = other or {}, topks or {}
    t_all = time.perf_counter()
    mine: list[float] = []
    transfer: dict[str, float] = {}
    for c in avg.cands:
        child = avg.child(c.label)
        extra = other.get(c.kind, 0.0)
        if c.kind == SPARSE:
            leaves, treedef = jax.tree.flatten(grads)
            topk = topks.get(c.label)
            if topk is None:
                topk = child._topk_for(0.0)
                topk.start(leaves, treedef)
            (idx, vals), select_s = _timed(topk.select, leaves, None, 0)
            (_, info), comm_s = _timed(topk.sum, idx, vals, 0)
            extra += select_s
            transfer[c.label] = float(info.extra.get("transfer_s", 0.0))
        else:
            (_, info), comm_s = _timed(child.reduce, grads)
            if c.kind == PARTIAL:
                child.take_carried()  # start-up's gradients: dropped
                if c is not avg.current:
                    child.rest()
        mine += [comm_s, float(info.bytes), extra, transfer.get(c.label, 0.0)]
    dense = avg.child(avg.cands[avg.policy.dense].label)
    _, latency = _timed(dense.reduce, {"x": np.zeros(8, np.float32)})
    mine.append(latency)
    every = np.asarray(avg.comm.allgather(mine), np.float64)
    model = avg.policy.model
    out: dict[str, Any] = {}
    for i, c in enumerate(avg.cands):
        col = every[:, 4 * i : 4 * i + 4]
        comm = col[:, 0].max() if c.kind == PARTIAL else col[:, 0].min()
        nbytes, extra = col[:, 1].max(), float(np.median(col[:, 2]))
        model.seed(i, float(comm), float(nbytes), extra)
        out[c.label] = {
            "comm_ms": round(float(comm) * 1e3, 3),
            "bytes": int(nbytes),
            "other_ms": round(extra * 1e3, 3),
        }
    lat = float(every[:, -1].min())
    assert avg.cands[avg.policy.dense].kind == DENSE
    # The last rank to come waits for no one: the least transfer time is pure.
    pure = {i: float(every[:, 4 * i + 3].min()) for i, c in enumerate(avg.cands)
            if c.kind == SPARSE}  # fmt: skip
    model.anchor(avg.policy.dense, lat, pure)
    return {
        "seconds": round(time.perf_counter() - t_all, 3),
        "latency_ms": round(lat * 1e3, 3),
        "candidates": out,
    }


def _update(state: Any, grads: Any) -> float:
    """Compile and time the update for ``state``'s shape (on copies)."""

    def run() -> float:
        copy = jax.tree.map(jnp.copy, state)
        t0 = time.perf_counter()
        jax.block_until_ready(steps.apply_step(copy, grads, state.batch_stats).params)
        return time.perf_counter() - t0

    run()
    return run()


def startup(avg: Any, inner: Any, flat: Any, topks: dict) -> dict[str, Any]:
    """Set every candidate up and seed the model (module docstring); ``topks``:
    the top-k candidates' own objects (label -> ``TopKAllreduce``), warmed in
    place and their residuals zeroed after."""
    t0 = time.perf_counter()
    jax.block_until_ready(avg._unravel(jnp.zeros_like(flat)))  # the fold's unravel
    rng = np.random.default_rng([avg.rank, 7])
    noise = rng.standard_normal(int(flat.size)).astype(np.float32) * 1e-3
    grads = jax.tree.map(np.asarray, avg._unravel(jnp.asarray(noise)))
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
