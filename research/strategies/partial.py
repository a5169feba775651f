"""``solo``, ``majority``, ``sync``: eager-SGD's partial allreduce (PPoPP'20).

One strategy in three modes over :class:`research.comm.partial.PartialAllreduce`:
in ``solo`` the first rank to arrive starts the round and every rank takes
part with what it has (late ranks contribute zeros and carry their gradient
into the next round they join); in ``majority`` an initiator drawn alike on
every rank starts it; in ``sync`` every round is synchronous. Every ``full_every``
rounds one is full (bounded staleness). The update is the round's sum over P;
every computed gradient is applied exactly once and every rank applies the same
rounds, so replicas never drift. In a user's own loop, outside ``jit``::

    avg = research.averaging("solo", world, full_every=8)
    grads, info = avg(grads)        # info.staleness, info.contributors
    rest = avg.drain()              # what missed its round, or None

The Trainer runs it as any host-side gradient strategy; the stop agreement
waits up to ``full_every`` steps behind (:attr:`Partial.drift`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from research.comm.info import CommInfo
from research.options import Range, option
from research.strategies.base import GradientStrategy, StrategyOptions
from research.strategies.registry import register


@dataclasses.dataclass(frozen=True)
class PartialOptions(StrategyOptions):
    """Options of the partial collectives.

    Attributes:
      seed: seed of the majority initiator sequence (the same on every rank).
      full_every: every ``full_every``-th round is full, every rank's own
        gradient in it (None: never).
      max_sleep: longest sleep between tests while awaiting activation, seconds.
      link: an emulated link (``research.comm.link``), or ``real``.
    """

    mode: ClassVar[str] = "solo"

    seed: int = option(0, Range(ge=0))
    full_every: int | None = option(32, Range(ge=1))
    max_sleep: float = option(5e-4, Range(gt=0, le=1))
    link: str = "real"

    def create(self, world: Any) -> Partial:
        return Partial(world, self)


@register("solo")
@dataclasses.dataclass(frozen=True)
class SoloOptions(PartialOptions):
    """eager-SGD with solo allreduce: the first rank to arrive starts the round."""

    mode: ClassVar[str] = "solo"
    deterministic: ClassVar[bool] = False


@register("majority")
@dataclasses.dataclass(frozen=True)
class MajorityOptions(PartialOptions):
    """eager-SGD with majority allreduce: a shared-random initiator starts it."""

    mode: ClassVar[str] = "majority"
    deterministic: ClassVar[bool] = False


@register("sync")
@dataclasses.dataclass(frozen=True)
class SyncOptions(PartialOptions):
    """Every round synchronous: a host-side allreduce on the progress thread."""

    mode: ClassVar[str] = "sync"


class Partial(GradientStrategy):
    """A partial collective as a strategy; ``carried`` returns None when no
    rank carried anything (so no zero update that momentum would still turn
    into a step)."""

    def __init__(self, world: Any, options: PartialOptions) -> None:
        super().__init__(world, options)
        from research.comm.partial import PartialAllreduce

        self.mode = options.mode
        self.pa = PartialAllreduce(
            self.world,
            mode=self.mode,
            seed=options.seed,
            full_every=options.full_every,
            max_sleep=options.max_sleep,
            link=options.link,
        )

    def reduce(self, grads: Any) -> tuple[Any, CommInfo]:
        return self.pa.reduce(grads)

    def carried(self) -> tuple[Any, CommInfo] | None:
        if self.pa._layout is None:
            return None
        tree, info = self.pa.drain()
        return (tree, info) if info.extra["carried_total"] else None

    def take_carried(self, flat: bool = False) -> tuple[Any, int] | None:
        """:meth:`PartialAllreduce.take_carried` (None before the first call)."""
        return None if self.pa._layout is None else self.pa.take_carried(flat)

    def rest(self, resting: bool = True) -> None:
        """:meth:`PartialAllreduce.rest`."""
        self.pa.rest(resting)

    @property
    def drift(self) -> int | None:
        if self.mode == "sync":
            return 0
        return self.options.full_every  # None: ranks may run apart without bound

    def close(self) -> None:
        self.pa.close()
