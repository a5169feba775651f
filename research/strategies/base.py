"""What a strategy is: one object, called by the Trainer and by a user's own loop.

A strategy is made from its options (``research.strategies.registry``:
``create("solo", world, full_every=8)``, or ``SoloOptions(...).create(world)``)
and answers both callers::

    # a user's own loop                     # the Trainer (research.train.loop)
    grads, info = avg(grads)                avg.start(state, ctx)
    rest = avg.drain()  # or None           state, m, info, phases = avg.step(
    s = avg.state(); avg.load_state(s)          state, x, y, step=s, hold=hold)
    avg.close()                             state = avg.drain_into(state, final)
                                            avg.take_rows(); avg.summary()
                                            avg.close()

``avg(grads)`` takes this step's gradients and returns those to apply with a
:class:`research.comm.info.CommInfo` (local SGD: the state it averages, see its
module); a strategy whose collectives run inside the step stage by stage
(``ps``, ``layerwise``, ``overlap``) says why it has no such form
(:attr:`StrategyOptions.no_call_form`). ``drain`` is the one word for "nothing in flight
or carried": before an evaluation, a checkpoint snapshot and the end.
``step`` runs one whole training step and ``hold()`` spends the step's injected
delay (``research.imbalance``) where a slower rank would be slow.

What others ask of a strategy is a member of it, never a list of names:
:attr:`Strategy.drift` (how far apart ranks may run: the stop agreement),
:meth:`Strategy.record` / :meth:`Strategy.adopt` (what a resumed run takes
again: the dense strategies' allreduce choice), and of its options, known
before MPI starts, :attr:`StrategyOptions.deterministic` (its result does not
depend on timing) and :meth:`StrategyOptions.xla_runtime` (whether a run needs
JAX's distributed runtime started first).

Every step's ``phases`` have the keys of :data:`PHASES`, so studies read any
strategy alike, and never its name.

The strategies' modules import JAX, Flax and MPI inside what they run, not at
their top: listing and checking their options before launch imports them all
and must start neither (``experiments.train --list``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from research.comm.info import CommInfo
from research.options import Options
from research.trace import get_tracer

if TYPE_CHECKING:
    from research.steps.state import TrainState

StepOut = tuple[Any, dict, "CommInfo | None", dict[str, float | None]]

#: The timing keys of every step's ``phases``, and so of every step's row in
#: ``metrics.jsonl``, whatever the strategy (seconds; None where the strategy
#: cannot separate the phase):
#:
#: * ``compute_s``: forward and backward (the fused program: the whole step, its
#:   allreduce and update are inside it);
#: * ``comm_exposed_s``: the training thread waiting for communication;
#: * ``comm_busy_s``: time with the step's communication under way (equal to
#:   the exposed time for a blocking strategy, more where it runs behind
#:   computation);
#: * ``update_s``: the optimizer update.
#:
#: A strategy may add keys of its own after these (sparse: ``select_s``).
PHASES = ("compute_s", "comm_exposed_s", "comm_busy_s", "update_s")


def step_phases(
    compute_s: float,
    *,
    exposed_s: float | None = None,
    busy_s: float | None = None,
    update_s: float | None = None,
    **more: float,
) -> dict[str, float | None]:
    """A step's ``phases`` in the :data:`PHASES` schema, then ``more``."""
    return {
        "compute_s": compute_s,
        "comm_exposed_s": exposed_s,
        "comm_busy_s": busy_s,
        "update_s": update_s,
        **more,
    }


@dataclass(frozen=True)
class StepContext:
    """What a strategy's steps may need beyond the state (given at ``start``).

    Attributes:
      optimizer: ``optimizer(pushes_per_step, weight_decay=None) -> (schedule,
        tx)``, the run's optimizer for a consumer that applies
        ``pushes_per_step`` updates per synchronous step (1 for the loop
        itself; P for a parameter server); ``weight_decay`` overrides the
        run's (0 for a strategy that decays the local gradient itself and
        swaps the state's optimizer in :meth:`Strategy.start`).
      model: the Flax module, for strategies that run it stage by stage.
      weight_decay: the run's weight decay.
    """

    optimizer: Callable[..., Any]
    model: Any = None
    weight_decay: float = 0.0


def timed_grad(state: TrainState, x: Any, y: Any, step: int):
    """``(grads, batch_stats, metrics, seconds)`` of the jitted gradient."""
    import jax

    from research.steps import jitted as steps

    t0 = time.perf_counter()
    with get_tracer().span("forward+backward", "compute", step=step):
        grads, batch_stats, m = steps.grad_step(state, x, y)
        grads = jax.block_until_ready(grads)
        m = jax.device_get(m)
    return grads, batch_stats, m, time.perf_counter() - t0


