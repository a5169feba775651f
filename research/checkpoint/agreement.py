"""Commit agreement: every rank's report of a step, gathered without spinning.

A checkpointer's background thread calls :func:`allgather_json` on a
communicator of its own after finishing (or failing) its part of a step. Every
rank's background thread handles steps in the same order and makes exactly one
call per stage of a step, so the collectives match on every rank.

Why not the shared progress thread: a task there that waits for a slow rank's
shard would hold up every other subsystem's tasks behind it, and tasks
submitted when a write finishes (a different moment on each rank) would be
queued in different orders relative to the training thread's tasks, which can
deadlock. A dedicated communicator plus non-blocking collectives completed
with sleeping tests (``research.comm.asynchronous.progress.wait_all``) needs neither.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from mpi4py import MPI


def allgather_json(
    comm: MPI.Intracomm, obj: Any, *, timeout: float | None = None
) -> list[Any]:
    """Every rank's ``obj`` (JSON-serialisable), in rank order.

    Two non-blocking collectives (lengths, then bytes), each completed by
    sleeping tests, so the calling thread takes no core while it waits.
    """
    from mpi4py import MPI

    from research.comm.asynchronous.progress import wait_all

    data = np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8)
    size = comm.Get_size()
    length = np.array([data.size], dtype=np.int64)
    lengths = np.empty(size, dtype=np.int64)
    what = "checkpoint agreement"
    wait_all([comm.Iallgather(length, lengths)], timeout=timeout, what=what)
    displs = np.zeros(size, dtype=np.int64)
    displs[1:] = np.cumsum(lengths)[:-1]
    recv = np.empty(int(lengths.sum()), dtype=np.uint8)
    wait_all(
        [comm.Iallgatherv(data, [recv, lengths.tolist(), displs.tolist(), MPI.BYTE])],
        timeout=timeout,
        what=what,
    )
    return [json.loads(recv[d : d + n].tobytes()) for d, n in zip(displs, lengths)]
