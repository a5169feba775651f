"""A watchdog on communication: a stalled wait is reported, then ends the job.

Every place where a thread of a rank waits for communication enters a *watch*
naming what it waits for::

    with watch("allreduce-host", peers=(1,)):
        ...  # blocking communication

Watched: handles (so the overlap and layerwise strategies), the partial
collectives' rounds, the parameter server, the host allreduce, the fused step
(its allreduce runs inside ``jit``), the sparse allreduce,
``progress.wait_all``, the stop agreement, the evaluation's sum, the timing of
``allreduce=auto`` and the world's own collectives.

One background thread per rank (started with the world, which hands it its
``abort``) looks at the watches once a second. A watch is *quiet* for as long
as none of the rank's communication has moved since the later of its start and
the last progress. Progress is: any watch ending; a round of the progress
thread that advanced one of its tasks; a step of the sparse allreduce; a piece
of the native ring allreduce (its byte counter, read inside ``jit`` too); bytes
moving on this process's TCP connections, or on those of its node's leader
(:mod:`research.comm.faults.traffic`). That is how a slow link is told from a
dead one: over a 1 Mbit/s link bytes still arrive every second, so no watch
stays quiet however long the collective takes; a link that is down, a frozen
node or a dead one moves nothing (a frozen peer's kernel may acknowledge what
is sent to it until its buffers fill; only bytes received, or 64 KiB
acknowledged, count).

Quiet for the warning time (a third of the timeout): one line per stalled rank
naming the wait, the step, the peers it waits for and for how long (from the
watch where it knows them, else from a roll call, :mod:`.rollcall`: the ranks
that do not answer within a few seconds are named as unreachable). Quiet for
the timeout: one more line, a failure record (:mod:`.failures`) and the job
ends through the world's abort with exit code :data:`EXIT_CODE` (124), within
:data:`research.comm.world.ABORT_FALLBACK_S` even where ``MPI_Abort`` hangs.

The timeout (``--comm-timeout``, ``get_world(comm_timeout=...)``,
``research.averaging(..., comm_timeout=...)``, ``RESEARCH_COMM_TIMEOUT``): a
number of seconds, ``off``, or ``auto`` (the default): :data:`DEFAULT_TIMEOUT_S`,
raised to :data:`STEP_FACTOR` times the slowest training step measured so far.
The longest healthy quiet wait (first-step compilation while another rank
still compiles: a few tens of seconds on a loaded 2-core machine) is in the
journal; every run's own longest is in ``summary.json`` (``comm_watchdog``).

Cost on a healthy step (``make bench``: ``scripts/bench_watchdog.py``, 2 ranks,
ResNet-50's 102 MB allreduce): within the run's noise (fused 0.98x,
host 1.02x running against stopped, noise 7-10%); one look of the thread 1-4 us
once a second, a watch entered and left 0.7 us.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

#: ``auto``'s timeout before any step is measured, seconds.
DEFAULT_TIMEOUT_S = 180.0
#: ``auto`` keeps the timeout at least this many times the slowest step.
STEP_FACTOR = 10.0
#: The warning comes at this fraction of the timeout.
WARN_FRACTION = 1 / 3
#: How often the watchdog thread looks, seconds.
TICK_S = 1.0
#: Exit code of a job the watchdog ended (as GNU ``timeout``'s).
EXIT_CODE = 124
#: Environment variable the timeout may also come from.
ENV = "RESEARCH_COMM_TIMEOUT"
#: A file to append every process's longest quiet wait and every warning to,
#: one JSON line each (how the healthy waits of a test suite were measured).
LOG_ENV = "RESEARCH_WATCHDOG_LOG"


class _State:
    """Process-wide: written by every thread, read by the watchdog thread."""

    def __init__(self) -> None:
        self.on = False  # watches are recorded only while a watchdog runs
        self.last = time.monotonic()  # the last progress
        self.step: int | None = None
        self.stacks: dict[int, list[Watch]] = {}
        self.names: dict[int, str] = {}


_state = _State()


class Watch:
    """One wait for communication; use as a context manager (see module doc).

    Args:
      what: the collective or strategy, e.g. ``"allreduce-host"``.
      peers: the ranks it waits for, where the caller knows them.
      detail: more words for the message (sizes, the path taken).
    """

    __slots__ = ("what", "peers", "detail", "step", "since", "_stack")

    def __init__(
        self, what: str, peers: Sequence[int] | None = None, detail: str = ""
    ) -> None:
        self.what, self.peers, self.detail = what, peers, detail
        self.step = _state.step
        self.since = 0.0
        self._stack: list[Watch] | None = None

    def __enter__(self) -> Watch:
        if _state.on:
            ident = threading.get_ident()
            stack = _state.stacks.get(ident)
            if stack is None:
                stack = _state.stacks[ident] = []
                _state.names[ident] = threading.current_thread().name
            self.since = time.monotonic()
            stack.append(self)
            self._stack = stack
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._stack is not None:
            _state.last = time.monotonic()
            if self._stack and self._stack[-1] is self:
                self._stack.pop()
            else:  # left out of order (a generator's frame): drop it anyway
                if self in self._stack:
                    self._stack.remove(self)
            self._stack = None

    def describe(self) -> str:
        text = self.what
        if self.detail:
            text += f" ({self.detail})"
        if self.step is not None:
            text += f", step {self.step}"
        return text


def watch(what: str, peers: Sequence[int] | None = None, detail: str = "") -> Watch:
    """A :class:`Watch` over a wait for communication."""
    return Watch(what, peers, detail)


def progress() -> None:
    """Something of this rank's communication moved (cheap: one assignment)."""
    _state.last = time.monotonic()


