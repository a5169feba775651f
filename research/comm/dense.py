"""Synchronous dense averaging: every rank gets the exact mean of all gradients.

Two strategies, same values:

* :class:`FusedAllreduce` (``"fused"``): inside the jitted step, the gradient
  tree is packed into buckets (:mod:`research.comm.fusion`), each bucket is
  summed with mpi4jax's allreduce and divided by the world size.
* :class:`HostAllreduce` (``"host"``): on the host, the tree is copied into
  reusable numpy buckets, each is summed in place with mpi4py
  (``Allreduce(IN_PLACE)``), and the mean is copied out.

Why buckets of 8 MiB and not one big buffer (the measured cause of mpi4jax being
~1.9x slower than mpi4py on the same 100 MB; numbers in ``scripts/bench_allreduce``
and the project README): an XLA custom call writes a *fresh output buffer* on
every call. XLA's CPU client takes it from malloc, and glibc serves every
allocation above 32 MiB (the cap of its dynamic mmap threshold) by a new
``mmap`` that ``free`` unmaps again. Without transparent huge pages (the usual
``madvise`` mode; XLA does not madvise, numpy does), the 100 MB result is
first-touched in 25,000 4-KiB page faults per call, which cost as much as the
allreduce itself. mpi4jax also reduces out of place (it never passes
``MPI_IN_PLACE``), so MPICH first copies the input into that fresh output, and
MPICH's own temporary buffer for large messages is a >32 MiB malloc too.
Buckets below 32 MiB are recycled by malloc from the second step on: no page
faults, no mmap/munmap system calls, and MPICH's temporaries shrink with them.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from mpi4py import MPI

from research.comm.base import Averager, CommInfo
from research.comm.fusion import DEFAULT_BUCKET_BYTES, FusionPlan, HostBuffers
from research.comm.registry import register_averager
from research.trace import get_tracer

#: Leaves at least this large skip fusion in the jitted path: a whole leaf is
#: handed to MPI as it is (no concatenate, no temporary), and a 1 MiB message is
#: already far past the size where per-message latency matters.
DEFAULT_ALONE_BYTES = 2**20


def _plan_key(tree: Any) -> tuple:
    leaves, treedef = jax.tree.flatten(tree)
    return (
        treedef,
        tuple(tuple(x.shape) for x in leaves),
        tuple(np.dtype(x.dtype).str for x in leaves),
    )


class _PlanCache:
    """Plans by tree structure, so one averager serves trees of several shapes."""

    def __init__(self, bucket_bytes: int, alone_bytes: int | None) -> None:
        self.bucket_bytes = bucket_bytes
        self.alone_bytes = alone_bytes
        self._plans: dict[tuple, Any] = {}

    def get(self, tree: Any, make: Any = None) -> Any:
        key = _plan_key(tree)
        if key not in self._plans:
            plan = FusionPlan.for_tree(tree, self.bucket_bytes, self.alone_bytes)
            self._plans[key] = make(plan) if make else plan
        return self._plans[key]


@register_averager("fused")
class FusedAllreduce(Averager):
    """Mean over ranks inside ``jit``: bucketed mpi4jax allreduce.

    Args:
      world: the world to average over.
      bucket_bytes: largest bucket; keep it below 32 MiB (see module docstring).
      sequential: start preparing bucket i+1 only when bucket i's allreduce is
        done (see :func:`_after`; False only to measure the difference).
      prescale: divide floats by the world size before the sum, not after
        (see :meth:`average_in_jit`; False only to measure the difference).
    """

    style = "fused"
    name = "fused"

    def __init__(
        self,
        world: Any,
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        alone_bytes: int | None = DEFAULT_ALONE_BYTES,
        sequential: bool = True,
        prescale: bool = True,
    ) -> None:
        self.world = world
        self.sequential = sequential
        self.prescale = prescale
        self.size = world.size
        self._plans = _PlanCache(bucket_bytes, alone_bytes)
        # Size 1 never touches MPI, not even to Dup a communicator.
        self.comm = world.dup("dense-fused") if world.size > 1 else None

    def plan(self, grads: Any) -> FusionPlan:
        """The bucket plan used for trees shaped like ``grads``."""
        return self._plans.get(grads)

    def bytes_per_call(self, grads: Any) -> int:
        """Bytes this rank hands to MPI per averaging of ``grads`` (0 when alone)."""
        return 0 if self.size == 1 else self.plan(grads).nbytes

    def average_in_jit(self, grads: Any) -> Any:
        """The mean of ``grads`` over all ranks (call inside ``jit``)."""
        if self.size == 1:
            return grads
        import mpi4jax  # deferred: loads its XLA bridge only when used

        plan = self.plan(grads)
        allreduce = functools.partial(mpi4jax.allreduce, op=MPI.SUM, comm=self.comm)
        return _Chain(plan, self.size, self.prescale, self.sequential).run(
            plan.flatten(grads), allreduce
        )


class _Chain:
    """The traced program of :meth:`FusedAllreduce.average_in_jit`.

    Stage i finishes bucket i-1 (slices its result into leaf pieces, casts,
    completes the leaves that end in it) and prepares bucket i (packs it, divides
    floats by the size), then bucket i is summed. With ``sequential``, stage i
    runs inside a ``cond`` whose predicate reads bucket i-1's result, so the
    whole program is one chain of stages and allreduces:

    * XLA:CPU runs a program whose thunks form a chain on the calling thread,
      one after another ("is_sequential" in its thunk executor). Any op left
      dangling (a divide after an allreduce, an unpack slice) makes it a DAG,
      which it runs on its worker pool, concurrently with the next allreduce.
      On a rank with one core that compute steals the core MPI progress needs:
      for ResNet-50 at 2 ranks the DAG costs 110 ms of CPU per call spread over
      five threads, the chain ~70 ms on one.
    * XLA otherwise packs every bucket before the first allreduce, all live at
      once in its temp arena (70 MB for ResNet-50 in 8 MiB buckets), which glibc
      maps afresh and the kernel page-faults in on every call.

    Floats are divided before the sum (exact for power-of-two sizes, a last-bit
    difference otherwise), so a solo float bucket's allreduce result is the leaf
    itself: nothing runs after it, it leaves no work to chain.
    """

    def __init__(
        self, plan: FusionPlan, size: int, prescale: bool, sequential: bool
    ) -> None:
        self.plan, self.size, self.sequential = plan, size, sequential
        self.pre = [
            prescale and not jnp.issubdtype(b.dtype, jnp.integer) for b in plan.buckets
        ]
        self.ends_in: dict[int, list[int]] = {}  # bucket -> leaves whose last piece
        for leaf, segs in enumerate(plan.leaf_segments):
            if segs:
                self.ends_in.setdefault(segs[-1].bucket, []).append(leaf)

    def direct(self, i: int) -> bool:
        """Bucket i's allreduce result is its leaf as it is: no finishing work."""
        return self.plan.zero_copy(i) and self.pre[i]

    def run(self, flat: list[jax.Array], allreduce: Any) -> Any:
        plan, n = self.plan, len(self.plan.buckets)
        leaves: list[Any] = [
            jnp.zeros(shape, dtype) if not segs else None
            for shape, dtype, segs in zip(
                plan.shapes, plan.dtypes, plan.leaf_segments, strict=True
            )
        ]
        pending: dict[tuple[int, int], jax.Array] = {}  # pieces of unfinished leaves
        total = None
        for i in range(n + 1):
            finish = i > 0 and not self.direct(i - 1)
            if i > 0 and not finish:
                seg = plan.buckets[i - 1].segments[0]
                leaves[seg.leaf] = total.reshape(plan.shapes[seg.leaf])
            if not finish and i == n:
                break
            inputs = (
                {s.leaf: flat[s.leaf] for s in plan.buckets[i].segments}
                if i < n
                else {}
            )
            owed = {}
            if finish:
                for leaf in self.ends_in.get(i - 1, []):
                    for s in plan.leaf_segments[leaf]:
                        if s.bucket != i - 1:
                            owed[(s.leaf, s.leaf_start)] = pending.pop(
                                (s.leaf, s.leaf_start)
                            )
            stage = functools.partial(self._stage, i, finish)
            args = (total if finish else None, owed, inputs)
            if total is None or not self.sequential:
                packed, done, new = stage(*args)
            else:
                packed, done, new = _after(total, stage, *args)
            for leaf, value in done.items():
                leaves[leaf] = value
            pending.update(new)
            if i < n:
                total = allreduce(packed)
        assert not pending, "every piece belongs to a finished leaf"
        return plan.treedef.unflatten(leaves)

    def _stage(self, i: int, finish: bool, total: Any, owed: dict, inputs: dict):
        plan, done, new = self.plan, {}, {}
        if finish:
            b = i - 1
            if self.pre[b]:
                mean = total
            elif jnp.issubdtype(total.dtype, jnp.integer):
                mean = total // self.size
            else:
                mean = total / jnp.asarray(self.size, total.dtype)
            pieces = dict(owed)
            for s, part in zip(
                plan.buckets[b].segments, plan.split_bucket(b, mean), strict=True
            ):
                pieces[(s.leaf, s.leaf_start)] = part
            ending = set(self.ends_in.get(b, []))
            for key, part in pieces.items():
                if key[0] not in ending:
                    new[key] = part
            for leaf in ending:
                parts = [
                    pieces[(s.leaf, s.leaf_start)] for s in plan.leaf_segments[leaf]
                ]
                joined = parts[0] if len(parts) == 1 else jnp.concatenate(parts)
                done[leaf] = joined.reshape(plan.shapes[leaf])
        packed = None
        if i < len(plan.buckets):
            packed = plan.pack_bucket(i, inputs)
            if self.pre[i]:
                packed = packed / jnp.asarray(self.size, packed.dtype)
        return packed, done, new