@dataclass(frozen=True)
class StrategyOptions(Options):
    """A strategy's options; :meth:`create` makes the strategy."""

    #: Whether two runs of one configuration give the same parameters whatever
    #: the timing (partial collectives and the parameter server do not).
    deterministic: ClassVar[bool] = True
    #: Why the strategy has no ``avg(grads)`` form, with what to use instead
    #: (None: it has one).
    no_call_form: ClassVar[str | None] = None

    def create(self, world: Any) -> Strategy:
        """The strategy with these options over ``world`` (collective)."""
        raise NotImplementedError

    def xla_runtime(self, platform: str) -> str | None:
        """Whether a run needs JAX's distributed runtime, started before JAX
        computes: ``"needed"``, ``"worth timing"`` (where the saver lets it run)
        or None."""
        return None


class Strategy:
    """One gradient-averaging strategy (see the module docstring).

    Args:
      world: a :class:`research.comm.world.World` or an mpi4py
        intracommunicator (collective: every rank makes its strategies in the
        same order).
      options: the strategy's options (their class names the strategy).
    """

    def __init__(self, world: Any, options: StrategyOptions) -> None:
        from research.comm.world import as_world  # MPI starts with the strategy

        self.world = as_world(world)
        self.options = options
        self.size, self.rank = self.world.size, self.world.rank

    @property
    def name(self) -> str:
        """The registered name."""
        return self.options.name

    # -- a user's own loop ----------------------------------------------------------
    def __call__(self, grads: Any) -> tuple[Any, CommInfo]:
        """This step's gradients in, the gradients to apply and a record out."""
        why = self.options.no_call_form
        raise TypeError(f"strategy {self.name!r} has no avg(grads) form: {why}")

    def drain(self) -> tuple[Any, CommInfo] | None:
        """What is still held back, as ``(grads, info)``, or None (nothing: a
        loop then applies no zero gradient that momentum would turn into a
        step). Collective."""
        return None

    def state(self) -> dict[str, Any]:
        """What to checkpoint with the model, per rank ({} when nothing)."""
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        """Take back what :meth:`state` returned."""

    def close(self) -> None:
        """Release threads and communicators (the success path; may be
        collective). Idempotent."""

    def __enter__(self) -> Strategy:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:  # never a collective on an error path
            self.close()

    # -- the Trainer ----------------------------------------------------------------
    def start(self, state: TrainState, ctx: StepContext) -> TrainState | None:
        """Once, before the first step (and any restore), on every rank; may
        return the state with the strategy's own ``strategy`` entries added,
        which a restore then fills from the checkpoint."""
        self.ctx = ctx
        return None

    def step(
        self, state: TrainState, x: Any, y: Any, *, step: int, hold: Callable[[], None]
    ) -> StepOut:
        """One training step: ``(state, metrics, info, phases)``."""
        raise NotImplementedError

    def drain_into(self, state: TrainState, final: bool = False) -> TrainState:
        """The state with whatever is in flight or carried completed and
        applied (collective; ``final``: the end of the run)."""
        return state

    def take_rows(self) -> list[dict[str, Any]]:
        """Rows for ``metrics.jsonl`` besides the steps' (each with its own
        ``kind``, e.g. an adaptive strategy's switches), since the last call;
        rank 0's are written."""
        return []

    def summary(self) -> dict[str, Any]:
        """Entries for ``summary.json`` (local: no collective)."""
        return {}

    # -- what others ask ------------------------------------------------------------
    @property
    def drift(self) -> int | None:
        """Steps a rank may run ahead of another (0: lock step; None: without
        bound). The stop agreement waits that far behind."""
        return 0

    @property
    def allreduce_choice(self) -> dict[str, Any] | None:
        """Which dense allreduce runs and why (``config.json``), or None."""
        return None

    def record(self) -> dict[str, Any]:
        """What a resumed run takes again (:meth:`adopt`) to continue bit for bit
        (JSON, the same on every rank); saved with each checkpoint."""
        return {}

    def adopt(self, record: dict[str, Any]) -> None:
        """Continue as the run that saved :meth:`record` (every rank alike)."""


class RecordsItsMean:
    """A strategy that averages with a dense mean of ``research.comm.dense``
    (its ``mean``): the allreduce it chose is in ``config.json`` and in every
    checkpoint, and a resumed run takes the same again (bit for bit)."""

    mean: Any

    @property
    def allreduce_choice(self) -> dict[str, Any] | None:
        return self.mean.allreduce_choice

    def record(self) -> dict[str, Any]:
        return {"allreduce": self.mean.allreduce_choice}

    def adopt(self, record: dict[str, Any]) -> None:
        self.mean.adopt_allreduce(record.get("allreduce"))


