"""``sparse``: top-k with error feedback over SparCML's sparse allreduce (SC19).

Renggli, Ashkboos, Aghagolzadeh, Alistarh, Hoefler, *SparCML: High-Performance
Sparse Communication for Machine Learning*, SC19. One step on each rank::

    grads = grad_step(state, x, y)                          # jitted
    g   = flat(grads) + wd * flat(params)                   # local decay
    acc = residual + g            (error feedback; else g)
    idx, vals = top-k |acc|       (global, or each parameter array on its own)
    residual' = acc with idx zeroed   (error feedback; else no residual)
    mean = sparse_allreduce(idx, vals) / P                  # host (SparCML)
    state = apply_step(state, unflat(mean))                 # jitted, no decay

The first ``warmup_steps`` steps allreduce ``g`` whole (dense) and leave the
residual as it is. The collective is :class:`research.comm.sparse.mean.
SparseMean` (``algorithm``, ``bits``, ``link``: see there).

``select="threshold"`` (default): the four middle lines are one pass on the
host over zero-copy views of the gradient's leaves, into a residual buffer the
strategy keeps, by the library's ``TopKAllreduce`` (``research/comm/sparse/
topk.py``: the exact top-k set, exactly k entries); the mean is decoded into
its reused buffer, whose views are the update's gradient. No gradient-sized
buffer is allocated per step. ``select="exact"``: selection and residual in
one jitted program with ``jax.lax.top_k`` (for comparison; a sort of the whole
gradient: 0.6-2.3 s for a ResNet-50-sized gradient here).

The residual is a flat float32 vector in ``state.strategy["residual"]``. With
``threshold`` the strategy's buffer is the live residual and the state's entry
is a copy made by ``drain_into`` (the loop drains before every evaluation,
checkpoint snapshot and at the end), so read it after a drain; a state given
back by a restore is taken into the buffer at the next step. It is
checkpointed with the state, and DeepFreeze saves and restores it per rank
(``"strategy"`` is rank-local by default, ``research.checkpoint.config``). The
single-copy baselines (rank0-blocking and the like) save rank 0's residual and
give it to every rank on restore, so a resumed sparse run with them is not
exact: the other ranks' unsent mass is lost and rank 0's is applied P times.

Weight decay is applied here once, to the local gradient before the residual
and selection (so that decay is not held back in the residual for many steps
or compressed away); :meth:`Sparse.start` swaps the state's optimizer for one
without it (``StepContext.optimizer(1, weight_decay=0.0)``).

In a user's own loop, outside ``jit``, one-pass top-k from the first call::

    avg = research.averaging("sparse", world, density=0.01)
    grads, info = avg(grads)          # the residual kept inside: avg.state()
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from research.comm.info import CommInfo
from research.comm.sparse.select import k_for
from research.options import Range, option
from research.strategies.base import (
    StepContext,
    StepOut,
    Strategy,
    StrategyOptions,
    step_phases,
    timed_grad,
)
from research.strategies.registry import register
from research.trace import get_tracer

if TYPE_CHECKING:
    from research.steps.state import TrainState


@register("sparse")
@dataclasses.dataclass(frozen=True)
class SparseOptions(StrategyOptions):
    """Options of ``sparse`` (``--strategy-opt KEY=VALUE``).

    Attributes:
      density: fraction of entries each rank sends (``k = ceil(density * n)``).
      scope: ``"global"`` (top-k over all parameters) or ``"per-layer"`` (top-k
        of each parameter array with its own ``k``; ``"layer"`` too).
      bits: 0 (full precision) or 2, 4, 8 (QSGD buckets of 512).
      warmup_steps: dense steps first (Ok-Topk, DGC and PowerSGD warm up
        densely).
      error_feedback: keep what was not sent in a per-rank residual, added
        before the next selection (False: unsent mass is dropped).
      algorithm: the collective (``auto``, ``ssar_rd``, ``ssar_sag``,
        ``dsar_sag``, ``dense``).
      select: how the top-k is found: ``threshold`` or ``exact``.
      seed: quantization draws, per rank and step.
      link: an emulated link (``research.comm.link``), or ``real``.
    """

    density: float = option(0.01, Range(gt=0, le=1))
    scope: Literal["global", "per-layer", "layer"] = "global"
    bits: Literal[0, 2, 4, 8] = 0
    warmup_steps: int = option(0, Range(ge=0))
    error_feedback: bool = True
    algorithm: Literal["auto", "ssar_rd", "ssar_sag", "dsar_sag", "dense"] = "auto"
    select: Literal["threshold", "exact"] = "threshold"
    seed: int = option(0, Range(ge=0))
    link: str = "real"

    def create(self, world: Any) -> Sparse:
        return Sparse(world, self)


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
    import jax
    import jax.numpy as jnp
    from jax.flatten_util import ravel_pytree

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
    import jax
    import jax.numpy as jnp
    from jax.flatten_util import ravel_pytree

    def flat(params, grads):
        g = ravel_pytree(grads)[0].astype(jnp.float32)
        if wd:
            g = g + wd * ravel_pytree(params)[0].astype(jnp.float32)
        return g

    return jax.jit(flat)


class Sparse(Strategy):
    """Top-k selection with error feedback, host sparse allreduce, jitted update."""

    def __init__(self, world: Any, options: SparseOptions) -> None:
        super().__init__(world, options)
        from research.comm.sparse.mean import SparseMean

        self.scope = "per-layer" if options.scope == "layer" else options.scope
        self.mean = SparseMean(
            self.world,
            bits=options.bits,
            algorithm=options.algorithm,
            seed=options.seed,
            link=options.link,
        )
        self._call: Any = None  # the one-call form's top-k, made on first use

    def _topk_for(self, wd: float) -> Any:
        from research.comm.sparse.topk import TopKAllreduce

        o = self.options
        return TopKAllreduce(
            self.world, density=o.density, scope=self.scope,
            error_feedback=o.error_feedback, seed=o.seed, wd=wd, mean=self.mean,
        )  # fmt: skip

    # -- a user's own loop ------------------------------------------------------------
    def __call__(self, grads: Any) -> tuple[Any, CommInfo]:
        """One-pass top-k with error feedback from the first call (the residual
        kept inside: :meth:`state`)."""
        if self.options.warmup_steps or self.options.select != "threshold":
            raise ValueError(
                "sparse: warmup_steps and select=exact are Trainer options; "
                "the one call is one-pass top-k from the first call"
            )
        return self.one_call()(grads)

    def one_call(self) -> Any:
        """The :class:`~research.comm.sparse.topk.TopKAllreduce` the one call
        runs (made on first use; the residual is its)."""
        if self._call is None:
            self._call = self._topk_for(0.0)
        return self._call

    def state(self) -> dict[str, Any]:
        """This rank's residual (a copy) and the call count."""
        return self.one_call().state()

    def load_state(self, state: dict[str, Any]) -> None:
        self.one_call().load_state(state)

    def summary(self) -> dict[str, Any]:
        """The cost model ``auto`` chose with, and where it came from."""
        return self.mean.summary()

    # -- the Trainer ------------------------------------------------------------------
    def start(self, state: TrainState, ctx: StepContext) -> TrainState:
        import jax
        import jax.numpy as jnp
        from jax.flatten_util import ravel_pytree

        super().start(state, ctx)
        avg = self.options
        wd = float(ctx.weight_decay)
        # Decay is applied here, to the local gradient before the residual and
        # the selection: the update must not decay again.
        _, tx = ctx.optimizer(1, weight_decay=0.0)
        state = state.replace(tx=tx, opt_state=tx.init(state.params))
        flat, self._unravel_fn = ravel_pytree(state.params)
        self.dim = int(flat.size)
        if flat.dtype != jnp.float32:
            raise ValueError(f"sparse strategy needs float32 parameters: {flat.dtype}")
        if self.dim >= 2**31:
            raise ValueError("sparse strategy: more than 2**31 - 1 parameters")
        leaves = jax.tree.leaves(state.params)
        self._shapes = [tuple(x.shape) for x in leaves]
        leaf_sizes = [int(x.size) for x in leaves]
        sizes = [self.dim] if self.scope == "global" else leaf_sizes
        ks = [k_for(avg.density, n) for n in sizes]
        self.k = sum(ks)
        self.threshold = avg.select == "threshold"
        if self.threshold:
            # The library's one-call top-k, driven in two timed halves.
            self._topk = self._topk_for(wd)
            self._topk.start(leaves, jax.tree.structure(state.params))
            assert self._topk.k == self.k
            self._residual = self._topk.residual
            self._adopted: Any = None  # the state's residual the buffer holds
            self._treedef = jax.tree.structure(state.params)
        else:
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

    @property
    def topk(self) -> Any:
        """The top-k object it runs (``select="threshold"``; None for
        ``"exact"``): its selection, buffers and sparse allreduce."""
        return getattr(self, "_topk", None)

    def _views(self, flat: np.ndarray) -> Any:
        """The tree of ``flat``'s pieces shaped like the parameters (no copy)."""
        import jax

        out, off = [], 0
        for shape in self._shapes:
            n = int(np.prod(shape, dtype=np.int64))
            out.append(flat[off : off + n].reshape(shape))
            off += n
        return jax.tree.unflatten(self._treedef, out)

    def _select_host(self, state: TrainState, grads: Any, step: int):
        """Threshold selection on the host; the strategy's buffer is the residual."""
        import jax

        if self.options.error_feedback:
            held = state.strategy.get("residual")
            if held is not self._adopted:  # first step, or a restored state
                np.copyto(self._residual, np.asarray(held, np.float32))
                self._adopted = held
        params = jax.tree.leaves(state.params) if self._topk.wd else None
        return self._topk.select(jax.tree.leaves(grads), params, step)

    def step(self, state, x, y, *, step, hold) -> StepOut:
        import jax
        import jax.numpy as jnp

        from research.steps import jitted as steps

        avg = self.options
        grads, batch_stats, m, compute_s = timed_grad(state, x, y, step)
        hold()
        dense = step < avg.warmup_steps  # dense warm-up steps first
        t0 = time.perf_counter()
        with get_tracer().span("top-k", "compute", step=step):
            if dense:
                flat = np.asarray(self._flat(state.params, grads))
            elif self.threshold:
                idx, vals = self._select_host(state, grads, step)
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
        del grads
        t1 = time.perf_counter()
        with get_tracer().span("average", "comm", step=step, strategy=self.name) as sp:
            if dense:
                mean, info = self.mean.reduce_dense(flat, step)
            elif self.threshold:
                mean, info = self._topk.sum(idx, vals, step)
            else:
                mean, info = self.mean.reduce_sparse(idx, vals, self.dim, step)
            sp.set(bytes=info.bytes, contributors=info.contributors)
        t2 = time.perf_counter()
        with get_tracer().span("update", "update", step=step):
            if self.threshold:
                # The residual stays out of the donated state: it is the
                # strategy's buffer (published by drain_into), not a jax array.
                keep = state.strategy
                bare = state.replace(
                    strategy={k: v for k, v in keep.items() if k != "residual"}
                )
                bare = steps.apply_step(bare, self._views(mean), batch_stats)
                jax.block_until_ready(bare.params)
                state = bare.replace(strategy={**bare.strategy, **keep})
            else:
                state = steps.apply_step(state, self._unravel(mean), batch_stats)
                jax.block_until_ready(state.params)
        phases = step_phases(
            compute_s,
            exposed_s=t2 - t1,  # blocking
            busy_s=t2 - t1,
            update_s=time.perf_counter() - t2,
            select_s=t1 - t0,
        )
        return state, m, info, phases

    def drain_into(self, state: TrainState, final: bool = False) -> TrainState:
        """Publish the live residual into the state (a copy), for checkpoints."""
        import jax.numpy as jnp

        if not (self.threshold and self.options.error_feedback):
            return state
        if state.strategy.get("residual") is not self._adopted:
            return state  # not taken in yet (no step since start or a restore)
        published = jnp.array(self._residual)
        self._adopted = published
        return state.replace(strategy={**state.strategy, "residual": published})
