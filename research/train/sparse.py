"""The step side of the ``sparse`` strategy (``research.comm.sparse.strategy``).

One step on each rank::

    grads = grad_step(state, x, y)                          # jitted
    g   = flat(grads) + wd * flat(params)                   # jitted, local decay
    acc = residual + g            (error feedback; else g)
    idx, vals = top-k |acc|       (global, or each parameter array on its own)
    residual' = acc with idx zeroed   (error feedback; else no residual)
    mean = sparse_allreduce(idx, vals) / P                  # host (SparCML)
    state = apply_step(state, unflat(mean))                 # jitted, no decay

Selection and residual run in one jitted program; only the selected pairs go to
the host. Dense warm-up steps allreduce ``g`` whole and leave the residual as it
is. The residual is a flat float32 vector in ``state.strategy["residual"]``: it
is checkpointed with the state, and DeepFreeze saves and restores it per rank
(``"strategy"`` is rank-local by default, ``research.checkpoint.config``). The
single-copy baselines (rank0-sync and the like) save rank 0's residual and give
it to every rank on restore, so a resumed sparse run with them is not exact:
the other ranks' unsent mass is lost and rank 0's is applied P times.

Weight decay is applied here once, to the local gradient before the residual
and selection; the loop builds this strategy's optimizer without it
(``local_weight_decay`` on the averager, ``StepContext.weight_decay``).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from research.trace import get_tracer
from research.train import step as steps
from research.train.executors import (
    Executor,
    StepOut,
    _timed_grad,
    register_executor,
)
from research.train.state import TrainState


def make_select(
    unravel_sizes: list[int], ks: list[int], wd: float, error_feedback: bool
):
    """``(params, grads, residual) -> (indices, values, residual')``, jitted.

    Args:
      unravel_sizes: element counts of the flattened segments (one segment for
        global top-k, one per parameter array for per-layer top-k), in the
        order ``ravel_pytree`` concatenates them.
      ks: entries to select from each segment.
      wd: weight decay added to the gradient (``wd * params``).
      error_feedback: add the residual before selection and keep the rest.
    """
    offsets = np.concatenate([[0], np.cumsum(unravel_sizes)[:-1]]).astype(int)

    def select(params, grads, residual):
        g = ravel_pytree(grads)[0].astype(jnp.float32)
        if wd:
            g = g + wd * ravel_pytree(params)[0].astype(jnp.float32)
        acc = residual + g if error_feedback else g
        parts = []
        for off, n, k in zip(offsets, unravel_sizes, ks):
            seg = jax.lax.dynamic_slice_in_dim(acc, int(off), int(n))
            _, i = jax.lax.top_k(jnp.abs(seg), int(k))
            parts.append(jnp.sort(i) + int(off))
        idx = jnp.concatenate(parts) if len(parts) > 1 else parts[0]
        vals = acc[idx]
        new_residual = acc.at[idx].set(0.0) if error_feedback else residual
        return idx.astype(jnp.int32), vals, new_residual

    return jax.jit(select)


def _flat_decayed(wd: float):
    def flat(params, grads):
        g = ravel_pytree(grads)[0].astype(jnp.float32)
        if wd:
            g = g + wd * ravel_pytree(params)[0].astype(jnp.float32)
        return g

    return jax.jit(flat)


@register_executor("sparse")
class SparseExecutor(Executor):
    """Jitted gradient and top-k selection, host sparse allreduce, jitted update."""

    def start(self, state: TrainState) -> TrainState:
        avg = self.averager
        if not getattr(avg, "local_weight_decay", False):
            raise ValueError(f"strategy {avg.name!r} does not apply weight decay")
        wd = float(self.ctx.weight_decay)
        flat, self._unravel_fn = ravel_pytree(state.params)
        self.dim = int(flat.size)
        if flat.dtype != jnp.float32:
            raise ValueError(f"sparse strategy needs float32 parameters: {flat.dtype}")
        if self.dim >= 2**31:
            raise ValueError("sparse strategy: more than 2**31 - 1 parameters")
        if avg.scope == "global":
            sizes = [self.dim]
        else:
            sizes = [int(x.size) for x in jax.tree.leaves(state.params)]
        ks = [avg.k_for(n) for n in sizes]
        self.k = sum(ks)
        self._select = make_select(sizes, ks, wd, avg.error_feedback)
        self._flat = _flat_decayed(wd)
        self._unravel = jax.jit(self._unravel_fn)
        if not avg.error_feedback:
            return state
        residual = state.strategy.get("residual") if state.strategy else None
        if residual is None or residual.shape != (self.dim,):
            strategy = dict(state.strategy or {})
            strategy["residual"] = jnp.zeros(self.dim, jnp.float32)
            state = state.replace(strategy=strategy)
        return state

    def step(self, state, x, y, *, step, hold) -> StepOut:
        avg = self.averager
        grads, batch_stats, m, compute_s = _timed_grad(state, x, y, step)
        hold()
        t0 = time.perf_counter()
        with get_tracer().span("top-k", "compute", step=step):
            if avg.is_dense_step(step):
                flat = np.asarray(self._flat(state.params, grads))
            else:
                residual = state.strategy.get("residual") if state.strategy else None
                if residual is None:
                    residual = jnp.zeros(self.dim, jnp.float32)
                idx, vals, residual = self._select(state.params, grads, residual)
                idx, vals = np.asarray(idx), np.asarray(vals)
                if avg.error_feedback:
                    state = state.replace(
                        strategy={**state.strategy, "residual": residual}
                    )
        t1 = time.perf_counter()
        with get_tracer().span("average", "comm", step=step, strategy=avg.name) as sp:
            if avg.is_dense_step(step):
                mean, info = avg.reduce_dense(flat, step)
            else:
                mean, info = avg.reduce_sparse(idx, vals, self.dim, step)
            sp.set(bytes=info.bytes, contributors=info.contributors)
        t2 = time.perf_counter()
        with get_tracer().span("update", "update", step=step):
            state = steps.apply_step(state, self._unravel(mean), batch_stats)
            jax.block_until_ready(state.params)
        phases = {
            "compute_s": compute_s,
            "select_s": t1 - t0,
            "comm_s": t2 - t1,
            "update_s": time.perf_counter() - t2,
        }
        return state, m, info, phases