def set_step(step: int | None) -> None:
    """The training step this rank is in, for the messages."""
    _state.step = step


def parse_timeout(value: Any) -> float | str | None:
    """``"auto"`` -> ``"auto"``; ``"off"``/0 -> None; seconds -> float.

    Raises:
      ValueError: anything else, or a negative number.
    """
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return "auto"
    if isinstance(value, str) and value.strip().lower() in ("off", "none", "0"):
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"--comm-timeout must be seconds, 'auto' or 'off', got {value!r}"
        ) from None
    if seconds < 0 or seconds != seconds:
        raise ValueError(f"--comm-timeout must be >= 0 seconds, got {value!r}")
    return seconds or None


class Watchdog:
    """The rank's watchdog thread (see the module docstring); one per process."""

    def __init__(
        self,
        rank: int,
        size: int,
        rollcall: Any = None,
        abort: Callable[[int], None] | None = None,
    ) -> None:
        self.rank, self.size, self.rollcall = rank, size, rollcall
        #: Ends the whole job with an exit code (the world's ``abort``; None:
        #: this process alone ends).
        self.abort = abort
        self.board: Any = None  # research.comm.faults.traffic.NodeBoard
        self.setting: float | str | None = parse_timeout(os.environ.get(ENV))
        self.slowest_step = 0.0
        self.longest: tuple[float, str] = (0.0, "")
        self.warnings = 0
        self._episode: float | None = None  # the progress time a warning was for
        self._asked_at: float | None = None
        self._said_warning = False
        self._fired = False
        self._stop = threading.Event()
        self._traffic_base: tuple[int, int] | None = None
        self._ring_bytes: int | None = None
        self._thread = threading.Thread(
            target=self._run, name="research-watchdog", daemon=True
        )

    # -- settings -----------------------------------------------------------------
    def timeout_s(self) -> float | None:
        """The timeout in force now, seconds (None: off)."""
        if self.setting is None:
            return None
        if self.setting == "auto":
            return max(DEFAULT_TIMEOUT_S, STEP_FACTOR * self.slowest_step)
        return float(self.setting)

    def record(self) -> dict[str, Any]:
        """This rank's figures for ``summary.json``."""
        timeout = self.timeout_s()
        return {
            "setting": self.setting if self.setting is not None else "off",
            "timeout_s": timeout,
            "warn_s": None if timeout is None else timeout * WARN_FRACTION,
            "longest_quiet_s": round(self.longest[0], 3),
            "longest_quiet_in": self.longest[1] or None,
            "warnings": self.warnings,
        }

    # -- the thread -----------------------------------------------------------------
    def start(self) -> None:
        _state.on = self.setting is not None
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(2 * TICK_S)
        if self.rollcall is not None:
            self.rollcall.stop()

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self.check(time.monotonic())
            except Exception:  # noqa: BLE001 - a watchdog must not die of a bug
                traceback.print_exc()

    def check(self, now: float) -> None:
        """One look at every watch (the thread calls it each tick)."""
        from research.comm.faults import lifeline

        if lifeline.parent_gone():
            lifeline.exit_orphaned(self.rank)
        stalled = self._innermost(now)
        if stalled is None:
            self._episode = None
            return
        quiet, w, thread = stalled
        if self._moved(quiet):
            return
        if quiet > self.longest[0]:
            self.longest = (quiet, w.describe())
        timeout = self.timeout_s()
        if timeout is None or self._fired:
            return
        if quiet >= timeout:
            self._fire(quiet, w, thread, timeout)
        elif quiet >= timeout * WARN_FRACTION:
            self._warn(now, quiet, w, thread, timeout)

    def _innermost(self, now: float) -> tuple[float, Watch, str] | None:
        """The quietest innermost watch of all threads, with its thread's name."""
        worst = None
        for ident, stack in list(_state.stacks.items()):
            try:
                w = stack[-1]
            except IndexError:
                continue
            quiet = now - max(_state.last, w.since)
            if worst is None or quiet > worst[0]:
                worst = (quiet, w, _state.names.get(ident, "?"))
        return worst

    def _moved(self, quiet: float) -> bool:
        """Bytes moved since the last look: progress. The ring's counter is
        read every tick (a load of a C counter), TCP's once a wait has been
        quiet for a tick (a look at this process's sockets)."""
        from research.comm.faults import traffic

        if self._own_bytes_moved(quiet, traffic):
            now = time.monotonic()
            _state.last = now
            if self.board is not None:
                self.board.moved(now)
            return True
        # A rank of this node moved the node's bytes for it (its leader).
        latest = self.board.latest() if self.board is not None else 0.0
        if latest > _state.last:
            _state.last = latest
            return True
        return False

    def _own_bytes_moved(self, quiet: float, traffic: Any) -> bool:
        ring = traffic.ring_bytes()
        if ring is not None and ring != self._ring_bytes:
            moved = self._ring_bytes is not None
            self._ring_bytes = ring
            if moved:
                return True
        if quiet < TICK_S:
            return False
        tcp = traffic.tcp_bytes()
        if tcp is None:
            return False
        if self._traffic_base is None:
            self._traffic_base = tcp
            return False
        (rx0, ack0), (rx, ack) = self._traffic_base, tcp
        if rx - rx0 >= traffic.MIN_RECEIVED or ack - ack0 >= traffic.MIN_ACKED:
            self._traffic_base = tcp
            return True
        return False

    # -- warn and fire ----------------------------------------------------------------
    def _warn(self, now: float, quiet: float, w: Watch, thread: str, timeout: float):
        if self._episode != _state.last:  # a new stall: ask, then say
            self._episode, self._asked_at = _state.last, now
            self._said_warning = False
            if self.rollcall is not None:
                self.rollcall.ask()
        if self._said_warning:
            return
        answered = self.rollcall is None or self.rollcall.complete()
        if not answered and now - self._asked_at < 3.0:
            return  # give the roll call a moment
        self._said_warning = True
        self.warnings += 1
        self._say(
            f"no progress for {quiet:.0f} s in {w.describe()} [{thread}]; "
            f"{self._peers(w)} (warning: the job ends after {timeout:.0f} s)"
        )

    def _fire(self, quiet: float, w: Watch, thread: str, timeout: float) -> None:
        self._fired = True
        peers = self._peers(w)
        message = (
            f"no progress for {quiet:.0f} s in {w.describe()} [{thread}]; {peers}: "
            f"ending the job (--comm-timeout {timeout:.0f} s, exit {EXIT_CODE})"
        )
        self._say(message)
        from research.comm.faults import failures

        failures.record(
            "comm-timeout",
            message,
            rank=self.rank,
            step=w.step,
            waits_in=w.what,
            quiet_s=round(quiet, 1),
        )
        (self.abort or os._exit)(EXIT_CODE)

    def _say(self, text: str) -> None:
        print(f"r{self.rank} | comm watchdog: {text}", file=sys.stderr, flush=True)
        self.log(said=text)

    def log(self, **fields: Any) -> None:
        """Append one line to ``$RESEARCH_WATCHDOG_LOG``, where it is set."""
        path = os.environ.get(LOG_ENV)
        if not path:
            return
        import json

        rec = {"pid": os.getpid(), "rank": self.rank, "size": self.size, **fields}
        rec["argv"] = " ".join(sys.argv)[:200]
        try:
            with open(path, "a") as f:
                f.write(json.dumps(rec) + "\n")
        except OSError:
            pass

    def _peers(self, w: Watch) -> str:
        """Whom the wait is for, in words: the ranks that did not answer the
        roll call or answered from elsewhere; the watch's own peers (the ring's
        neighbours, a server) where no roll call came back."""
        from research.comm.faults import traffic

        peers = list(w.peers) if w.peers is not None else None
        ring = traffic.ring_peers() if peers is None else None
        if ring is not None:
            peers = [ring[0]]  # the ring receives from prev: that is the wait
        answers = self.rollcall.answers() if self.rollcall is not None else None
        if answers is None:
            if peers is None:
                return "waits for every other rank (no roll call)"
            return f"waits for {_ranks(peers)} (no roll call)"
        others = [r for r in range(self.size) if r != self.rank]
        silent = [r for r in others if r not in answers]
        same = [r for r, a in answers.items() if a.get("waits") == w.what]
        elsewhere = [r for r, a in answers.items() if a.get("waits") != w.what]
        culprits = silent + elsewhere
        if not culprits:  # all wait in the same: the watch's peers, if known
            culprits = [p for p in peers or [] if p != self.rank]
        parts = []
        for r in sorted(set(culprits)):
            a = answers.get(r)
            if a is None:
                parts.append(f"r{r} (no answer)")
                continue
            where = f"in {a['waits']}" if a.get("waits") else "in no collective"
            parts.append(f"r{r} ({a.get('host', '?')}, step {a.get('step')}, {where})")
        text = "waits for " + (", ".join(parts) if parts else "no rank in particular")
        if same:
            text += f"; {_ranks(same)} {'waits' if len(same) == 1 else 'wait'} "
            text += "in the same"
        if silent:
            text += (
                f"; no answer to a roll call from {_ranks(silent)} within "
                f"{self.rollcall.window_s:.0f} s: unreachable, frozen or gone"
            )
        return text

    def status(self) -> dict[str, Any]:
        """What this rank tells a roll call: where it is."""
        now = time.monotonic()
        found = self._innermost(now)
        return {
            "host": socket.gethostname(),
            "step": _state.step,
            "waits": found[1].what if found else None,
            "quiet_s": round(found[0], 1) if found else None,
        }


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(f"r{r}" for r in sorted(ranks))


