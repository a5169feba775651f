"""Steps run stage by stage, communication overlapped: the ``overlap`` executor,
and :class:`StagedExecutor`, which ``layerwise`` (``research/train/layerwise.py``)
shares.

Both run the model with :class:`research.train.stages.StagedGrad` and start a
collective on the progress thread as soon as the backward pass has produced
what it needs:

* ``overlap``: forward stage by stage, stage ``i`` first waiting for its
  allgather from the previous step; backward stage by stage, each stage's
  reduce-scatter started at once; then, in forward order, wait for the stage's
  reduce-scatter, update this rank's slice of its parameters and optimizer
  state (the run's optax transformation applied to the flat slice: SGD with
  momentum and weight decay are elementwise, so the slice follows exactly the
  replicated math), and start its allgather, which the next forward waits for.

Between drains the ``overlap`` state returned to the loop holds the parameters
the step's gradient was computed at and ``opt_state=None``: the truth is this
rank's slices and the allgathers in flight. :meth:`OverlapExecutor.drain` waits
for those, gathers the optimizer state (once, at drains only) and returns the
whole, exact state, so evaluation and checkpoints see what ``host`` would.

Timeline, per stage: ``forward <stage>`` and ``backward <stage>`` on track
``compute`` (each timed to its output being ready), ``update <stage>`` on
``update``, each collective as a ``comm-bg`` span with its bytes, and every wait
of the compute thread as ``wait <collective> <stage>`` on track ``comm`` (what an
analyzer counts as exposed communication).

Host copies (``overlap``): each stage's backward program packs its gradient
into the padded message vector itself (``StagedGrad.backward(post=...)``), so
the leaves are never materialised apart; MPI writes into reused 64-byte-aligned
host buffers that JAX reads in place (dlpack: the reduce-scatter result feeds
the update, the allgather result becomes the next forward's parameters as
views, leaf by leaf, with no unpacking program); the update donates the shard
and its optimizer state. Before (a pack program, fresh result buffers, numpy to
JAX copies, an unpack program, an undonated update: about six passes over
fresh, page-faulting memory for VGG-16's 128 MB), a one-rank VGG-16 step at
32x32, batch 4, cost 1.17-1.74 s of process CPU time against host's 0.70-0.76
s; after, 0.81 s against 0.79-0.95 s (same process, ``time.process_time``
around each step, steps 3-6; load average 9-13, so wall times were not used).

Per-step record (``CommInfo``): ``bytes`` handed to MPI, ``wait_s`` (exposed),
and in ``extra``: ``comm_s`` (time with at least one of the step's collectives
in flight), ``hidden`` (1 - exposed / comm), ``opt_bytes`` (optimizer state
held by this rank).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax

from research.comm.asynchronous.handles import Handle
from research.comm.base import CommInfo
from research.trace import get_tracer
from research.train.activation_exchange import ActivationExchange, ravel_concat
from research.train.executors import (
    Executor,
    StepContext,
    StepOut,
    register_executor,
    step_phases,
)
from research.train.flat import (
    ALIGN,
    FlatStage,
    aligned_empty,
    busy_time,
    host_view,
)
from research.train.stages import Stage, StagedGrad, commit, split_model
from research.train.state import TrainState, tree_bytes


class StagedExecutor(Executor):
    """Forward and backward stage by stage, each stage timed and traced."""

    def __init__(self, averager: Any, ctx: StepContext) -> None:
        super().__init__(averager, ctx)
        if ctx.model is None:
            raise ValueError(f"strategy {averager.name!r} needs the model (ctx.model)")
        exchange = self._exchanged(split_model(ctx.model))
        self.staged = StagedGrad.shared(ctx.model, exchange)
        self.stages = self.staged.stages
        self.size = averager.size

    def _exchanged(self, stages: Sequence[Stage]) -> list[int]:
        """Stages to run tapped (their activations exchanged): none here."""
        return []

    def _forward_done(self, i: int) -> None:
        """Called once stage ``i``'s forward output is ready."""

    def _wait(self, h: Handle, what: str, step: int) -> np.ndarray:
        with get_tracer().span(f"wait {what}", "comm", step=step):
            out = h.wait()
        self._waited += h.wait_s
        self._retired.append(h)
        return out

    def _forward(self, state, x, y, step: int, stage_params=None) -> dict:
        tracer, begun = get_tracer(), {}

        def before(i: int):
            params = stage_params(i) if stage_params else None
            begun[i] = time.perf_counter()
            return params

        def after(i: int, out: jax.Array) -> None:
            jax.block_until_ready(out)
            t1 = time.perf_counter()
            self._compute += t1 - begun[i]
            name = f"forward {self.stages[i].name}"
            tracer.complete(name, "compute", begun[i], t1, step=step)
            self._forward_done(i)

        return self.staged.forward(state, x, y, stage_params=before, after_stage=after)

    def _backward(
        self, step: int, on_grad: Callable[[int, Any], None], post=None
    ) -> None:
        """Backward stage by stage; ``on_grad(i, grads)`` once each is ready
        (``grads`` is ``post(i)(leaves)`` with a ``post``: see ``StagedGrad``)."""
        tracer = get_tracer()
        t0 = time.perf_counter()
        for i, grads in self.staged.backward(post=post):
            grads = jax.block_until_ready(grads)
            on_grad(i, grads)  # packing for MPI is the compute thread's work
            t1 = time.perf_counter()
            self._compute += t1 - t0
            name = f"backward {self.stages[i].name}"
            tracer.complete(name, "compute", t0, t1, step=step)
            t0 = time.perf_counter()

    def _begin(self) -> None:
        self._compute = self._waited = 0.0
        self._retired: list[Handle] = []
        self._sent = 0

    def _info(self, step: int, opt_bytes: int) -> CommInfo:
        comm = busy_time(self._retired)
        return CommInfo(
            bytes=self._sent,
            contributors=self.size,
            wait_s=self._waited,
            round=step + 1,
            extra={
                "comm_s": comm,
                "hidden": 1.0 - min(1.0, self._waited / comm) if comm > 0 else 0.0,
                "opt_bytes": opt_bytes,
            },
        )


