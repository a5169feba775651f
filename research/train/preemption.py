"""Stop cleanly when told: every rank stops at one agreed step and saves its work.

A batch system ends a job at its time limit or on preemption with SIGTERM to
every process, then SIGKILL some seconds later; Slurm sends a signal of the
user's choice earlier when asked (``#SBATCH --signal=USR1@120``). On SIGTERM or
SIGUSR1 a :class:`~research.train.loop.Trainer` run

1. finishes the step it is in; the ranks agree on a step to stop at (below);
2. at that step drains the strategy's communication in flight (as before a
   checkpoint), saves a checkpoint of that step when a checkpoint saver is
   set and waits until it is committed, skips the final evaluation;
3. flushes the timeline and the metrics, writes ``summary.json`` with
   ``"stopped": {"signal": "SIGTERM", "step": N, ...}``;
4. exits with :data:`exit code <STOP_EXIT>` ``128 + signal number``: 143 for
   SIGTERM, 138 for SIGUSR1 (what a shell reports for a process the signal
   killed, so a batch script treats both alike). :class:`Stopped`, a
   ``SystemExit``, carries the code out of ``Trainer.run`` and ends a study of
   several runs too. The same command run again resumes from that step.

A run that reaches its last step while the ranks are still agreeing ends
normally (exit 0): its work is done.

The agreement. A signal handler only records the signal (no MPI, no I/O in a
handler). After every step each rank starts a non-blocking ``Iallreduce(MAX)``
of its flag on a communicator of its own (``world.dup("preempt")``) and waits
for the one it started ``lag`` steps earlier. Every rank starts them in the same
order, one per step, so request s has the same result on every rank; the first
request whose result is set, s, makes every rank stop after step ``s + lag``,
the same step everywhere, whether or not the ranks run in lock step. Waiting
for a request ``lag`` steps old blocks only a rank more than ``lag`` steps
ahead of the slowest, which lock-step strategies never are; for the partial
collectives (solo, majority), which let a fast rank run up to ``full_every``
rounds ahead, the lag is that bound, so the agreement never slows them down
(the cost: up to ``full_every`` more steps before stopping); where nothing
bounds the distance (a parameter server, ``full_every=None``) it is
:data:`UNBOUNDED_LAG` (:func:`lag_for` asks the strategy: its ``drift``).
Orbax's preemption sync point and torchrun's SIGTERM handling work alike: a
flag, then an agreement at a step boundary.

A rank that cannot reach a step boundary (a wait on the device or in a
collective that never returns: a Python handler runs only when the main thread
does) would never see its flag. So the signal also wakes a thread of its own
(``signal.set_wakeup_fd``: the interpreter's C handler writes the signal's
number there at once), which ends the job (``world.abort(128 + signal)``, with
one line saying why) if the ranks have not agreed on a stop within
:func:`stop_deadline_s`: ``RESEARCH_STOP_GRACE_S`` (60 s), or more where
``lag`` slow steps take longer.

Signals reach the ranks through the launcher: ``python -m experiments.X``
started without mpiexec forwards SIGTERM and SIGUSR1 to its mpiexec
(``research.entry.launch.relaunch``), and MPICH's mpiexec (Hydra) forwards both to
every rank and returns the ranks' exit code. Checkpoint writer processes
ignore both: their rank tells them when to finish.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from research.comm.faults import watchdog

#: The signals that stop a run cleanly.
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
#: Steps between a flag's Iallreduce and the wait for it (lock-step strategies).
DEFAULT_LAG = 2
#: The lag where the ranks' distance has no bound (a parameter server's workers,
#: a partial collective that never forces a synchronous round): a fast rank is
#: held at most this many steps ahead of the slowest while the run lasts.
UNBOUNDED_LAG = 64


#: ``RESEARCH_STOP_GRACE_S``: seconds after a stop signal within which the
#: ranks must agree on a stop, else the job is ended (:func:`stop_deadline_s`).
GRACE_ENV, DEFAULT_GRACE_S = "RESEARCH_STOP_GRACE_S", 60.0


def stop_deadline_s(lag: int) -> float:
    """Seconds from a stop signal to the agreement before the job is ended:
    the grace, or ``2 (lag + 2)`` of the slowest step so far where longer."""
    grace = float(os.environ.get(GRACE_ENV, DEFAULT_GRACE_S))
    dog = watchdog.get()
    slowest = dog.slowest_step if dog is not None else 0.0
    return max(grace, 2 * (lag + 2) * slowest)


def stop_exit_code(signum: int) -> int:
    """The exit code of a run stopped by ``signum``: ``128 + signum``."""
    return 128 + int(signum)


#: Exit code of a run stopped by SIGTERM (143) and by SIGUSR1 (138).
STOP_EXIT = {s.name: stop_exit_code(s) for s in SIGNALS}


class Stopped(SystemExit):
    """Raised by ``Trainer.run`` after a clean stop; exits ``128 + signal``."""

    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__(stop_exit_code(record["signum"]))
        self.record = record


def lag_for(strategy: Any) -> int:
    """Steps the agreement waits behind: as far apart as the strategy lets
    ranks run (its ``drift``: 0 in lock step; partial collectives up to
    ``full_every`` rounds; None without bound, a parameter server)."""
    drift = strategy.drift
    if drift is None:
        return UNBOUNDED_LAG
    return max(DEFAULT_LAG, int(drift))


class StopAgreement:
    """Catches the stop signals and agrees across ranks on the step to stop at.

    Args:
      world: the job's :class:`research.comm.world.World` (collective: it
        duplicates a communicator).
      lag: steps between starting a flag's reduction and waiting for it.

    Call :meth:`check` after every step on every rank, then :meth:`close`.
    """

    def __init__(self, world: Any, lag: int = DEFAULT_LAG) -> None:
        self.lag = max(1, int(lag))
        self.world = world
        self.comm = world.dup("preempt") if world.size > 1 else None
        self.received: int | None = None  # the first signal this rank got
        self.stopped: dict[str, Any] | None = None  # the agreed stop, once known
        self._pending: deque = deque()  # (step, send, recv, request)
        self._previous: dict[int, Any] = {}
        self._wakeup: tuple[int, int] | None = None  # (read end, previous fd)
        self._done = False
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handler)
            self._watch_signals()

    def _watch_signals(self) -> None:
        """A thread that the signal wakes even while the main thread waits in
        C, and that ends the job if no stop is agreed in time."""
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except ValueError:  # not the main interpreter's main thread
            os.close(r)
            os.close(w)
            return
        self._wakeup = (r, old)
        threading.Thread(
            target=self._deadline, args=(r,), name="research-stop-deadline", daemon=True
        ).start()

    def _deadline(self, fd: int) -> None:
        wanted = {int(s) for s in SIGNALS}
        with os.fdopen(fd, "rb", buffering=0) as pipe:
            while True:
                data = pipe.read(64)  # b"": the write end closed (restored)
                if not data or self._done:
                    return
                got = [b for b in data if b in wanted]
                if got:
                    break
        limit = stop_deadline_s(self.lag)
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if self.stopped is not None or self._done:
                return
            time.sleep(0.2)
        name = signal.Signals(got[0]).name
        code = stop_exit_code(got[0])
        print(
            f"r{self.world.rank} | {name} {limit:.0f} s ago, and the ranks have not "
            f"agreed on a step to stop at (a step that does not end: see the "
            f"watchdog's lines above, if any): ending the job (exit {code})",
            file=sys.stderr,
            flush=True,
        )
        from research.comm.world import abort

        abort(code)

    def _handler(self, signum: int, frame: Any) -> None:
        # Only a flag: MPI, locks and I/O are unsafe in a signal handler.
        if self.received is None:
            self.received = signum

    def check(self, step: int) -> bool:
        """After step ``step``: True when every rank stops here (same on all)."""
        if self.stopped is not None:
            return True
        flag = np.array([self.received or 0], dtype=np.int32)
        if self.comm is None:
            return self._decide(step, step, int(flag[0]))
        from mpi4py import MPI

        out = np.zeros(1, dtype=np.int32)
        req = self.comm.Iallreduce(flag, out, op=MPI.MAX)
        self._pending.append((step, flag, out, req))
        if len(self._pending) <= self.lag:
            return False
        flagged_at, _, out, req = self._pending.popleft()
        with watchdog.watch("stop agreement", detail=f"flag of step {flagged_at}"):
            req.Wait()
        return self._decide(step, flagged_at, int(out[0]))

    def _decide(self, step: int, flagged_at: int, signum: int) -> bool:
        if not signum:
            return False
        self.stopped = {
            "signal": signal.Signals(signum).name,
            "signum": signum,
            "step": step,
            "flagged_at_step": flagged_at,
            "exit_code": stop_exit_code(signum),
        }
        return True

    def close(self) -> None:
        """Complete the reductions still in flight; restore the signal handlers.

        Collective (every rank started the same reductions). A run that ended
        at its last step before the agreement came through ends normally.
        """
        self._done = True
        if self.comm is not None and self._pending:
            from mpi4py import MPI

            with watchdog.watch("stop agreement", detail="closing"):
                MPI.Request.Waitall([p[3] for p in self._pending])
            self._pending.clear()
        self.restore_handlers()

    def restore_handlers(self) -> None:
        """Put back the handlers found at construction (local; error paths too).

        Not after a stop signal came: the process is on its way out with
        ``128 + signal``, and more copies of the signal are still on their way
        (a signal sent to the job's process group reaches a rank directly and
        again through each launcher that forwards it, Hydra included). Put
        back, the default action would kill the rank in the middle of its
        final checkpoint, and the job would end "Terminated (signal 15)"
        instead of exit 143. The flag-only handler stays, so the copies are
        recorded and otherwise ignored.
        """
        self._done = True
        if self.received is not None:
            return
        for sig, prev in self._previous.items():
            signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
        self._previous = {}
        if self._wakeup is not None:
            _, old = self._wakeup
            self._wakeup = None
            # The thread reads end-of-file, closes its end and returns.
            os.close(signal.set_wakeup_fd(old))


def save_at_stop(trainer: Any) -> None:
    """At the agreed step: checkpoint it (every callback's ``on_stop``).

    Collective. The strategy's communication has been drained already.
    """
    for cb in trainer.callbacks:
        hook = getattr(cb, "on_stop", None)
        if hook is not None:
            hook(trainer)
