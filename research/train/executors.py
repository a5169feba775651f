"""How one training step runs: the strategy's executor, the loop's only seam.

The loop (:class:`research.train.loop.Trainer`) asks its executor for each step's
new state, metrics and communication record, and knows nothing of how a strategy
communicates::

    executor = make_executor(averager, ctx)
    executor.start(state)                       # once, before the first step
    state, metrics, info, phases = executor.step(state, x, y, step=s, hold=hold)
    state = executor.drain(state)               # before evaluation, a checkpoint
    state = executor.drain(state, final=True)   #   snapshot, and at the end
    executor.close()                            # success path only (collective)

``hold()`` spends the step's injected delay (``research.imbalance``); each
executor calls it where a slower rank would be slow: after its own computation,
or first when the whole step is one program.

Built in, chosen by the averager's ``executor`` attribute:

* ``fused``: gradient, mpi4jax allreduce and update are one jitted program;
* ``host-side``: jitted gradient, the averager's host-side ``reduce`` (which may
  return another round's result, as partial collectives do), jitted update;
  ``drain`` runs the averager's ``drain`` (a full round delivering what
  it carries), so evaluation and checkpoints never miss a computed gradient;
* ``server``: jitted gradient, push to and pull from a parameter server whose
  optimizer steps P times per synchronous step (lr / P on a P-times-longer
  schedule: the same per-example rate).

Registered by the modules that define them, found by their source
(``research.comm.declared.modules_with``): ``overlap``
(``research.train.overlapped``), ``layerwise`` (``research.train.layerwise``,
with its averager), ``sparse`` (``research.train.sparse``: top-k with error
feedback, host SparCML allreduce, jitted update).

A strategy that runs its step differently (stage by stage, overlapped) registers
its own executor with :func:`register_executor` and names it in its averager.

What an executor calls on its averager beyond :class:`~research.comm.base.Averager`
(``average_in_jit``, ``reduce``, ``drain``, ``close``) is declared as a
``typing.Protocol`` in the executor's ``needs`` (``ParameterServer`` here,
``BucketAllreduce``, ``ShardedCollectives``, ``SparseCollectives`` beside their
executors); :func:`make_executor` checks it, so a strategy that names an executor
without what it calls fails at once with the missing names.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import jax

from research.comm import watchdog
from research.comm.base import Averager, CommInfo
from research.trace import get_tracer
from research.train import step as steps
from research.train.state import TrainState

StepOut = tuple[TrainState, dict, "CommInfo | None", dict[str, float | None]]

#: The timing keys of every executor's ``phases``, and so of every step's row in
#: ``metrics.jsonl``, whatever the strategy (seconds; None where the executor
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
#: An executor may add keys of its own after these (sparse: ``select_s``).
#: Studies and plots read these keys and never the strategy's name.
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
    """What an executor may need beyond its averager.

    Attributes:
      world_size: ranks in the job.
      optimizer: ``optimizer(pushes_per_step, weight_decay=None) -> (schedule,
        tx)``, the run's optimizer for a consumer that applies
        ``pushes_per_step`` updates per synchronous step (1 for the loop
        itself; P for a parameter server); ``weight_decay`` overrides the
        run's (0 for an executor that decays the local gradient itself and
        swaps the state's optimizer in :meth:`Executor.start`).
      model: the Flax module, for executors that run it stage by stage.
      weight_decay: the run's weight decay.
    """

    world_size: int
    optimizer: Callable[..., Any]
    model: Any = None
    weight_decay: float = 0.0


class Executor:
    """Runs the steps of one strategy (see the module docstring)."""

    #: What this executor calls on its averager beyond :class:`Averager`'s own
    #: methods (a ``Protocol``; None: nothing more).
    needs: ClassVar[type | None] = None

    def __init__(self, averager: Averager, ctx: StepContext) -> None:
        self.averager = averager
        self.ctx = ctx

    @property
    def name(self) -> str:
        return self.averager.name

    def start(self, state: TrainState) -> TrainState | None:
        """Once, before the first step (and any restore), on every rank.

        May return the state with the strategy's own fields added (its
        ``strategy`` entries), which a restore then fills from the checkpoint.
        """

    def step(
        self, state: TrainState, x: Any, y: Any, *, step: int, hold: Callable[[], None]
    ) -> StepOut:
        raise NotImplementedError

    def drain(self, state: TrainState, final: bool = False) -> TrainState:
        """Complete whatever is in flight or carried; collective."""
        return state

    def close(self) -> None:
        """Release threads and communicators (success path; may be collective)."""
        self.averager.close()

    def take_rows(self) -> list[dict[str, Any]]:
        """Rows for ``metrics.jsonl`` besides the steps' (each with its own
        ``kind``, e.g. an adaptive strategy's switches), since the last call;
        rank 0's are written."""
        return []

    def summary(self) -> dict[str, Any]:
        """Entries for ``summary.json`` (collective-free; {}: none)."""
        return {}


_EXECUTORS: dict[str, type[Executor]] = {}


def register_executor(name: str):
    """Class decorator: averagers with ``executor = name`` run on this class."""

    def deco(cls: type[Executor]) -> type[Executor]:
        _EXECUTORS[name] = cls
        return cls

    return deco


def missing_members(obj: Any, protocol: type | None) -> list[str]:
    """The attributes and methods ``protocol`` declares that ``obj`` lacks."""
    if protocol is None:
        return []
    names = [
        *getattr(protocol, "__annotations__", {}),
        *(n for n, v in vars(protocol).items() if callable(v)),
    ]
    wanted = [n for n in dict.fromkeys(names) if not n.startswith("_")]
    return [n for n in wanted if not hasattr(obj, n)]


