"""``fused``: gradient, mean and update in one jitted program (mpi4jax in jit).

The mean is :class:`research.comm.dense.FusedAllreduce`: leaves of 256 KiB or
more summed whole, smaller ones packed into buckets, over the segmented ring,
MPI's allreduce, the hierarchical one or XLA's collectives, whichever the
first call measured fastest on every rank (``allreduce=auto``). In a user's
own loop ``grads, info = avg(grads)`` works inside ``jit`` (part of the
compiled program) and outside (a cached jitted mean)::

    avg = research.averaging("fused", world)
    @jax.jit
    def step(params, opt, batch):
        grads, _ = avg(grad_fn(params, batch))     # traced into the program
        ...

With ``allreduce=xla`` the step is one program of all ranks
(:class:`research.comm.dense.xla.Spmd`), which the Trainer builds; JAX's
distributed runtime must run first (:meth:`FusedOptions.xla_runtime`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Literal

from research.comm.dense.sizes import DEFAULT_ALONE_BYTES, DEFAULT_BUCKET_BYTES
from research.comm.faults import watchdog
from research.comm.info import CommInfo
from research.options import Range, option
from research.strategies.base import (
    RecordsItsMean,
    StepOut,
    Strategy,
    StrategyOptions,
    step_phases,
)
from research.strategies.registry import register
from research.trace import get_tracer

Allreduce = Literal["auto", "ring", "mpi", "hierarchical", "xla"]


def dense_xla_runtime(allreduce: str, platform: str) -> str | None:
    """``allreduce=xla`` needs JAX's distributed runtime; ``auto`` on GPUs is
    worth timing it (unless the saver forbids: Orbax's)."""
    if allreduce == "xla":
        return "needed"
    return "worth timing" if allreduce == "auto" and platform == "gpu" else None


@dataclasses.dataclass(frozen=True)
class DenseOptions(StrategyOptions):
    """What ``fused`` and ``host`` share: their dense mean's options.

    Attributes:
      bucket_bytes: largest bucket of packed small leaves (keep it below 32
        MiB: ``research/comm/dense/mean.py``).
      alone_bytes: leaves at least this large are summed whole (None: pack
        every leaf).
      allreduce: ``auto`` (time the paths, keep the fastest on every rank),
        ``ring``, ``mpi``, ``hierarchical`` or ``xla``.
    """

    bucket_bytes: int = option(DEFAULT_BUCKET_BYTES, Range(ge=1, le=2**40))
    alone_bytes: int | None = option(DEFAULT_ALONE_BYTES, Range(ge=0, le=2**62))
    allreduce: Allreduce = "auto"

    def xla_runtime(self, platform: str) -> str | None:
        return dense_xla_runtime(self.allreduce, platform)


@register("fused")
@dataclasses.dataclass(frozen=True)
class FusedOptions(DenseOptions):
    """Options of ``fused`` (:class:`research.comm.dense.FusedAllreduce`'s).

    Attributes:
      sequential: prepare bucket i+1 only once bucket i's allreduce is done.
      prescale: the mean folded into the sum (False: a pass after it).
      in_place: sum each buffer in place (the ring's result aliases it).
      segment_bytes: the ring's piece size (None: the ring's default).
    """

    sequential: bool = True
    prescale: bool = True
    in_place: bool = False
    segment_bytes: int | None = option(None, Range(ge=1, le=2**30))

    def create(self, world: Any) -> Fused:
        return Fused(world, self)


class Fused(RecordsItsMean, Strategy):
    """The mean inside the jitted step (module docstring)."""

    def __init__(self, world: Any, options: FusedOptions) -> None:
        super().__init__(world, options)
        import jax

        from research.comm.dense import FusedAllreduce

        self.mean = FusedAllreduce(self.world, **dataclasses.asdict(options))
        self._jitted = jax.jit(self.mean.average_in_jit)
        self._step: Any = None
        self._spmd = False

    # -- a user's own loop ------------------------------------------------------------
    def __call__(self, grads: Any) -> tuple[Any, CommInfo]:
        import jax

        leaves = jax.tree.leaves(grads)
        nbytes = sum(int(x.size) * x.dtype.itemsize for x in leaves)
        info = CommInfo(bytes=nbytes, contributors=self.size, staleness=0)
        if any(isinstance(x, jax.core.Tracer) for x in leaves):
            return self.mean.average_in_jit(grads), info
        with watchdog.watch(f"{self.name} mean", detail=self.mean.path()):
            return jax.block_until_ready(self._jitted(grads)), info

    def average_in_jit(self, grads: Any) -> Any:
        """The mean of ``grads`` over all ranks, inside ``jit``."""
        return self.mean.average_in_jit(grads)

    # -- the Trainer ------------------------------------------------------------------
    def _build(self, state: Any) -> None:
        """The step program, once the allreduce path is known: an ``auto``
        that may pick XLA's collectives decides first (collective), since
        that path makes the step one program of all ranks."""
        from research.steps import jitted as steps

        self.mean.settle(state.params)
        self._spmd = self.mean.spmd()
        if self._spmd:
            from research.comm.dense.xla import Spmd

            self._step = Spmd(steps.fused_step(self.mean.average_in_jit), donate=True)
        else:
            self._step = steps.make_fused_step(self.mean.average_in_jit)

    def step(self, state, x, y, *, step, hold) -> StepOut:
        import jax

        if self._step is None:
            self._build(state)
        hold()  # one program: the delay can only go first
        t0 = time.perf_counter()
        # The allreduce runs inside the program: the whole step is watched,
        # named after it (the ring's byte counter shows progress inside).
        with (
            get_tracer().span("fwd+bwd+allreduce+update", "compute", step=step),
            watchdog.watch(f"{self.name} step", detail=self.mean.path()),
        ):
            state, m = self._step(state, x, y)
            m = jax.device_get(m)
        return state, m, None, step_phases(time.perf_counter() - t0)

    def drain_into(self, state: Any, final: bool = False) -> Any:
        # Between steps the xla path keeps the state global: this rank's again.
        return self._step.local(state) if self._spmd else state
