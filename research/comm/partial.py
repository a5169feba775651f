"""Partial allreduce: the solo and majority collectives of eager-SGD.

Li, Ben-Nun, Di Girolamo, Alistarh, Hoefler, *Taming Unbalanced Training Workloads
in Deep Learning with Partial Collective Operations*, PPoPP'20.

Usage::

    with PartialAllreduce(world.comm, mode="solo", full_every=32) as pa:
        for step in range(n):
            avg, info = pa.reduce(grads)      # avg: round result, sum / P
            ...
        rest, info = pa.drain()               # what missed its round, delivered

Semantics (exact)
-----------------
* Calls and rounds. The n-th ``reduce`` call of a rank (n = 1, 2, ...) hands in
  gradient g_n and returns the result of round n. Rounds run 1, 2, 3, ... on every
  rank in the same order on a private duplicate of ``comm``; the result of a round
  is the sum of every rank's contribution divided by P (not by the number of
  contributors), and every rank applies the identical sequence of round results,
  so replicas never drift.
* Contribution. When round r runs, each rank contributes everything it holds: g_r
  if ``reduce`` call r has already handed it in (a *fresh* gradient), plus every
  gradient that missed its own round (*carried*), or zeros. A gradient that missed
  its round goes into the next round this rank takes part in, so every gradient
  computed is applied exactly once (see ``drain``).
* solo: the first rank whose call r arrives activates round r; the others join at
  once with what they hold. The activator waits only for the round's
  communication. A rank that arrives after round r ran takes its result at once.
* majority: round r's initiator is ``initiator(r)``, drawn from an RNG seeded
  identically on all ranks (no messages). Only the initiator's arrival activates
  round r. An early non-initiator hands in g_r (which is then fresh) and waits for
  the round; a late one takes its result at once.
* Bounded staleness. With ``full_every=K`` every K-th round (r % K == 0) is a
  *full* round: every rank waits for its own call r, so everything carried is
  delivered there and a gradient is never applied more than K-1 rounds late
  (``info.extra["full"]`` marks such a round; "sync" names only the strategy).
  ``K=1`` or ``mode="sync"`` makes every round synchronous, i.e. a plain allreduce
  of the gradients divided by P. ``full_every=None`` never forces a round.
* ``drain()`` counts as the next call: a synchronous round with no fresh
  gradient that delivers whatever any rank still carries, returning ``(tree,
  info)`` (zeros when nothing was carried). ``close()`` runs one more synchronous
  round that stops the background task and frees the communicator; it warns if
  that round had to deliver carried gradients (call ``drain`` first to apply them).
  Every rank must make the same number of ``reduce`` calls before ``drain`` or
  ``close``; a mismatch is detected in the round and raised on every rank.
* A fast rank may run ahead: rounds it activates run with the slow ranks' carried
  gradients or zeros, and the slow ranks' results wait in a queue (at most K
  rounds with ``full_every=K``) until their own calls take them.

How it runs
-----------
The rounds run on the rank's shared progress thread
(``research.comm.asynchronous.progress``) as a polled task: each poll advances a small
state machine (await activation -> Iallreduce -> collect the activation messages)
without ever blocking in MPI; between polls the thread sleeps (woken at once by a local
``reduce``) and polls the other subsystems' tasks, such as asynchronous handles,
alongside.

Activation in a partial round: a rank whose own call arrived first (solo) or the
initiator (majority) sends a tiny activation message tagged with the round to
every other rank; a rank that sees one (``Improbe``) joins. Several solo ranks
may activate the same round at the same moment; each round's Iallreduce also
sums a one-hot vector of activators, so after it every rank receives exactly the
activation messages that were sent to it and none is ever left unreceived.
Messages of round r+1 carry another tag, so rounds never mix. The buffer is one
flat float32 array (float64 when any leaf is), fresh each round. Fresh buffers
make the first round after a stretch of small transfers 1.2-1.8x slower over
TCP (``scripts.bench_first_round``; what was tried instead: ``docs/journal.md``).

With an emulated ``link`` (:mod:`research.comm.link`), a round's result is held
on the progress thread, sleeping, until the ring-allreduce model of its buffer
has passed since this rank issued the round's Iallreduce; the tiny activation
messages are not modelled. ``info.extra["emulated_s"]`` is the time added.
"""

from __future__ import annotations

import atexit
import threading
import time
import warnings
import weakref
from typing import Any, Literal

import numpy as np
from mpi4py import MPI

from research.comm.asynchronous.progress import get_progress
from research.comm.dense.fusion import FlatLayout
from research.comm.faults import watchdog
from research.comm.info import CommInfo
from research.comm.link import Link
from research.comm.partial_rounds import (
    _DRAIN,
    _REDUCE,
    _STOP,
    _WAIT,
    Rounds,
    RoundTask,
    _Deposit,
    _Round,
)

Mode = Literal["solo", "majority", "sync"]
MODES = ("solo", "majority", "sync")


