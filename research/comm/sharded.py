"""Averaging overlapped with backward and forward: ``overlap``, and the base of
the strategies whose collectives are handles on the progress thread.

:class:`HandledAverager` is the communication side of the stage-by-stage
strategies, on numpy buffers and the rank's progress thread
(:mod:`research.comm.asynchronous.handles`); ``layerwise`` (the DDP baseline) is one
module of its own, averager and executor together (``research/train/layerwise.py``).

* ``overlap`` (:class:`ShardedOverlap`): the SC18 multistep scheme (Lee et al.,
  MLHPC@SC18; the authors' ``ffbp_multistep.c``). Each stage's parameters are
  one float32 vector padded to a multiple of P; its gradient's reduce-scatter
  starts as soon as the stage's backward is done; after the backward pass each
  rank updates only its 1/P slice with its 1/P slice of the optimizer state,
  and starts that stage's allgather at once; the next forward pass waits for
  stage i's allgather just before stage i runs, so the allgathers overlap it.
  Optimizer memory per rank is 1/P of the replicated strategies' (ZeRO-1's
  saving, with its traffic: reduce-scatter + allgather = one allreduce).

Its executor is in ``research.train.sharded``. It is exact synchronous SGD,
as ``layerwise`` is: every rank applies the mean of all ranks' gradients of the
step, as ``host`` does (``tests/mpi/test_overlap.py``).

Collectives start in the same order on every rank: stages come out of the
backward pass in one fixed order, and buckets are fixed by the parameter shapes.
Every collective carries a name on the timeline (``reduce-scatter <stage>``,
``allgather <stage>``, ``allreduce <bucket>``, track ``comm-bg``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from research.comm.asynchronous.handles import AsyncComm, Handle
from research.comm.base import Averager
from research.comm.registry import register_averager
from research.comm.world import as_world


class HandledAverager(Averager):
    """An averager whose collectives are handles on the progress thread."""

    def __init__(self, world: Any, *, link: str = "real", name: str) -> None:
        self.world = world = as_world(world)
        self.size = world.size
        self.rank = world.rank
        self.engine = AsyncComm(world, link=link, name=name)
        self.link = self.engine.link

    def drain(self) -> None:
        """Wait for every collective still in flight (collective-free)."""
        self.engine.drain()

    def close(self) -> None:
        # The executor drains on the success path; close is then local.
        self.engine.close()


@register_averager("overlap")
class ShardedOverlap(HandledAverager):
    """Per-stage reduce-scatter, sharded update, per-stage allgather (SC18).

    Args:
      world: the world to average over.
      link: an emulated link (``research.comm.link``) or ``"real"``.
      fc_exchange: stages made only of dense layers exchange their layers'
        inputs and output errors (allgathers of ``(in + out) x batch`` floats
        per rank) instead of reduce-scattering their ``in x out`` gradients;
        each rank then computes their whole gradient and update
        (``research.train.activation_exchange``).
    """

    executor = "overlap"
    name = "overlap"
    no_call_form = (
        "it reduce-scatters stage by stage and its allgathers are waited for by "
        "the next forward, inside the Trainer's executor. Use experiments.train "
        "--strategy overlap, or research.comm.asynchronous.handles.AsyncComm"
    )

    def __init__(
        self, world: Any, *, link: str = "real", fc_exchange: bool = False
    ) -> None:
        super().__init__(world, link=link, name="overlap")
        self.fc_exchange = bool(fc_exchange)

    def shard_size(self, n: int) -> int:
        """Elements of one rank's slice of an ``n``-element stage (padded)."""
        return -(-int(n) // self.size)

    def reduce_scatter(
        self, flat: np.ndarray, label: str, out: np.ndarray | None = None
    ) -> Handle:
        """Start the sum over ranks of ``flat``; the result is this rank's slice.

        ``flat`` must have ``size * k`` elements (padded), ``out`` (optional,
        reused by the caller) ``k``.
        """
        name = f"reduce-scatter {label}"
        return self.engine.reduce_scatter(flat, out=out, name=name)

    def allgather(
        self, shard: np.ndarray, label: str, out: np.ndarray | None = None
    ) -> Handle:
        """Start gathering every rank's slice; the result is ``(size, n)``
        (``out``, if given, of ``size * n`` elements)."""
        return self.engine.allgather(shard, out=out, name=f"allgather {label}")
