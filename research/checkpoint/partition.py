"""Size-balanced partition of a state's leaves over the ranks (DeepFreeze's shards).

Leaves (layers' tensors) are the unit: each belongs whole to one rank, which
snapshots and writes it. Greedy longest-processing-time assignment (largest leaf
first, onto the least-loaded rank) is within 4/3 of the optimal largest shard
and, being deterministic, gives every rank the same answer without messages.
A single leaf larger than total/size bounds the balance (VGG-16's first fully
connected layer at 4 ranks); :func:`imbalance` reports it.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def partition_by_bytes(nbytes: Sequence[int], parts: int) -> list[int]:
    """Owner (0..parts-1) of each leaf, balancing the bytes per owner.

    Args:
      nbytes: size of each leaf in bytes, in flatten order.
      parts: number of shards (ranks).

    Returns:
      One owner per leaf. Ties go to the lower rank, so the result depends only
      on ``nbytes`` and ``parts``.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    owners = [0] * len(nbytes)
    heap = [(0, r) for r in range(parts)]
    # Largest first; among equal sizes, flatten order keeps it deterministic.
    for i in sorted(range(len(nbytes)), key=lambda i: (-int(nbytes[i]), i)):
        load, r = heapq.heappop(heap)
        owners[i] = r
        heapq.heappush(heap, (load + int(nbytes[i]), r))
    return owners


def shard_bytes(nbytes: Sequence[int], owners: Sequence[int], parts: int) -> list[int]:
    """Bytes owned by each of ``parts`` shards."""
    loads = [0] * parts
    for b, o in zip(nbytes, owners):
        loads[o] += int(b)
    return loads


def imbalance(nbytes: Sequence[int], owners: Sequence[int], parts: int) -> float:
    """Largest shard over the mean shard (1.0 is perfect balance)."""
    loads = shard_bytes(nbytes, owners, parts)
    mean = sum(loads) / parts
    return max(loads) / mean if mean else 1.0