class PartialAllreduce(Rounds):
    """Solo / majority partial allreduce of a pytree (see module docstring).

    Args:
      comm: an ``MPI.Intracomm`` or a ``World``; duplicated here (collective), so
        every rank must construct its instances in the same order.
      mode: ``"solo"``, ``"majority"`` or ``"sync"``.
      seed: seed of the majority initiator sequence (same on every rank).
      full_every: every ``full_every``-th round is full, every rank's own
        gradient in it (None: never).
      max_sleep: longest sleep between tests while awaiting activation, seconds.
      link: an emulated link (a :class:`Link` or a spec such as ``"10gbps"``;
        ``"real"``: none).
    """

    def __init__(
        self,
        comm: Any,
        mode: Mode = "solo",
        seed: int = 0,
        full_every: int | None = 32,
        *,
        max_sleep: float = 5e-4,
        link: Link | str | None = "real",
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if full_every is not None and full_every < 1:
            raise ValueError(f"full_every must be >= 1 or None, got {full_every}")
        base = getattr(comm, "comm", comm)  # a World carries its communicator
        self._comm: MPI.Intracomm = base.Dup()
        self._comm.Set_name(f"research.partial.{mode}")
        self.rank, self.size = self._comm.Get_rank(), self._comm.Get_size()
        self.mode, self.seed, self.full_every = mode, int(seed), full_every
        self._max_sleep = max_sleep
        self.link = Link.parse(link)
        # Shared between the compute thread and the background task.
        self._cond = threading.Condition()
        self._inbox: list[_Deposit] = []
        self._done: dict[int, _Round] = {}
        self._error: BaseException | None = None
        self._calls = 0
        self._closed = False
        self._abandoned = False
        self._resting = False  # polled rarely until this rank's next call
        self._stopped = threading.Event()
        self._layout: FlatLayout | None = None  # of this rank's trees
        self._n: int | None = None
        self._dtype: np.dtype | None = None
        # Background state: touched by the progress thread only.
        self._round = 1
        self._phase = _WAIT
        self._rec_header = np.zeros(3, np.int64)
        self._consumed_from = -1
        self._i_activated = False
        self._full_round = False
        # Activation sends and drain receives, with the buffers they use.
        self._pending: list[tuple[MPI.Request, np.ndarray]] = []
        self._req: MPI.Request | None = None
        self._buf: np.ndarray | None = None
        self._recv: np.ndarray | None = None
        self._my_calls: tuple[int, ...] = ()
        self._kind = _REDUCE
        self._t_act = 0.0
        self._emul_until = 0.0  # the emulated link's end of the running round
        self._real_done: float | None = None
        _OPEN.add(self)
        get_progress().add(RoundTask(self))

    # -- public -------------------------------------------------------------------
    def initiator(self, r: int) -> int:
        """Round ``r``'s majority initiator: identical on every rank, no messages."""
        return int(np.random.default_rng((self.seed, int(r))).integers(self.size))

    def is_full_round(self, r: int) -> bool:
        """True when round ``r`` is full by schedule (not counting drain)."""
        return self.mode == "sync" or (
            self.full_every is not None and r % self.full_every == 0
        )

    @property
    def calls(self) -> int:
        """Calls made so far (``reduce`` and ``drain``): the last round taken."""
        return self._calls

    def reduce(self, tree: Any) -> tuple[Any, CommInfo]:
        """Hand in this step's gradients; return round ``n``'s result and a record.

        Args:
          tree: a pytree of jax or numpy float arrays, the same structure each call.

        Returns:
          ``(avg, info)``: ``avg`` has the structure of ``tree`` (numpy arrays of the
          leaves' dtypes) and holds the round's sum divided by P; ``info.round`` is
          the round, ``info.contributors`` the ranks whose fresh gradient is in it,
          ``info.staleness`` the age in rounds of the oldest gradient of this rank
          in it (0: fresh or none), ``info.wait_s`` how long this call waited,
          ``info.extra["fresh"]`` whether this call's own gradient made the round.
        """
        self._set_layout(tree)
        call, rec, waited = self._hand_in(_REDUCE, self._layout.pack(tree))
        return self._unpack(rec.total), self._info(call, rec, waited)

    def drain(self) -> tuple[Any, CommInfo]:
        """Run a synchronous round that delivers every carried gradient.

        Collective: every rank calls it after the same number of ``reduce`` calls.
        Returns the round's ``(tree, info)``; ``info.extra["carried_total"]`` is how
        many late gradients (over all ranks) it delivered (0: the tree is zeros).
        """
        if self._layout is None:
            raise RuntimeError("drain() before any reduce(): nothing to drain")
        call, rec, waited = self._hand_in(_DRAIN, None)
        return self._unpack(rec.total), self._info(call, rec, waited)

    def take_carried(self, flat: bool = False) -> tuple[Any, int] | None:
        """Take back this rank's gradients that missed their rounds, instead of
        a round delivering them: ``(tree, count)`` (the tree their sum, not
        divided by P; ``flat``: the sum as one vector, the leaves in tree
        order) or None. Local, no round: for a caller that leaves this
        collective for a while and applies them another way (the adaptive
        strategy folds them into the next method's gradient). Call it between
        calls, when every rank has made the same number of calls and none
        makes another before every rank has taken back (no round can start).
        """
        with self._cond:
            self._raise_if_failed()
            mine = [d for d in self._inbox if d.kind == _REDUCE]
            self._inbox = [d for d in self._inbox if d.kind != _REDUCE]
        if not mine:
            return None
        total = np.array(mine[0].flat[: self._n])
        for d in mine[1:]:
            total += d.flat[: self._n]
        return (total if flat else self._layout.unpack(total)), len(mine)

    def rest(self, resting: bool = True) -> None:
        """Poll for a peer's round rarely (every ``REST_SLEEP``) until this
        rank's next call: for a caller that leaves this collective for a
        while, whose idle polling would cost CPU. A round a peer starts
        meanwhile is joined up to that much later; ``rest(False)`` ends the
        rest at once (every rank about to call again), waking the thread."""
        self._resting = resting
        if not resting:
            get_progress().wake()

    def close(self) -> None:
        """Stop the background task after a final synchronous round. Collective.

        Idempotent. Gradients still carried are dropped with a warning: call
        :meth:`drain` first to apply them.
        """
        if self._closed:
            return
        if self._error is None and not self._abandoned and self._n is not None:
            _, rec, _ = self._hand_in(_STOP, None)
            if rec.carried_total:
                warnings.warn(
                    f"PartialAllreduce.close() dropped {rec.carried_total} "
                    "carried gradients; call drain() first",
                    stacklevel=2,
                )
        elif self._n is None and self._error is None and not self._abandoned:
            # Never used on this rank: stop without a round. Every rank is in the
            # same state (none called reduce), so no activation can be pending.
            self._abandon()
            self._comm.Free()
        else:
            self._abandon()
        self._closed = True
        _OPEN.discard(self)

    def __enter__(self) -> PartialAllreduce:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:
            # Another rank may not reach a collective close: stop locally only.
            self._abandon()
            self._closed = True
            _OPEN.discard(self)
        else:
            self.close()

    # -- compute-thread side --------------------------------------------------------
    def _set_layout(self, tree: Any) -> None:
        if self._layout is None:
            layout = FlatLayout(tree)
            with self._cond:
                self._layout, self._n, self._dtype = layout, layout.n, layout.wire
        elif not self._layout.matches(tree):
            raise ValueError(
                "reduce() got a tree of another structure or shape than its first call"
            )

    def _hand_in(self, kind: str, flat: np.ndarray | None) -> tuple[int, _Round, float]:
        if self._closed:
            raise RuntimeError("PartialAllreduce is closed")
        with self._cond:
            self._raise_if_failed()
            self._resting = False
            self._calls += 1
            call = self._calls
            self._inbox.append(_Deposit(call, flat, kind))
            get_progress().wake()
            t0 = time.perf_counter()
            with watchdog.watch(f"{self.mode} round {call}", detail=kind):
                while call not in self._done:
                    self._raise_if_failed()
                    self._cond.wait(0.5)
            rec = self._done.pop(call)
            if rec.kind != kind:
                # A peer's reduce() ran this round as a partial one before this
                # rank's drain()/close() reached it.
                self._error = RuntimeError(
                    f"{kind}() met round {call} run as a partial round: every rank "
                    "must make the same number of reduce() calls before "
                    "drain()/close()"
                )
                self._raise_if_failed()
        return call, rec, time.perf_counter() - t0

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(
                f"partial allreduce failed in the background: {self._error}"
            ) from self._error
        if self._abandoned:
            raise RuntimeError("PartialAllreduce was shut down")

    def _unpack(self, total: np.ndarray) -> Any:
        return self._layout.unpack(total, divide=self.size)

    def _info(self, call: int, rec: _Round, waited: float) -> CommInfo:
        staleness = call - min(rec.my_calls) if rec.my_calls else 0
        extra = {
            "fresh": call in rec.my_calls,
            "carried": sum(1 for c in rec.my_calls if c != call),
            "carried_total": rec.carried_total,
            # Mean lateness over every rank's gradients in the round (0: all fresh).
            "mean_age": rec.age_total / max(1, rec.fresh + rec.carried_total),
            "activators": rec.activators,
            "activated": rec.i_activated,
            "full": rec.full,
            "kind": rec.kind,
            "round_s": rec.seconds,
            "emulated_s": rec.emulated_s,
        }
        return CommInfo(
            bytes=int(rec.total.nbytes),
            contributors=rec.fresh,
            staleness=staleness,
            wait_s=waited,
            round=rec.round,
            extra=extra,
        )


# Instances still open at interpreter exit are stopped locally before mpi4py's
# own atexit handler (registered earlier, so it runs later) finalizes MPI: a
# background task inside an MPI call would otherwise race MPI_Finalize.
_OPEN: weakref.WeakSet[PartialAllreduce] = weakref.WeakSet()


@atexit.register
def _abandon_open() -> None:
    for pa in list(_OPEN):
        pa._abandon()