class ShardedCollectives(Protocol):
    """What the ``overlap`` executor calls beyond ``Averager``."""

    rank: int
    size: int

    def shard_size(self, n: int) -> int:
        """This rank's slice length of an ``n``-element stage."""

    def reduce_scatter(self, buf: np.ndarray, label: str, out: Any = None) -> Handle:
        """Start summing ``buf`` across ranks, this rank keeping its slice."""

    def allgather(self, buf: np.ndarray, label: str, out: Any = None) -> Handle:
        """Start gathering every rank's slice into ``out``."""


@register_executor("overlap")
class OverlapExecutor(StagedExecutor):
    """Reduce-scatter, sharded update and allgather overlapped (SC18); with
    ``fc_exchange``, dense stages exchange activations instead
    (``research.train.activation_exchange``)."""

    needs = ShardedCollectives

    def _exchanged(self, stages: Sequence[Stage]) -> list[int]:
        if not getattr(self.averager, "fc_exchange", False):
            return []
        tapped = [s.index for s in stages if s.exchangeable]
        if not tapped:
            raise ValueError(
                f"fc_exchange: {type(self.ctx.model).__name__} has no stage made "
                "only of dense layers (models.staging.TappedDense)"
            )
        return tapped

    def _forward_done(self, i: int) -> None:
        if i in self.fcx:
            h, nbytes = self.fcx.start_inputs(i, self.staged.taps[i])
            self._inputs[i] = h
            self._sent += nbytes

    def start(self, state: TrainState) -> None:
        P, r = self.size, self.averager.rank
        self.flats = []
        for s in self.stages:
            n = FlatStage(s, state.params).n
            # Shards of a multiple of ALIGN items keep every rank's slice of
            # the gathered vector at an address JAX can alias.
            k = -(-self.averager.shard_size(n) // ALIGN) * ALIGN
            self.flats.append(FlatStage(s, state.params, P * k, divisor=P))
        self._k = [f.padded // P for f in self.flats]
        self._lo = [r * k for k in self._k]
        _, tx = self.ctx.optimizer(1)
        tapped = [self.stages[i] for i in sorted(self.staged.exchange)]
        self.fcx = ActivationExchange(self.averager, tapped, tx)
        self._inputs: dict[int, Handle] = {}

        def update(p, g, opt):
            upd, opt = tx.update(g, opt, p)
            return optax.apply_updates(p, upd), opt

        # The shard and its optimizer state are donated: updated in place.
        self._update = jax.jit(update, donate_argnums=(0, 2))
        # Reused host buffers: one reduce-scatter result per stage (the update
        # has read it before the next step's reduce-scatter writes it), and two
        # allgather results per stage, alternate steps: the parameters gathered
        # in step t are views of one (used by step t + 1's forward and backward
        # and held in its state) while step t + 1's allgather writes the other.
        self._rs = [aligned_empty(k) for k in self._k]
        self._ag = [[aligned_empty(f.padded) for _ in range(2)] for f in self.flats]
        self._parity = 0
        self.shards: list[jax.Array] | None = None  # None: the state is the truth
        self.opt: list[Any] | None = None
        self.pending: list[Handle | None] = [None] * len(self.stages)
        self.opt_bytes = 0

    # -- slices of the state ------------------------------------------------------
    def _slice(self, i: int, tree: Any) -> Any:
        """This rank's slice of stage ``i`` of a params-shaped tree (a copy of
        the whole subtree for a stage that exchanges activations)."""
        if i in self.fcx:
            return jax.tree_util.tree_map(jnp.array, self.stages[i].params(tree))
        flat = self.flats[i].pack(self.stages[i].params(tree), jnp.float32(1))
        return flat[self._lo[i] : self._lo[i] + self._k[i]]

    def _import(self, state: TrainState) -> None:
        """This rank's slices of parameters and optimizer state, from ``state``."""
        pdef = jax.tree_util.tree_structure(state.params)

        def is_params(node: Any) -> bool:
            return jax.tree_util.tree_structure(node) == pdef

        full = state.opt_state
        nodes, self._opt_def = jax.tree_util.tree_flatten(full, is_leaf=is_params)
        self._marks = [is_params(n) for n in nodes]
        self.shards = [self._slice(i, state.params) for i in range(len(self.stages))]
        self.opt = [
            jax.tree_util.tree_map(
                lambda n, i=i: self._slice(i, n) if is_params(n) else jnp.array(n),
                full,
                is_leaf=is_params,
            )
            for i in range(len(self.stages))
        ]
        # Committed like everything the staged programs see (see
        # ``research.train.stages.commit``): one compiled update per shape.
        self.shards, self.opt = commit((self.shards, self.opt))
        self.opt_bytes = sum(tree_bytes(o) for o in self.opt)

    def _export_opt(self, step: int) -> Any:
        """The whole optimizer state, gathered from every rank's slices."""
        per_stage = [self._opt_def.flatten_up_to(o) for o in self.opt]
        handles = {}
        for k, mark in enumerate(self._marks):
            if mark:
                for i, stage in enumerate(self.stages):
                    if i in self.fcx:
                        continue  # whole on every rank
                    buf = np.asarray(per_stage[i][k])
                    label = f"optimizer {stage.name}"
                    handles[k, i] = self.averager.allgather(buf, label)
        leaves = []
        for k, mark in enumerate(self._marks):
            if not mark:
                leaves.append(per_stage[0][k])
                continue
            tree = {}
            for i, stage in enumerate(self.stages):
                if i in self.fcx:
                    tree.update(per_stage[i][k])
                    continue
                out = self._wait(
                    handles[k, i], f"allgather optimizer {stage.name}", step
                )
                tree.update(self.flats[i].unpack(host_view(out.reshape(-1))))
            leaves.append(tree)
        return jax.tree_util.tree_unflatten(self._opt_def, leaves)

    def _gathered(self, i: int, step: int) -> Any:
        h, self.pending[i] = self.pending[i], None
        out = self._wait(h, f"allgather {self.stages[i].name}", step)
        return self.flats[i].views(out.reshape(-1))

    # -- the step -------------------------------------------------------------------
    def step(self, state, x, y, *, step, hold) -> StepOut:
        self._begin()
        if self.shards is None:
            self._import(state)
        fresh: dict[str, Any] = {}

        def stage_params(i: int):
            if i in self.fcx:  # updated whole on this rank
                fresh.update(self.shards[i])
                return self.shards[i]
            if self.pending[i] is None:
                return None  # right after a drain: state.params is current
            params = self._gathered(i, step)
            fresh.update(params)
            return params

        metrics = self._forward(state, x, y, step, stage_params)
        if fresh:
            state = state.replace(params={**state.params, **fresh})
        reduced: list[Handle | None] = [None] * len(self.stages)

        def on_grad(i: int, flat: jax.Array) -> None:
            if i in self.fcx:
                reduced[i], nbytes = self.fcx.start_errors(i, flat)
                self._sent += nbytes
                return
            buf = np.asarray(flat)  # packed in the backward program; no copy
            self._sent += buf.nbytes
            name = self.stages[i].name
            reduced[i] = self.averager.reduce_scatter(buf, name, out=self._rs[i])

        self._backward(step, on_grad, post=self._post)
        hold()
        gather = [ag[self._parity] for ag in self._ag]
        self._parity ^= 1
        update_s = 0.0
        for i, stage in enumerate(self.stages):
            if i in self.fcx:
                update_s += self._exchange_update(i, reduced[i], step)
                continue
            g = self._wait(reduced[i], f"reduce-scatter {stage.name}", step)
            u0 = time.perf_counter()
            with get_tracer().span(
                f"update {stage.name}", "update", step=step, stage=stage.name
            ):
                p, self.opt[i] = self._update(self.shards[i], host_view(g), self.opt[i])
                self.shards[i] = jax.block_until_ready(p)
            update_s += time.perf_counter() - u0
            buf = np.asarray(p)
            self._sent += buf.nbytes
            self.pending[i] = self.averager.allgather(buf, stage.name, out=gather[i])
        # The optimizer state lives in the slices until the next drain.
        state = state.replace(
            step=state.step + 1, batch_stats=self.staged.batch_stats, opt_state=None
        )
        info = self._info(step, self.opt_bytes)
        phases = step_phases(
            self._compute,
            exposed_s=info.wait_s,
            busy_s=info.extra["comm_s"],
            update_s=update_s,
        )
        return state, jax.device_get(metrics), info, phases

    def _post(self, i: int) -> Callable[[list], jax.Array]:
        """What stage ``i``'s backward program packs into its message."""
        return ravel_concat if i in self.fcx else self.flats[i]

    def _exchange_update(self, i: int, errors: Handle, step: int) -> float:
        """Stage ``i``'s update from the gathered activations; its seconds."""
        name = self.stages[i].name
        inputs = self._wait(self._inputs.pop(i), f"allgather inputs {name}", step)
        errs = self._wait(errors, f"allgather errors {name}", step)
        u0 = time.perf_counter()
        with get_tracer().span(f"update {name}", "update", step=step, stage=name):
            p, self.opt[i] = self.fcx.update(
                i, self.shards[i], self.opt[i], inputs, errs
            )
            self.shards[i] = jax.block_until_ready(p)
        return time.perf_counter() - u0

    def drain(self, state: TrainState, final: bool = False) -> TrainState:
        if self.shards is None:
            return state
        self._begin()
        params = dict(state.params)
        for i in range(len(self.stages)):
            if i in self.fcx:
                params.update(self.shards[i])
            elif self.pending[i] is not None:
                # Copies: the views' buffers are written again two steps on,
                # and a drained state may outlive that (a checkpoint).
                gathered = self._gathered(i, int(state.step))
                params.update(jax.tree_util.tree_map(jnp.copy, gathered))
        opt_state = self._export_opt(int(state.step))
        self.shards = self.opt = None
        return state.replace(params=params, opt_state=opt_state)

    def close(self) -> None:
        self.averager.close()