def _host_leaves(name: str, grads: Any) -> list[Any]:
    import jax

    leaves = jax.tree.leaves(grads)
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
        raise TypeError(
            f"strategy {name!r} averages on the host: call avg(grads) on the "
            "gradients your jitted step returned, outside jit (only 'fused' "
            "runs inside jit)"
        )
    return leaves


def like(given: list[Any], out: Any) -> Any:
    """``out`` as jax arrays when the caller passed jax arrays, else as is."""
    import jax
    import jax.numpy as jnp

    if any(isinstance(x, jax.Array) for x in given):
        return jax.tree.map(jnp.asarray, out)
    return out


class GradientStrategy(Strategy):
    """A strategy that averages the gradients on the host.

    Its step: jitted gradient, :meth:`reduce` on the host (which may return
    another round's result, as partial collectives do), jitted update;
    :meth:`drain_into` applies what :meth:`carried` delivers, so evaluation and
    checkpoints never miss a computed gradient. :meth:`fold` adds a tree to the
    next gradient (what another strategy held when the adaptive one switched).
    """

    _pending: Any = None  # a tree the next reduce adds (fold)
    _last: list[Any] = []  # the last call's input leaves, for their kind

    def reduce(self, grads: Any) -> tuple[Any, CommInfo]:
        """The gradients to apply (numpy, or device arrays) and a record."""
        raise NotImplementedError

    def carried(self) -> tuple[Any, CommInfo] | None:
        """What is carried or in flight, delivered (collective), or None."""
        return None

    def fold(self, tree: Any) -> None:
        """Add ``tree`` to the next gradient (to what is already pending)."""
        pending = self._pending
        self._pending = tree if pending is None else add_trees(pending, tree)

    def _reduce(self, grads: Any) -> tuple[Any, CommInfo]:
        if self._pending is not None:
            import jax

            grads = jax.tree.map(_add_into, self._pending, grads)
            self._pending = None
        return self.reduce(grads)

    def __call__(self, grads: Any) -> tuple[Any, CommInfo]:
        if self.options.no_call_form:
            return super().__call__(grads)  # refused, saying why
        self._last = _host_leaves(self.name, grads)[:1]
        out, info = self._reduce(grads)
        return like(self._last, out), info

    def drain(self) -> tuple[Any, CommInfo] | None:
        rest = self.carried()
        return None if rest is None else (like(self._last, rest[0]), rest[1])

    def step(self, state, x, y, *, step, hold) -> StepOut:
        grads, batch_stats, m, compute_s = timed_grad(state, x, y, step)
        # The straggler's extra work follows its forward+backward, so it
        # computes alongside the others (as contended as they are when ranks
        # share cores) and is then held while they wait or move on.
        hold()
        t0 = time.perf_counter()
        with get_tracer().span("average", "comm", step=step, strategy=self.name) as sp:
            out, info = self._reduce(grads)
            sp.set(
                bytes=info.bytes,
                contributors=info.contributors,
                staleness=info.staleness,
            )
        t1 = time.perf_counter()
        with get_tracer().span("update", "update", step=step):
            state = self.apply(state, out, batch_stats)
        phases = step_phases(
            compute_s,
            exposed_s=t1 - t0,  # blocking: all of it is exposed
            busy_s=t1 - t0,
            update_s=time.perf_counter() - t1,
        )
        return state, m, info, phases

    def apply(self, state: TrainState, out: Any, batch_stats: Any) -> TrainState:
        """The state after applying :meth:`reduce`'s result (the gradients)."""
        import jax

        from research.steps import jitted as steps

        state = steps.apply_step(state, out, batch_stats)
        jax.block_until_ready(state.params)
        return state

    def drain_into(self, state: TrainState, final: bool = False) -> TrainState:
        out = self.carried()
        if out is None:
            return state
        tree, info = out
        with get_tracer().span("drain", "comm", contributors=info.contributors):
            done = int(state.step)
            state = self.apply(state, tree, state.batch_stats)
        # The drain round delivers carried gradients: it is not a new step.
        return state.replace(step=done)


def _add_into(carried: Any, grad: Any) -> Any:
    """``carried + grad``, into ``carried`` when it is a writable array of the
    gradient's dtype (no new memory: the sum is the gradient handed on)."""
    import numpy as np

    c, g = np.asarray(carried), np.asarray(grad)
    if c.flags.writeable and c.dtype == g.dtype and c.shape == g.shape:
        return np.add(c, g, out=c)
    return np.add(c, g)


def add_trees(a: Any, b: Any) -> Any:
    """``a + b`` leaf by leaf, as float32 numpy (the same bits jax would give)."""
    import jax
    import numpy as np

    return jax.tree.map(lambda x, y: np.add(np.asarray(x), np.asarray(y)), a, b)
