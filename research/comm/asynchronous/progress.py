"""One background communication thread per rank, shared by host-side primitives.

What runs on it: the asynchronous handles (:mod:`research.comm.asynchronous.handles`),
whose nonblocking collectives it issues and completes, and the partial collectives'
rounds (:mod:`research.comm.partial`) and the parameter server
(:mod:`research.comm.ps`). What does not: the host allreduce
(:class:`research.comm.dense.HostAllreduce`) blocks in the calling thread, and the
checkpoint agreement (:mod:`research.checkpoint.agreement`) completes its
requests with :func:`wait_all` on the checkpointer's own background thread.

Work comes as :class:`Task` objects (:meth:`ProgressThread.add`), taken from one
FIFO queue and started in that order, so the MPI calls they *issue* happen in
submission order, identical on every rank as long as every rank submits in the
same order. A started task is polled together with every other active task until
it reports itself finished. Tasks never block in MPI: they issue nonblocking
calls and test them, so any number can be in flight at once and one waiting on a
slow peer holds up no other.

Waiting never spins. MPICH's blocking calls (``Wait``, ``Allreduce``...) poll at
full speed and would steal the core the compute thread needs; here a round of
polls that makes no progress is followed by a sleep that doubles from
``min_sleep`` up to the smallest ``max_sleep`` of the active tasks, and any
submission or :meth:`ProgressThread.wake` cuts the sleep short. With no task
active the thread blocks on a condition variable and uses no CPU at all.

A long wait (a peer arriving late) tolerates longer sleeps: once nothing has
progressed for a while, the cap rises to 1/32 of the time waited so far, up to
``LONG_SLEEP`` (reached after 32 ms), which cuts the polls of a long wait. The
price: a nonblocking collective needs a handful of tests on every rank after
the last one arrives (4 to 8 measured for 256 KB to 16 MB, 2 ranks, each moving
a whole chunk), and each may come up to one sleep late, so a collective that
waited 32 ms or more may finish a few ms later than with short sleeps. Waiting
is not for free either way: a 256 KB ``Iallreduce`` takes 0.1 ms with busy
tests and 0.7 ms with 50 us sleeps between tests. Start many, then wait.

Rank 1 of 2 waiting on one small allreduce while rank 0 is 0.3 s late
(``python -m scripts.bench_handles``, 2 cores shared with other jobs, load 3-5),
CPU seconds spent by the waiting rank:

===============================================  ===========
a blocking ``Allreduce`` (MPICH polls)           0.24-0.30
sleeping tests, 50 us cap throughout             0.053-0.077
sleeping tests, 1 ms cap throughout              0.015-0.025
50 us cap rising to 1 ms as the wait grows       0.022
===============================================  ===========
"""

from __future__ import annotations

import atexit
import enum
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from mpi4py import MPI

from research.comm.faults import watchdog

_STOP = object()
#: Longest sleep between polls once a wait has grown long (see module docstring).
LONG_SLEEP = 1e-3
#: A long wait may sleep this fraction of the time it has waited so far.
PATIENCE = 1 / 32


def wait_all(
    requests: Sequence[MPI.Request],
    *,
    min_sleep: float = 20e-6,
    max_sleep: float = 1e-3,
    timeout: float | None = None,
    what: str = "wait_all",
    peers: Sequence[int] | None = None,
) -> None:
    """Complete ``requests`` while sleeping between tests (no busy polling).

    Args:
      requests: MPI requests to complete.
      min_sleep: first sleep between tests, seconds; doubles up to ``max_sleep``.
      max_sleep: longest sleep between tests; bounds the added latency.
      timeout: raise ``TimeoutError`` after this many seconds (None: wait forever).
      what, peers: what the communication watchdog names while it waits.
    """
    reqs = [r for r in requests if r != MPI.REQUEST_NULL]
    if not reqs:
        return
    start = time.perf_counter()
    sleep = min_sleep
    with watchdog.watch(what, peers):
        while not MPI.Request.Testall(reqs):
            if timeout is not None and time.perf_counter() - start > timeout:
                raise TimeoutError(f"MPI requests not complete after {timeout:.1f} s")
            time.sleep(sleep)
            sleep = min(sleep * 2, max_sleep)


class Poll(enum.Enum):
    """What one :meth:`Task.poll` achieved."""

    IDLE = 0  # nothing happened: the thread may sleep before the next poll
    PROGRESSED = 1  # something happened: poll again without sleeping
    FINISHED = 2  # the task is over: drop it


class Task:
    """Work polled on the progress thread until finished (see module docstring).

    Subclasses implement :meth:`poll` and :meth:`fail`; all three methods run on
    the progress thread only.

    Attributes:
      max_sleep: longest sleep between polls while this task is active. A
        nonblocking collective advances only inside a test on every rank, so
        tasks with one in flight keep this short.
    """

    max_sleep: float = 1e-3

    def start(self) -> None:
        """Called once, in submission order: issue the first MPI calls here."""

    def poll(self) -> Poll:
        """Test what is in flight and advance; never block."""
        raise NotImplementedError

    def wake_at(self) -> float | None:
        """A ``time.perf_counter()`` instant by which to be polled again, if any."""
        return None

    def fail(self, exc: BaseException) -> None:
        """``start`` or ``poll`` raised ``exc``: hand it to whoever waits."""
        raise NotImplementedError


