"""Per-rank batches for synchronous data parallelism, resumable from a checkpoint.

Every rank holds the whole (host-memory) dataset and computes the same permutation
of it each epoch from ``(seed, epoch)``, so no data moves between ranks; rank ``r``
of ``P`` takes ``perm[r::P]`` after trimming the permutation to a multiple of
``P``. All ranks therefore see disjoint examples and the same number of batches,
which a synchronous step needs (a rank that ran out early would hang the
allreduce). What is left out of an epoch (the remainder below a multiple of
``P``, and the incomplete last batch when ``drop_last``) is a fresh random subset
each epoch, so no example is skipped for good.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np


class ShardedLoader:
    """Endless batches of this rank's shard, reshuffled every epoch.

    Attributes:
      batch_size: examples per batch on this rank (the global batch is
        ``batch_size * size``).
      rank: this rank, in ``[0, size)``.
      size: number of ranks.
      seed: shuffling seed, the same on every rank.
      drop_last: drop the shard's incomplete last batch (else it comes out short).
      shard_size: examples per rank per epoch.
      steps_per_epoch: batches per rank per epoch, the same on every rank.
    """

    def __init__(
        self,
        x: np.ndarray,
        y: np.ndarray,
        *,
        batch_size: int,
        rank: int,
        size: int,
        seed: int,
        drop_last: bool = True,
        position: Mapping[str, Any] | None = None,
    ) -> None:
        """Creates the loader at the start of epoch 0, or at ``position``.

        Args:
          x: inputs, first axis over examples.
          y: labels, same length as ``x``.
          batch_size: examples per batch on this rank.
          rank: this rank.
          size: number of ranks.
          seed: shuffling seed; must be the same on every rank.
          drop_last: drop an incomplete last batch of the shard.
          position: a :attr:`position` saved earlier, to resume from.

        Raises:
          ValueError: bad rank/size/batch size, or a batch larger than the shard.
        """
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} examples but y has {len(y)}")
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"need 0 <= rank < size, got rank={rank}, size={size}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.x, self.y = x, y
        self.batch_size, self.rank, self.size = batch_size, rank, size
        self.seed, self.drop_last = seed, drop_last
        self.shard_size = len(x) // size
        if batch_size > self.shard_size:
            raise ValueError(
                f"batch_size {batch_size} exceeds this rank's shard of "
                f"{self.shard_size} examples ({len(x)} examples over {size} ranks); "
                "use a smaller per-rank batch or fewer ranks"
            )
        full, rest = divmod(self.shard_size, batch_size)
        self.steps_per_epoch = full + (1 if rest and not drop_last else 0)
        self._epoch, self._index = 0, 0
        self._order: np.ndarray | None = None  # this rank's shard of self._epoch
        if position is not None:
            self.set_position(position)

    def shard_indices(self, epoch: int) -> np.ndarray:
        """Indices of the examples this rank sees in ``epoch``, in order."""
        # A fresh generator per (seed, epoch) makes any epoch computable on its own,
        # which is what lets a resumed run skip straight to where it stopped.
        perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.x))
        return perm[: self.shard_size * self.size][self.rank :: self.size]

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from."""
        return self.position["epoch"]

    @property
    def position(self) -> dict[str, int]:
        """Where the next batch comes from: ``{"epoch": e, "index": i}``.

        ``i`` batches of epoch ``e`` have been taken. JSON-serializable; pass it to
        :meth:`set_position` (or the ``position`` argument) to resume.
        """
        if self._index >= self.steps_per_epoch:
            return {"epoch": self._epoch + 1, "index": 0}
        return {"epoch": self._epoch, "index": self._index}

    def set_position(self, position: Mapping[str, Any]) -> None:
        """Moves to a position saved from :attr:`position`.

        Raises:
          ValueError: malformed position, or an index this loader's epoch lacks
            (saved with another batch size, rank count or dataset).
        """
        try:
            epoch, index = int(position["epoch"]), int(position["index"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(
                f"position must look like {{'epoch': 0, 'index': 0}}, got {position!r}"
            ) from e
        if epoch < 0 or not 0 <= index <= self.steps_per_epoch:
            raise ValueError(
                f"position {dict(position)} does not fit this loader "
                f"({self.steps_per_epoch} steps per epoch); was it saved with "
                "another batch size, rank count or dataset?"
            )
        if epoch != self._epoch:
            self._order = None
        self._epoch, self._index = epoch, index

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """The next ``(x, y)`` batch of this rank, moving into the next epoch."""
        if self._index >= self.steps_per_epoch:
            self._epoch, self._index, self._order = self._epoch + 1, 0, None
        if self._order is None:
            self._order = self.shard_indices(self._epoch)
        lo = self._index * self.batch_size
        idx = self._order[lo : lo + self.batch_size]
        self._index += 1
        return self.x[idx], self.y[idx]

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yields :meth:`next_batch` forever."""
        while True:
            yield self.next_batch()

    def close(self) -> None:
        """Nothing reads ahead: nothing to stop (``research.data.protocol``)."""

    def summary(self) -> dict[str, Any]:
        """Nothing to report beyond the run's own figures."""
        return {}


def eval_slice(n: int, rank: int, size: int) -> slice:
    """This rank's contiguous part of ``n`` examples; parts differ by at most one."""
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"need 0 <= rank < size, got rank={rank}, size={size}")
    return slice(rank * n // size, (rank + 1) * n // size)


def eval_batches(
    x: np.ndarray, y: np.ndarray, batch_size: int, rank: int, size: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Batches of this rank's disjoint slice of an evaluation split.

    The ranks' slices cover every example exactly once, so summing correct counts,
    loss sums and example counts over ranks gives the exact global mean. The last
    batch may be short, and ranks may get different numbers of batches (slices
    differ by one example): reduce over ranks once after the loop, not per batch.

    Args:
      x: inputs of the split.
      y: labels of the split.
      batch_size: largest batch.
      rank: this rank.
      size: number of ranks.

    Returns:
      An iterator of ``(x_batch, y_batch)`` views, in order.

    Raises:
      ValueError: bad batch size, rank or size.
    """
    # Checked here, not in the generator, so a bad call fails where it is made.
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} examples but y has {len(y)}")
    part = eval_slice(len(x), rank, size)
    bounds = [
        (lo, min(lo + batch_size, part.stop))
        for lo in range(part.start, part.stop, batch_size)
    ]
    return ((x[lo:hi], y[lo:hi]) for lo, hi in bounds)
