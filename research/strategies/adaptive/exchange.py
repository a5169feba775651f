"""Every rank's stamp of every step, to every rank: the ``adaptive`` strategy's
only messages of its own.

After each step each rank starts a non-blocking allgather of its stamp
(:mod:`research.strategies.adaptive.stamp`: a few numbers), on the strategy's own
communicator, every rank in the same order; the stamps of a step are read
``lag`` steps later (its *due* step), in step order, so every rank's policy
reads the same stamps at the same step. A synchronous candidate's stamps are
due at the next step: its ranks meet in every step's collective anyway, so
the wait is one small message's latency (tested with sleeps in between, not
MPICH's spinning wait). A partial candidate's are due
``staleness`` steps later: its ranks run apart, but never by more than that
(its full round), so the wait costs nothing there either.
:meth:`Exchange.flush` completes all of them (a switch away from a partial
candidate, the end).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from research.strategies.adaptive.stamp import FIELDS


class Exchange:
    """The stamps in flight, oldest first (module docstring).

    Args:
      comm: an ``MPI.Intracomm`` of its own (the strategy's duplicate).
    """

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.size = comm.Get_size()
        self._pending: deque = deque()  # (due, request, sent, received)

    def post(self, stamp: list[float], due: int) -> None:
        """Start sending this rank's ``stamp``, to be read at step ``due``."""
        sent = np.asarray(stamp, np.float64)
        if sent.shape != (len(FIELDS),):
            raise ValueError(f"a stamp has {len(FIELDS)} numbers, got {sent.shape}")
        got = np.empty((self.size, len(FIELDS)), np.float64)
        req = self.comm.Iallgather(sent, got)
        self._pending.append((int(due), req, sent, got))

    def due(self, step: int) -> list[list[list[float]]]:
        """The stamps due by ``step``, oldest first: each a list of every
        rank's stamp (rank order)."""
        out = []
        while self._pending and self._pending[0][0] <= step:
            out.append(self._complete())
        return out

    def flush(self) -> list[list[list[float]]]:
        """Every stamp in flight, oldest first (waits for all of them)."""
        out = []
        while self._pending:
            out.append(self._complete())
        return out

    def _complete(self) -> list[list[float]]:
        from research.comm.asynchronous.progress import wait_all

        _, req, _, got = self._pending.popleft()
        # Sleeping tests, not MPICH's Wait, which polls at full speed: with
        # more ranks than cores it would take a core from a rank still busy.
        wait_all([req], max_sleep=2e-4, what="adaptive stamps")
        return got.tolist()

    def __len__(self) -> int:
        return len(self._pending)