_dog: Watchdog | None = None
_lock = threading.Lock()


def start(comm: Any, abort: Callable[[int], None]) -> Watchdog | None:
    """Start this process's watchdog over ``comm`` (collective: a Dup for the
    roll call), once; None in a world of one. ``abort(code)`` ends the whole
    job when a wait stalls (:func:`research.comm.world.abort`, which passes
    itself: this module imports nothing of the world)."""
    global _dog
    with _lock:
        if _dog is not None or comm.Get_size() < 2:
            return _dog
        from research.comm.faults.rollcall import RollCall
        from research.comm.faults.traffic import NodeBoard

        dog = Watchdog(comm.Get_rank(), comm.Get_size(), abort=abort)
        dog.rollcall = RollCall(comm, dog.status)
        dog.board = NodeBoard(comm)
        dog.start()
        _dog = dog
        return dog


def get() -> Watchdog | None:
    """The running watchdog, if any."""
    return _dog


def configure(timeout: Any) -> None:
    """Set the timeout (``"auto"``, ``"off"``, seconds): see :func:`parse_timeout`.

    Every rank should set the same. Before any call, the watchdog takes
    ``RESEARCH_COMM_TIMEOUT`` from the environment (default ``auto``)."""
    setting = parse_timeout(timeout)
    if _dog is not None:
        _dog.setting = setting
        _state.on = setting is not None  # off: watches cost nothing at all


def note_step(seconds: float) -> None:
    """A training step took ``seconds`` (``auto`` follows the slowest)."""
    if _dog is not None and seconds > _dog.slowest_step:
        _dog.slowest_step = seconds


def record() -> dict[str, Any] | None:
    """This rank's watchdog figures (None when none runs)."""
    return _dog.record() if _dog is not None else None


def stop() -> None:
    """Stop the thread (before MPI_Finalize; registered at exit by world)."""
    global _dog
    with _lock:
        dog, _dog = _dog, None
    _state.on = False
    if dog is not None:
        dog.stop()
        dog.log(longest_quiet_s=round(dog.longest[0], 2), longest_in=dog.longest[1])
