"""The watchdog's roll call: which ranks answer, and where each of them is.

A rank whose wait has been quiet for the warning time asks every other rank
where it is (:meth:`RollCall.ask`); each rank's roll-call thread answers with
its watchdog's status (host, step, the wait it is in, for how long). Ranks that
do not answer within :attr:`RollCall.window_s` are the ones a stalled
collective most likely waits for: on the far side of a link that is down, on a
frozen node, or gone.

It runs on a thread of its own, on a communicator of its own (a ``Dup`` made
when the watchdog starts, collective) with ``MPI_ERRORS_RETURN``: a roll call
never ends a job by itself, and the watchdog thread, which decides and aborts,
makes no MPI call at all, so an MPI call that hangs here cannot keep the job
alive. A healthy run only pays one ``Improbe`` every :data:`POLL_S` seconds;
messages are exchanged only while some rank is stalled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

_ASK, _ANSWER = 1, 2
#: How often the thread looks for questions and answers, seconds.
POLL_S = 0.5


class RollCall:
    """Questions and answers between the ranks' watchdogs.

    Args:
      comm: the world's communicator (duplicated here: collective).
      status: returns what this rank answers (a small JSON-able dict).
      window_s: how long :meth:`answers` waits for the others after asking.
    """

    def __init__(
        self, comm: MPI.Intracomm, status: Callable[[], dict], window_s: float = 3.0
    ) -> None:
        self.comm = comm.Dup()
        self.comm.Set_name("research.watchdog")
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.status = status
        self.window_s = window_s
        self._want = threading.Event()
        self._seq = 0
        self._asked_at: float | None = None
        self._answers: dict[int, dict] = {}
        self._sends: list[Any] = []
        self._broken: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="research-rollcall", daemon=True
        )
        self._thread.start()

    def ask(self) -> None:
        """Ask every other rank where it is (the thread sends the questions)."""
        self._want.set()

    def complete(self) -> bool:
        """Every other rank has answered the latest question."""
        return len(self._answers) >= self.size - 1

    def answers(self) -> dict[int, dict] | None:
        """``{rank: its answer}`` of the latest question (None: never asked, or
        MPI failed here)."""
        if self._asked_at is None or self._broken:
            return None
        return dict(self._answers)

    def stop(self) -> None:
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(2 * POLL_S)

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                if self._want.is_set():
                    self._want.clear()
                    self._send_questions()
                self._serve()
            except Exception as e:  # noqa: BLE001 - the network may be gone:
                # stay quiet; a roll call never ends a job by itself
                self._broken = f"{type(e).__name__}: {e}"
                return

    def _send_questions(self) -> None:
        self._seq += 1
        self._answers = {}
        self._asked_at = time.monotonic()
        for r in range(self.size):
            if r != self.rank:
                self._sends.append(self.comm.isend(self._seq, r, _ASK))

    def _serve(self) -> None:
        status = MPI.Status()
        while (msg := self.comm.improbe(MPI.ANY_SOURCE, _ASK, status)) is not None:
            seq = msg.recv()
            answer = {"seq": seq, **self.status()}
            self._sends.append(self.comm.isend(answer, status.Get_source(), _ANSWER))
        while (msg := self.comm.improbe(MPI.ANY_SOURCE, _ANSWER, status)) is not None:
            answer = msg.recv()
            if answer.get("seq") == self._seq:
                self._answers[status.Get_source()] = answer
        self._sends = [r for r in self._sends if not r.Test()]