def _after(previous: jax.Array, fn: Any, *args: Any) -> Any:
    """``fn(*args)``, computed only once ``previous`` exists.

    ``optimization_barrier`` cannot order work on CPU: XLA:CPU deletes barriers
    before it schedules. A ``cond`` whose predicate reads ``previous`` is a real
    data dependency; both branches are ``fn``, so the value never depends on the
    predicate (NaN included).
    """
    ready = previous[0] == previous[0]
    return jax.lax.cond(ready, fn, fn, *args)


@register_averager("host")
class HostAllreduce(Averager):
    """Mean over ranks on the host: numpy buckets and in-place mpi4py Allreduce.

    ``reduce`` runs on the calling thread; it blocks until every rank has called
    it (a synchronous collective). Results are fresh numpy arrays (or jax arrays
    with ``as_jax=True``), so they stay valid while the next step reuses the
    buckets.

    Args:
      world: the world to average over.
      bucket_bytes: largest bucket (see module docstring).
      as_jax: return jax arrays instead of numpy arrays.
    """

    style = "staged"
    name = "host"

    def __init__(
        self,
        world: Any,
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        as_jax: bool = False,
    ) -> None:
        self.world = world
        self.size = world.size
        self.as_jax = as_jax
        self._buffers = _PlanCache(bucket_bytes, None)
        self.comm = world.dup("dense-host") if world.size > 1 else None
        self._round = 0

    def plan(self, grads: Any) -> FusionPlan:
        """The bucket plan used for trees shaped like ``grads``."""
        return self._buffers.get(grads, HostBuffers).plan

    def reduce(self, grads: Any) -> tuple[Any, CommInfo]:
        """The mean of ``grads`` over all ranks and a record of the call."""
        self._round += 1
        if self.size == 1:
            return grads, CommInfo(contributors=1, round=self._round)
        # Wait for the gradient computation first, so that wait_s and the span
        # measure communication, not the tail of an asynchronously running step.
        jax.block_until_ready(grads)
        host: HostBuffers = self._buffers.get(grads, HostBuffers)
        nbytes = host.plan.nbytes
        with get_tracer().span(
            "allreduce-host",
            track="comm",
            bytes=nbytes,
            buckets=len(host.buffers),
            round=self._round,
        ) as span:
            t0 = time.perf_counter()
            buffers = host.pack(grads)
            t1 = time.perf_counter()
            for buf in buffers:
                self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            t2 = time.perf_counter()
            out = host.unpack(scale=self.size)
            if self.as_jax:
                out = jax.tree.map(jnp.asarray, out)
            t3 = time.perf_counter()
            span.set(pack_s=t1 - t0, mpi_s=t2 - t1, unpack_s=t3 - t2)
        info = CommInfo(
            bytes=nbytes,
            contributors=self.size,
            staleness=0,
            wait_s=t3 - t0,
            round=self._round,
            extra={"pack_s": t1 - t0, "mpi_s": t2 - t1, "unpack_s": t3 - t2},
        )
        return out, info