def make_executor(averager: Averager, ctx: StepContext) -> Executor:
    """The executor that runs ``averager``'s steps (checked against its
    ``needs``: a ``TypeError`` names what the averager lacks)."""
    kind = averager.executor
    if kind not in _EXECUTORS:
        # The averager's own module may define it (a strategy in one module);
        # else a module that registers executors, found by its source.
        import importlib

        from research.comm.declared import modules_with

        for module in modules_with("@register_executor("):
            importlib.import_module(module)
    if kind not in _EXECUTORS:
        raise ValueError(
            f"strategy {averager.name!r} asks for executor {kind!r}; known: "
            + ", ".join(sorted(_EXECUTORS))
        )
    cls = _EXECUTORS[kind]
    missing = missing_members(averager, cls.needs)
    if missing:
        raise TypeError(
            f"strategy {averager.name!r} runs on executor {kind!r}, which calls "
            f"{', '.join(missing)} on its averager ({cls.needs.__name__}); "
            f"{type(averager).__name__} has no such "
            + ("member" if len(missing) == 1 else "members")
        )
    return cls(averager, ctx)


def _timed_grad(state: TrainState, x: Any, y: Any, step: int):
    t0 = time.perf_counter()
    with get_tracer().span("forward+backward", "compute", step=step):
        grads, batch_stats, m = steps.grad_step(state, x, y)
        grads = jax.block_until_ready(grads)
        m = jax.device_get(m)
    return grads, batch_stats, m, time.perf_counter() - t0


@register_executor("fused")
class FusedExecutor(Executor):
    """Gradient, averaging and update in one jitted program."""

    def __init__(self, averager: Averager, ctx: StepContext) -> None:
        super().__init__(averager, ctx)
        self._step: Any = None
        self._spmd = False

    def _build(self, state: TrainState) -> None:
        """The step program, once the allreduce path is known: an ``auto``
        that may pick XLA's collectives decides first (collective), since
        that path makes the step one program of all ranks."""
        settle = getattr(self.averager, "settle", None)
        if settle is not None:
            settle(state.params)
        self._spmd = getattr(self.averager, "spmd", lambda: False)()
        self._step = steps.make_fused_step(self.averager.average_in_jit, self._spmd)

    def drain(self, state: TrainState, final: bool = False) -> TrainState:
        # Between steps the xla path keeps the state global: this rank's again.
        return self._step.local(state) if self._spmd else state

    def step(self, state, x, y, *, step, hold) -> StepOut:
        if self._step is None:
            self._build(state)
        hold()  # one program: the delay can only go first
        t0 = time.perf_counter()
        # The allreduce runs inside the program: the whole step is watched,
        # named after it (the ring's byte counter shows progress inside).
        path = getattr(self.averager, "path", lambda: "allreduce in jit")()
        with (
            get_tracer().span("fwd+bwd+allreduce+update", "compute", step=step),
            watchdog.watch(f"{self.name} step", detail=path),
        ):
            state, m = self._step(state, x, y)
            m = jax.device_get(m)
        return state, m, None, step_phases(time.perf_counter() - t0)


@register_executor("host-side")
class HostSideExecutor(Executor):
    """Jitted gradient, host-side averaging, jitted update."""

    def step(self, state, x, y, *, step, hold) -> StepOut:
        grads, batch_stats, m, compute_s = _timed_grad(state, x, y, step)
        # The straggler's extra work follows its forward+backward, so it
        # computes alongside the others (as contended as they are when ranks
        # share cores) and is then held while they wait or move on.
        hold()
        t0 = time.perf_counter()
        with get_tracer().span(
            "average", "comm", step=step, strategy=self.averager.name
        ) as sp:
            out, info = self.averager.reduce(grads)
            sp.set(
                bytes=info.bytes,
                contributors=info.contributors,
                staleness=info.staleness,
            )
        t1 = time.perf_counter()
        with get_tracer().span("update", "update", step=step):
            state = self._apply(state, out, batch_stats)
        phases = step_phases(
            compute_s,
            exposed_s=t1 - t0,  # blocking: all of it is exposed
            busy_s=t1 - t0,
            update_s=time.perf_counter() - t1,
        )
        return state, m, info, phases

    def _apply(self, state: TrainState, grads: Any, batch_stats: Any) -> TrainState:
        state = steps.apply_step(state, grads, batch_stats)
        jax.block_until_ready(state.params)
        return state

    def drain(self, state: TrainState, final: bool = False) -> TrainState:
        out = self.averager.drain()
        if out is None:
            return state
        tree, info = out
        with get_tracer().span("drain", "comm", contributors=info.contributors):
            done = int(state.step)
            state = self._apply(state, tree, state.batch_stats)
        # The drain round delivers carried gradients: it is not a new step.
        return state.replace(step=done)


class ParameterServer(Protocol):
    """What the ``server`` executor calls beyond :class:`Averager`."""

    def bind(self, params: Any, tx: Any) -> None:
        """Give the server the initial parameters and the optimizer it steps."""


@register_executor("server")
class ServerExecutor(HostSideExecutor):
    """Push gradients to a parameter server, pull its parameters (``ps``)."""

    needs = ParameterServer

    def start(self, state: TrainState) -> None:
        # P pushes make one synchronous step's worth of gradient.
        _, tx = self.ctx.optimizer(self.ctx.world_size)
        self.averager.bind(state.params, tx)

    def _apply(self, state: TrainState, params: Any, batch_stats: Any) -> TrainState:
        state = steps.set_params_step(state, params, batch_stats)
        jax.block_until_ready(state.params)
        return state

    def drain(self, state: TrainState, final: bool = False) -> TrainState:
        # Push-pull is synchronous for the worker: nothing is in flight between
        # steps. Only the end retires the server (every rank's final pull).
        return super().drain(state, final) if final else state
