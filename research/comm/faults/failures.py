"""Failure records: why a rank ended the job, for the launcher that restarts it.

A rank that ends the job (the communication watchdog, an uncaught exception)
writes one small JSON file, ``<dir>/failures/attempt<N>-r<rank>.json``, before
it aborts: the cause (``comm-timeout``, ``exception``, ``mpi-error``), its
one-line message, the rank, its host, the step and the time (UTC seconds).
``<dir>`` is the run folder (:func:`set_dir`, called by the Trainer); ``N`` the
launcher's attempt (``RESEARCH_ATTEMPT``, 0 for the first). The launcher reads
them back with :func:`read` once ``mpiexec`` has returned (``research.entry.restart``).

Writing is best effort and bounded: the folder may be on the file system that
failed, so a failed write is ignored, and the abort path that calls it has its
own time limit (:data:`research.comm.world.ABORT_FALLBACK_S`).

An ``mpi-error`` (an exception raised from MPI's own error) is as a rule what
a rank saw of another's end: a peer killed with SIGKILL writes nothing, and the
rank reading from it then fails with, say, ``process_vm_readv failed``
(through mpi4py, or in the ring allreduce: :data:`RING_MPI_ERROR`). The
launcher takes it for the cause only when nothing else was recorded
(``research.entry.restart.cause_of``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

#: The launcher's attempt number, passed to every rank.
ATTEMPT_ENV = "RESEARCH_ATTEMPT"
_dir: Path | None = None


def set_dir(path: str | os.PathLike | None) -> None:
    """Where this rank's failure record goes (the run folder); None: nowhere."""
    global _dir
    _dir = Path(path) if path else None


def attempt() -> int:
    """This job's attempt (0: the first launch)."""
    try:
        return int(os.environ.get(ATTEMPT_ENV, "0"))
    except ValueError:
        return 0


#: The cause recorded for an exception raised from MPI's own error.
MPI_ERROR = "mpi-error"
#: What the ring allreduce's message says before MPI's error string
#: (research/comm/dense/native/ring_allreduce.cc). Raised inside ``jit`` it reaches
#: Python as XLA's runtime error, on the host path as a RuntimeError: neither
#: is ``MPI.Exception``, so the words are how a rank tells it was MPI's.
RING_MPI_ERROR = "ring allreduce: MPI error: "


def record(cause: str, message: str, **fields: Any) -> None:
    """Write this rank's failure record (the first one of the attempt wins)."""
    if _dir is None:
        return
    rank = fields.get("rank", "x")
    rec = {
        "cause": cause,
        "message": message,
        "host": socket.gethostname(),
        "time": time.time(),
        "attempt": attempt(),
        **fields,
    }
    path = _dir / "failures" / f"attempt{attempt()}-r{rank}.json"
    with contextlib.suppress(OSError, TypeError, ValueError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as f:
            json.dump(rec, f)


def read(run_dir: str | os.PathLike, attempt_no: int) -> list[dict[str, Any]]:
    """The failure records of one attempt, earliest first."""
    out = []
    for path in sorted((Path(run_dir) / "failures").glob(f"attempt{attempt_no}-*")):
        with contextlib.suppress(OSError, ValueError):
            out.append(json.loads(path.read_text()))
    return sorted(out, key=lambda r: r.get("time", 0))
