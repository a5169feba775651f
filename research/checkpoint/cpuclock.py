"""CPU clocks for the writer-CPU column: what a checkpoint cost in CPU, not wall.

Wall-clock figures on a shared 2-core machine move 4x from run to run; the CPU
a writer spends on a checkpoint does not. Each saver measures its writer
with the clock that sees exactly it:

* a helper process (DeepFreeze's default): ``time.process_time`` in it;
* work done by one thread (DeepFreeze's staging copy, its thread writer):
  ``time.thread_time`` in that thread;
* a blocking save (rank0-blocking, orbax-blocking): the process's CPU across the call,
  since training is paused and Orbax's own threads are included;
* Orbax's asynchronous save: :class:`OffThread`, the process's CPU minus the
  training thread's over the save's lifetime (Orbax's threads, whose names and
  lifetimes are its own), plus the training thread's CPU inside ``save``. It
  also counts other background threads (the sleeping progress thread of the
  ``sync`` strategy: little), so it is an upper bound.
"""

from __future__ import annotations

import resource
import threading
import time


def process_cpu() -> float:
    """User + system CPU seconds of this process, all threads (living or ended)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class OffThread:
    """CPU of a process spent outside one thread since construction.

    Construct it in the training thread; :meth:`mark_returned` there when the
    blocking part ends; :meth:`elapsed` from any thread when the work is done.
    """

    def __init__(self) -> None:
        self._clock = time.pthread_getcpuclockid(threading.get_ident())
        self._p0 = process_cpu()
        self._t0 = time.clock_gettime(self._clock)
        self._inside = 0.0

    def mark_returned(self) -> None:
        """The training thread's CPU so far is the save call's own: keep it."""
        self._inside = time.clock_gettime(self._clock) - self._t0

    def elapsed(self) -> float:
        """Seconds of CPU: the process's since construction, less the thread's
        outside the save call."""
        thread = time.clock_gettime(self._clock) - self._t0
        return max(0.0, process_cpu() - self._p0 - thread + self._inside)
