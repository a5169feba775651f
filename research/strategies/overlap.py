"""``overlap``: averaging overlapped with backward and forward (SC18).

Lee, Agrawal, Balaprakash, Choudhary, Liao, *Communication-Efficient
Parallelization Strategy for Deep CNN Training*, MLHPC@SC18 (the authors'
``ffbp_multistep.c``). Each stage's parameters are one float32 vector padded to
a multiple of P; forward stage by stage, stage ``i`` first waiting for its
allgather from the previous step; backward stage by stage, each stage's
reduce-scatter started at once; then, in forward order, wait for the stage's
reduce-scatter, update this rank's 1/P slice of its parameters and optimizer
state (the run's optax transformation applied to the flat slice: SGD with
momentum and weight decay are elementwise, so the slice follows exactly the
replicated math), and start its allgather, which the next forward waits for.
Optimizer memory per rank is 1/P of the replicated strategies' (ZeRO-1's
saving, with its traffic: reduce-scatter + allgather = one allreduce). It is
exact synchronous SGD, as ``host`` (``tests/mpi/test_overlap.py``). With
``fc_exchange``, stages made only of dense layers exchange their inputs and
output errors instead (``research.steps.activation_exchange``).

Between drains the state returned to the loop holds the parameters the step's
gradient was computed at and ``opt_state=None``: the truth is this rank's
slices and the allgathers in flight. :meth:`Overlap.drain_into` waits for
those, gathers the optimizer state (once, at drains only) and returns the
whole, exact state, so evaluation and checkpoints see what ``host`` would.

Timeline, per stage: ``forward <stage>`` and ``backward <stage>`` on track
``compute``, ``update <stage>`` on ``update``, each collective a ``comm-bg``
span (``research.strategies.staged``).

Host copies: each stage's backward program packs its gradient into the padded
message vector itself (``StagedGrad.backward(post=...)``), so the leaves are
never materialised apart; MPI writes into reused 64-byte-aligned host buffers
that JAX reads in place (dlpack: the reduce-scatter result feeds the update,
the allgather result becomes the next forward's parameters as views, leaf by
leaf, with no unpacking program); the update donates the shard and its
optimizer state. A one-rank VGG-16 step at 32x32, batch 4, costs 0.81 s of
process CPU time against host's 0.79-0.95 s (``time.process_time`` around
steps 3-6; ``docs/journal.md`` has the run before these copies went).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from research.strategies.base import StepContext, StepOut, StrategyOptions, step_phases
from research.strategies.registry import register
from research.strategies.staged import NO_CALL_FORM, Staged
from research.trace import get_tracer

if TYPE_CHECKING:
    import jax

    from research.comm.asynchronous.handles import Handle
    from research.steps.stages import Stage
    from research.steps.state import TrainState


@register("overlap")
@dataclasses.dataclass(frozen=True)
class OverlapOptions(StrategyOptions):
    """Options of ``overlap``.

    Attributes:
      link: an emulated link (``research.comm.link``), or ``real``.
      fc_exchange: stages made only of dense layers exchange their layers'
        inputs and output errors (allgathers of ``(in + out) x batch`` floats
        per rank) instead of reduce-scattering their ``in x out`` gradients;
        each rank then computes their whole gradient and update.
    """

    no_call_form: ClassVar[str | None] = NO_CALL_FORM

    link: str = "real"
    fc_exchange: bool = False

    def create(self, world: Any) -> Overlap:
        return Overlap(world, self)


class Overlap(Staged):
    """Reduce-scatter, sharded update and allgather overlapped (SC18)."""

    # -- the collectives ------------------------------------------------------------
    def shard_size(self, n: int) -> int:
        """Elements of one rank's slice of an ``n``-element stage (padded)."""
        return -(-int(n) // self.size)

    def reduce_scatter(self, flat: np.ndarray, label: str, out: Any = None) -> Any:
        """Start the sum over ranks of ``flat`` (``size * k`` elements, padded);
        the result is this rank's slice (``out``, reused by the caller, ``k``)."""
        return self.engine.reduce_scatter(flat, out=out, name=f"reduce-scatter {label}")

    def allgather(self, shard: np.ndarray, label: str, out: Any = None) -> Any:
        """Start gathering every rank's slice; the result is ``(size, n)``
        (``out``, if given, of ``size * n`` elements)."""
        return self.engine.allgather(shard, out=out, name=f"allgather {label}")

    # -- the step --------------------------------------------------------------------
    def _exchanged(self, stages: Sequence[Stage]) -> list[int]:
        if not self.options.fc_exchange:
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

    def start(self, state: TrainState, ctx: StepContext) -> None:
        super().start(state, ctx)
        import jax
        import optax

        from research.steps.activation_exchange import ActivationExchange
        from research.steps.flat import ALIGN, FlatStage, aligned_empty

        P, r = self.size, self.rank
        self.flats = []
        for s in self.stages:
            n = FlatStage(s, state.params).n
            # Shards of a multiple of ALIGN items keep every rank's slice of
            # the gathered vector at an address JAX can alias.
            k = -(-self.shard_size(n) // ALIGN) * ALIGN
            self.flats.append(FlatStage(s, state.params, P * k, divisor=P))
        self._k = [f.padded // P for f in self.flats]
        self._lo = [r * k for k in self._k]
        _, tx = self.ctx.optimizer(1)
        tapped = [self.stages[i] for i in sorted(self.staged.exchange)]
        self.fcx = ActivationExchange(self.allgather, self.size, tapped, tx)
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
        import jax
        import jax.numpy as jnp

        if i in self.fcx:
            return jax.tree_util.tree_map(jnp.array, self.stages[i].params(tree))
        flat = self.flats[i].pack(self.stages[i].params(tree), jnp.float32(1))
        return flat[self._lo[i] : self._lo[i] + self._k[i]]

    def _import(self, state: TrainState) -> None:
        """This rank's slices of parameters and optimizer state, from ``state``."""
        import jax
        import jax.numpy as jnp

        from research.steps.stages import commit
        from research.steps.state import tree_bytes

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
        # ``research.steps.stages.commit``): one compiled update per shape.
        self.shards, self.opt = commit((self.shards, self.opt))
        self.opt_bytes = sum(tree_bytes(o) for o in self.opt)

    def _export_opt(self, step: int) -> Any:
        """The whole optimizer state, gathered from every rank's slices."""
        import jax

        from research.steps.flat import host_view

        per_stage = [self._opt_def.flatten_up_to(o) for o in self.opt]
        handles = {}
        for k, mark in enumerate(self._marks):
            if mark:
                for i, stage in enumerate(self.stages):
                    if i in self.fcx:
                        continue  # whole on every rank
                    buf = np.asarray(per_stage[i][k])
                    label = f"optimizer {stage.name}"
                    handles[k, i] = self.allgather(buf, label)
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
        import jax

        from research.steps.flat import host_view

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
            reduced[i] = self.reduce_scatter(buf, name, out=self._rs[i])

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
            self.pending[i] = self.allgather(buf, stage.name, out=gather[i])
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
        from research.steps.activation_exchange import ravel_concat

        return ravel_concat if i in self.fcx else self.flats[i]

    def _exchange_update(self, i: int, errors: Handle, step: int) -> float:
        """Stage ``i``'s update from the gathered activations; its seconds."""
        import jax

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

    def drain_into(self, state: TrainState, final: bool = False) -> TrainState:
        import jax
        import jax.numpy as jnp

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
