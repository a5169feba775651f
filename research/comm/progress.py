"""One background communication thread per rank, shared by host-side primitives.

The staged strategies (host allreduce, partial collectives, overlap, sparse) and
the checkpointer's commit agreement submit work here. Tasks run one at a time, in
submission order, which keeps the MPI call order identical on every rank as long
as every rank submits in the same order.

Waiting never spins: MPICH's blocking ``Wait`` polls the network at full speed
and would steal the core the compute thread needs, so ``wait_all`` tests requests
and sleeps with a capped exponential back-off between tests.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from mpi4py import MPI

_STOP = object()


def wait_all(
    requests: Sequence[MPI.Request],
    *,
    min_sleep: float = 20e-6,
    max_sleep: float = 1e-3,
    timeout: float | None = None,
) -> None:
    """Complete ``requests`` while sleeping between tests (no busy polling).

    Args:
      requests: MPI requests to complete.
      min_sleep: first sleep between tests, seconds; doubles up to ``max_sleep``.
      max_sleep: longest sleep between tests; bounds the added latency.
      timeout: raise ``TimeoutError`` after this many seconds (None: wait forever).
    """
    reqs = [r for r in requests if r != MPI.REQUEST_NULL]
    if not reqs:
        return
    start = time.perf_counter()
    sleep = min_sleep
    while not MPI.Request.Testall(reqs):
        if timeout is not None and time.perf_counter() - start > timeout:
            raise TimeoutError(f"MPI requests not complete after {timeout:.1f} s")
        time.sleep(sleep)
        sleep = min(sleep * 2, max_sleep)


def test_sleeping(
    request: MPI.Request,
    predicate: Callable[[], bool] | None = None,
    *,
    min_sleep: float = 20e-6,
    max_sleep: float = 1e-3,
) -> bool:
    """Wait until ``request`` completes (True) or ``predicate()`` is true (False)."""
    sleep = min_sleep
    while True:
        if request.Test():
            return True
        if predicate is not None and predicate():
            return False
        time.sleep(sleep)
        sleep = min(sleep * 2, max_sleep)


class ProgressThread:
    """A single daemon thread that runs submitted callables in order.

    ``submit`` returns a ``concurrent.futures.Future``. An exception inside a task
    is stored in its future and re-raised by ``result()`` in the caller, so errors
    surface in the compute thread (which then aborts the job).
    """

    def __init__(self, name: str = "research-progress") -> None:
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed = False
        self._lock = threading.Lock()
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("progress thread is closed")
            self._queue.put((fut, fn, args, kwargs))
        return fut

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            fut, fn, args, kwargs = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                fut.set_exception(exc)

    @property
    def in_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def close(self, timeout: float | None = None) -> None:
        """Finish queued tasks, then stop the thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        self._thread.join(timeout)


_shared: ProgressThread | None = None
_shared_lock = threading.Lock()


def get_progress() -> ProgressThread:
    """The rank's shared progress thread, started on first use."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared._closed:
            _shared = ProgressThread()
        return _shared


def shutdown_progress() -> None:
    """Drain and stop the shared progress thread (call before MPI finalize)."""
    global _shared
    with _shared_lock:
        if _shared is not None:
            _shared.close()
            _shared = None