class _Call(Task):
    """A blocking function run once on the thread, its outcome in a Future."""

    def __init__(self, fut: Future, fn: Callable[..., Any], args: tuple) -> None:
        self.fut, self.fn, self.args = fut, fn, args

    def start(self) -> Poll:
        if self.fut.set_running_or_notify_cancel():
            self.fut.set_result(self.fn(*self.args))
        return Poll.FINISHED

    def poll(self) -> Poll:
        return Poll.FINISHED

    def fail(self, exc: BaseException) -> None:
        self.fut.set_exception(exc)


class ProgressThread:
    """A single daemon thread that starts tasks in order and polls them.

    An exception inside a task's ``start`` or ``poll`` goes to its
    :meth:`Task.fail`, which hands it to the thread waiting for the task, so
    errors surface in the compute thread (which then aborts the job).

    Args:
      name: the thread's name.
      min_sleep: first sleep after a round of polls without progress, seconds.
      long_sleep: the cap a long wait rises to (see module docstring).
    """

    def __init__(
        self,
        name: str = "research-progress",
        min_sleep: float = 20e-6,
        long_sleep: float = LONG_SLEEP,
    ) -> None:
        self._cond = threading.Condition()
        self._incoming: list[Any] = []
        self._woken = False
        self._closed = False
        self._halted = False
        self._min_sleep, self._long_sleep = min_sleep, long_sleep
        self._rounds = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(self, task: Task) -> None:
        """Start ``task`` on the thread (after those added before), then poll it."""
        self._put(task)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run ``fn(*args)`` on the thread, in order with the tasks; a Future.

        For work written as one blocking call (the sparse allreduce): it holds
        the thread, and every task behind it, while it runs.
        """
        fut: Future = Future()
        self.add(_Call(fut, fn, args))
        return fut

    def wake(self) -> None:
        """Cut the current sleep short: a task has new local work."""
        with self._cond:
            self._woken = True
            self._cond.notify()

    @property
    def in_thread(self) -> bool:
        return threading.current_thread() is self._thread

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    @property
    def rounds(self) -> int:
        """Rounds of polls run so far: each wake-up counts one, none while idle.

        A measure of how often the thread woke, independent of how much CPU a
        loaded machine gave it (tests check waiting by it, not by CPU time).
        """
        return self._rounds

    def close(self, timeout: float | None = None) -> None:
        """Finish queued and active tasks, then stop. Idempotent."""
        self._put(_STOP, closing=True)
        self._thread.join(timeout)

    def halt(self, timeout: float = 2.0) -> None:
        """Stop at the next poll, leaving active tasks unfinished (no MPI call)."""
        with self._cond:
            self._closed = self._halted = True
            self._cond.notify()
        if not self.in_thread:
            self._thread.join(timeout)

    def _put(self, item: Any, closing: bool = False) -> None:
        with self._cond:
            if self._closed:
                if closing:
                    return
                raise RuntimeError("progress thread is closed")
            self._closed = closing
            self._incoming.append(item)
            self._cond.notify()

    def _run(self) -> None:
        tasks: list[Task] = []
        sleep, stopping = self._min_sleep, False
        idle_since = time.perf_counter()
        while True:
            with self._cond:
                if not (self._incoming or self._woken or self._halted):
                    if tasks:
                        self._cond.wait(self._timeout(tasks, sleep, idle_since))
                    elif stopping:
                        return
                    else:
                        self._cond.wait()
                incoming, self._incoming, self._woken = self._incoming, [], False
                if self._halted:
                    return
            self._rounds += 1
            progressed = bool(incoming)
            for item in incoming:
                if item is _STOP:
                    stopping = True
                elif self._guard(item, item.start) is not Poll.FINISHED:
                    tasks.append(item)
            for task in list(tasks):
                outcome = self._guard(task, task.poll)
                if outcome is Poll.FINISHED:
                    tasks.remove(task)
                progressed = progressed or outcome is not Poll.IDLE
            if progressed:
                sleep, idle_since = self._min_sleep, time.perf_counter()
                watchdog.progress()
            else:
                sleep = min(2 * sleep, 1.0)

    def _timeout(self, tasks: list[Task], sleep: float, idle_since: float) -> float:
        now = time.perf_counter()
        cap = min(t.max_sleep for t in tasks)
        cap = max(cap, min(self._long_sleep, (now - idle_since) * PATIENCE))
        timeout = min(sleep, cap)
        wakes = [w for w in (t.wake_at() for t in tasks) if w is not None]
        if wakes:
            timeout = min(timeout, max(0.0, min(wakes) - now))
        return timeout

    @staticmethod
    def _guard(task: Task, step: Callable[[], Poll | None]) -> Poll | None:
        try:
            return step()
        except BaseException as exc:  # noqa: BLE001 - handed to the task's waiter
            task.fail(exc)
            return Poll.FINISHED


_shared: ProgressThread | None = None
_shared_lock = threading.Lock()


def get_progress() -> ProgressThread:
    """The rank's shared progress thread, started on first use."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared._closed:
            _shared = ProgressThread()
        return _shared


@atexit.register
def _halt_shared() -> None:
    # Registered after mpi4py's import, so it runs before MPI_Finalize: a thread
    # inside an MPI call would otherwise race finalization. Nothing is completed
    # here (that would take collectives the other ranks may never make).
    with _shared_lock:
        if _shared is not None:
            _shared.halt()
