"""Size-balanced partition of a state over the ranks (DeepFreeze's shards).

The unit of work is a leaf (one layer's tensor), or a block of rows of a leaf
too large to balance whole: a leaf larger than a quarter of the mean shard is
cut along its first axis into blocks no larger than that (VGG-16's first fully
connected layer is 74% of the model; the CANDLE P1B2 input layer 86%). Units
are assigned by greedy longest-processing-time (largest first, onto the
least-loaded rank), so no shard exceeds the mean by more than the largest unit,
a quarter of the mean. Being deterministic, the plan is the same on every rank
without a message.

Rank-local leaves (``LOCAL``: BatchNorm statistics, which differ between
data-parallel ranks) are never cut: every rank stores its own copy.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Sequence
from typing import Any

#: Owner of a rank-local leaf: every rank stores (and gets back) its own copy.
LOCAL = -1

#: A leaf larger than mean shard / SPLIT is cut into row blocks.
SPLIT = 4


@dataclasses.dataclass(frozen=True)
class Unit:
    """One piece of the state that one rank writes.

    Attributes:
      name: key in the shard's Orbax tree: the leaf name, plus ``/rows_A_B``
        for a block of rows ``A:B`` of a cut leaf.
      leaf: the leaf's name.
      rows: ``(A, B)`` for a block of rows, None for a whole leaf.
      shape, dtype: of the unit (the block, for a cut leaf).
      owner: the rank that writes it, or ``LOCAL``.
    """

    name: str
    leaf: str
    rows: tuple[int, int] | None
    shape: tuple[int, ...]
    dtype: str
    owner: int

    @property
    def nbytes(self) -> int:
        import numpy as np

        return int(math.prod(self.shape)) * np.dtype(self.dtype).itemsize

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["shape"], d["rows"] = list(self.shape), list(self.rows) if self.rows else None
        d["shard"] = d.pop("owner")
        return d


def partition_by_bytes(nbytes: Sequence[int], parts: int) -> list[int]:
    """Owner (0..parts-1) of each item, balancing the bytes per owner.

    Args:
      nbytes: size of each item in bytes.
      parts: number of shards (ranks).

    Returns:
      One owner per item. Ties go to the lower rank, so the result depends only
      on ``nbytes`` and ``parts``.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    owners = [0] * len(nbytes)
    heap = [(0, r) for r in range(parts)]
    # Largest first; among equal sizes, input order keeps it deterministic.
    for i in sorted(range(len(nbytes)), key=lambda i: (-int(nbytes[i]), i)):
        load, r = heapq.heappop(heap)
        owners[i] = r
        heapq.heappush(heap, (load + int(nbytes[i]), r))
    return owners


def _is_local(name: str, rank_local: Sequence[str]) -> bool:
    return any(name == p or name.startswith(p.rstrip("/") + "/") for p in rank_local)


def plan(
    specs: Sequence[Any], parts: int, rank_local: Sequence[str] = (), split: bool = True
) -> list[Unit]:
    """The units of a state and their owners.

    Args:
      specs: ``leaves.LeafSpec`` of every leaf, in flatten order.
      parts: number of shards (ranks).
      rank_local: name prefixes of leaves every rank keeps its own copy of.
      split: cut leaves larger than mean shard / ``SPLIT`` into row blocks.
    """
    units: list[Unit] = []
    repl = [s for s in specs if not _is_local(s.name, rank_local)]
    cap = max(1, sum(s.nbytes for s in repl) // (parts * SPLIT))
    for s in specs:
        if _is_local(s.name, rank_local):
            units.append(Unit(s.name, s.name, None, s.shape, s.dtype, LOCAL))
            continue
        cuttable = s.shape and getattr(s, "kind", "array") == "array"
        pieces = min(s.shape[0], math.ceil(s.nbytes / cap)) if cuttable else 1
        if not split or parts == 1 or pieces < 2:
            units.append(Unit(s.name, s.name, None, s.shape, s.dtype, 0))
            continue
        bounds = [s.shape[0] * j // pieces for j in range(pieces + 1)]
        for a, b in zip(bounds, bounds[1:]):
            units.append(
                Unit(
                    f"{s.name}/rows_{a}_{b}",
                    s.name,
                    (a, b),
                    (b - a, *s.shape[1:]),
                    s.dtype,
                    0,
                )
            )
    mobile = [i for i, u in enumerate(units) if u.owner != LOCAL]
    owners = partition_by_bytes([units[i].nbytes for i in mobile], parts)
    for i, o in zip(mobile, owners):
        units[i] = dataclasses.replace(units[i], owner=o)
    return units


def shard_bytes(units: Sequence[Unit], parts: int) -> list[int]:
    """Bytes each of ``parts`` shards writes (rank-local leaves counted for all)."""
    loads = [0] * parts
    for u in units:
        for r in range(parts) if u.owner == LOCAL else (u.owner,):
            loads[r] += u.nbytes
    return loads


def imbalance(units: Sequence[Unit], parts: int) -> float:
    """Largest shard over the mean shard (1.0 is perfect balance)."""
    loads = shard_bytes(units, parts)
    mean = sum(loads) / parts
    return max(loads) / mean if mean else 1.0
