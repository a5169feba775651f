"""One collective in flight: the :class:`Handle` a caller waits on, and its task.

:class:`~research.comm.asynchronous.handles.AsyncComm` starts a collective by handing an
:class:`_Op` to the rank's progress thread (:mod:`research.comm.asynchronous.progress`),
which issues the nonblocking MPI call, tests it between sleeps, holds the
result for the emulated link's modelled time, then records the times on the
:class:`Handle`, puts the span on the timeline (track ``comm-bg``) and wakes the
waiting caller. An error inside MPI is the handle's (raised by its ``wait``)
and the engine's (it then refuses new starts).

The task shares two fields with its engine, both written on the progress
thread only: ``_link_free`` (when the emulated link frees: collectives share
it in start order) and ``_error`` (the first failure). Usage and the contract
are in :mod:`research.comm.asynchronous.handles`, which re-exports :class:`Handle`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from mpi4py import MPI

from research.comm.asynchronous.progress import Poll, Task
from research.comm.faults import watchdog
from research.trace import get_tracer


class Engine(Protocol):
    """What a collective in flight uses of the engine that started it
    (:class:`~research.comm.asynchronous.handles.AsyncComm`): its communicator,
    its progress thread's sleep bound, and the two fields they share."""

    _comm: MPI.Comm
    max_sleep: float
    _link_free: float  # when the emulated link frees
    _error: BaseException | None  # the first failure


class Handle:
    """One collective started by an :class:`Engine`; wait for it with :meth:`wait`.

    Attributes (set on the progress thread; read them after ``wait``):
      kind: the collective's name.
      name: its span's name on the timeline (``name=`` of the start; default:
        ``kind``), e.g. ``"reduce-scatter block2"``.
      nbytes: bytes this rank handed to MPI.
      started_at: ``time.perf_counter()`` when the progress thread issued it.
      real_s: issue to completion of the MPI call, seconds.
      model_s: the link's modelled time (0 with the real link).
      emulated_s: extra time the emulated link held the result after MPI had
        finished (0 with the real link or when MPI took longer than the model).
      total_s: issue to the result being handed over, seconds.
      wait_s: time callers spent inside :meth:`wait`.
    """

    def __init__(
        self,
        kind: str,
        nbytes: int,
        result: np.ndarray | None,
        model_s: float,
        name: str | None = None,
    ) -> None:
        self.kind, self.nbytes, self.model_s = kind, int(nbytes), float(model_s)
        self.name = name or kind
        self.started_at: float | None = None
        self.real_s: float | None = None
        self.emulated_s = 0.0
        self.total_s: float | None = None
        self.wait_s = 0.0
        self._result = result
        self._error: BaseException | None = None
        self._event = threading.Event()

    def done(self) -> bool:
        """True once the result (or an error) is ready; never blocks."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> np.ndarray | None:
        """Block (sleeping) until done; the result buffer, or raise its error.

        Raises:
          TimeoutError: not done within ``timeout`` seconds (it stays in flight).
        """
        t0 = time.perf_counter()
        with watchdog.watch(self.name, detail=f"{self.nbytes} B"):
            finished = self._event.wait(timeout)
        self.wait_s += time.perf_counter() - t0
        if not finished:
            raise TimeoutError(f"{self.kind} not complete after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def __repr__(self) -> str:
        state = "failed" if self._error else "done" if self.done() else "in flight"
        return f"<Handle {self.kind} {self.nbytes} B {state}>"


class _Op(Task):
    """A handle's life on the progress thread: issue, test, emulate, hand over."""

    def __init__(self, engine: Engine, handle: Handle, issue: Callable, keep: Any):
        self.engine, self.handle, self.issue, self.keep = engine, handle, issue, keep
        self.max_sleep = engine.max_sleep
        self.reqs: list[MPI.Request] = []
        self.statuses: list[MPI.Status] = []
        self.finish_at = 0.0
        self.real_done: float | None = None

    def start(self) -> None:
        t0 = time.perf_counter()
        self.handle.started_at = t0
        self.reqs = self.issue(self.engine._comm)
        self.statuses = [MPI.Status() for _ in self.reqs]
        self.issue = None
        if self.handle.model_s:
            begin = max(t0, self.engine._link_free)
            self.finish_at = self.engine._link_free = begin + self.handle.model_s

    def poll(self) -> Poll:
        now = time.perf_counter()
        if self.real_done is None:
            if not _test_all(self.reqs, self.statuses):
                return Poll.IDLE
            self.real_done = now = time.perf_counter()
            if now < self.finish_at:
                return Poll.PROGRESSED  # MPI is done: the others' backoff restarts
        if now < self.finish_at:
            return Poll.IDLE  # the thread sleeps until wake_at
        h = self.handle
        h.real_s = self.real_done - h.started_at
        h.emulated_s = max(0.0, self.finish_at - self.real_done)
        h.total_s = now - h.started_at
        self.keep = None
        get_tracer().complete(
            h.name,
            "comm-bg",
            h.started_at,
            now,
            bytes=h.nbytes,
            real_s=h.real_s,
            emulated_s=h.emulated_s,
        )
        h._event.set()
        return Poll.FINISHED

    def wake_at(self) -> float | None:
        return self.finish_at if self.real_done is not None else None

    def fail(self, exc: BaseException) -> None:
        self.keep = None
        self.engine._error = self.engine._error or exc
        self.handle._error = exc
        self.handle._event.set()


def _test_all(reqs: list[MPI.Request], statuses: list[MPI.Status]) -> bool:
    """``Testall``, raising the failed request's own error, not ERR_IN_STATUS."""
    try:
        return MPI.Request.Testall(reqs, statuses)
    except MPI.Exception as exc:
        if exc.Get_error_class() != MPI.ERR_IN_STATUS:
            raise
        codes = [s.Get_error() for s in statuses]
        code = next(c for c in codes if c not in (MPI.SUCCESS, MPI.ERR_PENDING))
        raise MPI.Exception(code) from exc
