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

from research.comm.info import CommInfo
from research.strategies.base import GradientStrategy, RecordsItsMean
from research.strategies.fused import DenseOptions
from research.strategies.registry import register


@register("host")
@dataclasses.dataclass(frozen=True)
class HostOptions(DenseOptions):
    """Options of ``host`` (:class:`research.comm.dense.HostAllreduce`'s; the
    dense ones as ``fused``'s, with mpi4py's ``Allreduce`` as MPI's own).

    Attributes:
      as_jax: return jax arrays instead of numpy arrays (the Trainer's update
        takes either).
      link: an emulated link (``research.comm.link``), or ``real``.
    """

    as_jax: bool = False
    link: str = "real"

    def create(self, world: Any) -> Host:
        return Host(world, self)


class Host(RecordsItsMean, GradientStrategy):
    """The mean on the host (module docstring)."""

    def __init__(self, world: Any, options: HostOptions) -> None:
        super().__init__(world, options)
        from research.comm.dense import HostAllreduce

        self.mean = HostAllreduce(self.world, **dataclasses.asdict(options))

    def reduce(self, grads: Any) -> tuple[Any, CommInfo]:
        return self.mean.reduce(grads)
