"""The traced program of the ``fused`` strategy's mean: stage, allreduce, stage.

:class:`Chain` turns a :class:`~research.comm.dense.fusion.FusionPlan` and an
allreduce into the program that :meth:`research.comm.dense.FusedAllreduce.
average_in_jit` traces: why it is one sequential chain, and how the mean costs
no pass of its own, is in the class docstring.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from research.comm.dense.fusion import FusionPlan


class Chain:
    """The traced program of :meth:`FusedAllreduce.average_in_jit`.

    Stage i finishes bucket i-1 (slices its result into leaf pieces, casts,
    completes the leaves that end in it) and prepares bucket i (packs it; on
    mpi4jax's path also divides floats by the size), then bucket i is summed.
    With ``sequential``, stage i runs inside a ``cond`` whose predicate reads
    bucket i-1's result, so the program is one chain, stage, allreduce, stage,
    allreduce (XLA:CPU's thunk executor reports ``is_sequential=true`` for it).
    Left to itself, XLA

    * packs every bucket before the first allreduce, all live at once in its
      temp arena (70 MB for ResNet-50 in 8 MiB buckets), which glibc maps
      afresh and the kernel page-faults in on every call;
    * runs the resulting graph on its worker pool, divides concurrently with
      the next allreduce, competing for the core MPI's progress needs.

    The mean needs no pass after the sum (``prescale``): with ``fold`` the ring
    divides as it finishes each chunk (``allreduce(x, divisor)``); on mpi4jax's
    path floats are divided before the sum (exact for power-of-two sizes, a
    last-bit difference otherwise). Either way a solo float bucket's allreduce
    result is the leaf itself and nothing runs after it; a solo leaf's stage is
    then empty, and XLA drops its ``cond`` (harmless: the ring reads its operand
    and writes a fresh result, so there is nothing to order). ResNet-50, 2
    ranks, mpi4jax's path, same run: chained and pre-divided 52.9 ms, unchained
    with the divide after 67.3 ms.
    """

    def __init__(
        self,
        plan: FusionPlan,
        size: int,
        prescale: bool,
        sequential: bool,
        fold: bool = False,
    ) -> None:
        self.plan, self.size, self.sequential = plan, size, sequential
        self.fold = fold
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
                packed, done, new = after(total, stage, *args)
            for leaf, value in done.items():
                leaves[leaf] = value
            pending.update(new)
            if i < n:
                total = allreduce(packed, self.size if self.fold and self.pre[i] else 1)
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
            if self.pre[i] and not self.fold:
                packed = packed / jnp.asarray(self.size, packed.dtype)
        return packed, done, new


def after(previous: jax.Array, fn: Any, *args: Any) -> Any:
    """``fn(*args)``, computed only once ``previous`` exists.

    ``optimization_barrier`` cannot order work on CPU: XLA:CPU deletes barriers
    before it schedules. A ``cond`` whose predicate reads ``previous`` is a real
    data dependency; both branches are ``fn``, so the value never depends on the
    predicate (NaN included).
    """
    ready = previous[0] == previous[0]
    return jax.lax.cond(ready, fn, fn, *args)
