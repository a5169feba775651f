"""``host``: a jitted gradient, its mean on the host, a jitted update.

The mean is :class:`research.comm.dense.HostAllreduce`: numpy buckets below
32 MiB (large leaves read where they lie), summed by the segmented ring, MPI's
``Allreduce``, the hierarchical allreduce or XLA's collectives, whichever the
first call measured fastest on every rank; on an emulated ``link`` each call
also sleeps as long as that link would take. In a user's own loop, outside
``jit``::

    avg = research.averaging("host", world)
    grads, info = avg(grads)        # the same kind of arrays you passed
"""

from __future__ import annotations

import dataclasses
from typing import Any

from research.comm.dense.sizes import DEFAULT_ALONE_BYTES, DEFAULT_BUCKET_BYTES
from research.comm.info import CommInfo
from research.options import Range, option
from research.strategies.base import GradientStrategy, StrategyOptions
from research.strategies.fused import Allreduce, dense_xla_runtime
from research.strategies.registry import register


@register("host")
@dataclasses.dataclass(frozen=True)
class HostOptions(StrategyOptions):
    """Options of ``host`` (:class:`research.comm.dense.HostAllreduce`'s).

    Attributes:
      bucket_bytes: largest bucket.
      as_jax: return jax arrays instead of numpy arrays (the Trainer's update
        takes either).
      link: an emulated link (``research.comm.link``), or ``real``.
      alone_bytes: leaves at least this large are buckets of their own (None:
        pack every leaf).
      allreduce: as ``fused``'s, with mpi4py's ``Allreduce`` as MPI's own.
    """

    bucket_bytes: int = option(DEFAULT_BUCKET_BYTES, Range(ge=1, le=2**40))
    as_jax: bool = False
    link: str = "real"
    alone_bytes: int | None = option(DEFAULT_ALONE_BYTES, Range(ge=0, le=2**62))
    allreduce: Allreduce = "auto"

    def create(self, world: Any) -> Host:
        return Host(world, self)

    def xla_runtime(self, platform: str) -> str | None:
        return dense_xla_runtime(self.allreduce, platform)


class Host(GradientStrategy):
    """The mean on the host (module docstring)."""

    def __init__(self, world: Any, options: HostOptions) -> None:
        super().__init__(world, options)
        from research.comm.dense import HostAllreduce

        self.mean = HostAllreduce(self.world, **dataclasses.asdict(options))

    def reduce(self, grads: Any) -> tuple[Any, CommInfo]:
        return self.mean.reduce(grads)

    @property
    def allreduce_choice(self) -> dict[str, Any] | None:
        return self.mean.allreduce_choice

    def record(self) -> dict[str, Any]:
        return {"allreduce": self.mean.allreduce_choice}

    def adopt(self, record: dict[str, Any]) -> None:
        self.mean.adopt_allreduce(record.get("allreduce"))
