"""What each candidate of the ``adaptive`` strategy would cost now: a fitted model.

Pure bookkeeping on agreed figures (every rank feeds the same stamps, so
every rank predicts the same): no MPI, no numpy, plain floats.

A step of candidate ``k`` is modelled as::

    arrivals   the ranks' times to their gradient (computation and any delay),
               the last ``WINDOW`` steps as measured, whatever method ran
    comm_k     = alpha_k + c_k * wire_k * beta          (seconds per step)
    other_k    what else a step of k costs (top-k's selection, the update, ...):
               each rank's step less its arrival and its wait, as measured

    synchronous (dense, top-k):  mean over steps of the latest arrival
                                 + comm_k + other_k
    partial (majority, solo):    the ranks' clocks replayed over the arrivals
                                 (:func:`replay`: solo never waits, majority
                                 waits for its round's initiator, every
                                 ``staleness``-th round waits for all)
                                 + comm_k + other_k

* ``beta`` is the link's seconds per byte, one number for every candidate,
  read each step from the running synchronous candidate's own transfer (its
  bytes and seconds) through its fit: ``(comm - alpha_k) / (c_k wire_k)``
  (a partial collective's waits hold the others' lateness: not read). A
  :class:`~research.strategies.adaptive.changepoint.ChangePoint` on that series
  takes a new rate at its second step. The series goes on across switches on
  one scale (start-up's): top-k's wait for messages, once read as the link
  itself, put the link on another scale each time top-k ran (2 to 3 times
  its rate's change at 4 ranks on 2 cores, where that wait holds the others'
  lateness), and the others were then predicted at the wrong link for good;
* ``alpha_k`` (latency and the collective's own CPU work, which no link
  changes; below 0 where two rates' line says so: :meth:`Fit.comm`) and
  ``c_k`` (how its bytes use the link; 1 to begin with) are the candidate's
  own, fitted from the pairs (link, seconds) it was measured at: at start-up
  (every candidate's collective once, at the first rate) and in its first two
  steps after each switch (at the link the previous candidate last saw; not
  when the link moved as the switch landed: :meth:`CostModel._landed`); with
  pairs at two rates both are fitted, else ``alpha_k`` alone;
* ``wire_k``: the bytes one rank moves per step (a ring allreduce moves
  ``2 (P - 1) / P`` of its buffer; top-k what it sent);
* ``other_k`` is what the candidate's measured steps took beyond their
  arrival and their wait (median over ranks, then over its last ``RECENT``
  steps), kept from its last run: a new link rate never shows in it;
* a partial candidate's replay is multiplied by its measured pace over the
  replayed one, from its last ``staleness`` steps (between 0.25 and 4; back
  to 1 when the lateness changes);
* the fixed part and the other work are CPU work: they are scaled by how much
  slower the computation runs now than when they were measured (the quickest
  rank's arrival, a median over the last steps), so a core that other work
  took over is not mistaken for a slower link.

A candidate's prediction for its own next step is checked against the step
(the model's error); :mod:`research.strategies.adaptive.policy` decides from the
predictions and probes only when that error stays above a bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from research.strategies.adaptive.changepoint import ChangePoint

#: Steps of arrivals the model keeps (since the last change in lateness).
WINDOW = 24
#: Pairs (link, seconds) kept per candidate.
PAIRS = 4
#: Link estimates this far apart (ratio) fit alpha and c apart.
SPREAD = 2.0
#: Steps whose other work (median) is a candidate's ``other``.
RECENT = 8


@dataclass
class Fit:
    """One candidate's communication and the rest of its step (module doc)."""

    alpha: float = math.nan
    c: float = 1.0
    wire: float = math.nan  # bytes per step on the link, this rank
    other: float = math.nan  # seconds per step beyond arrivals and comm
    scale: float = 1.0  # a partial candidate's measured pace / its replay
    level: float = math.nan  # the computation's speed alpha and other are at
    at: int = -1  # the step it was last measured at (-1: never)
    pairs: list[tuple[float, float]] = field(default_factory=list)
    recent: list[float] = field(default_factory=list)  # its last others

    @property
    def known(self) -> bool:
        return math.isfinite(self.alpha) and math.isfinite(self.wire)

    def comm(self, beta: float, cpu: float = 1.0) -> float:
        """Seconds at ``beta``, the fixed part at ``cpu`` x its speed. A fixed
        part below 0 (two rates' line: the link's own latency is not linear
        in its rate) is no CPU work: it is not scaled, and below the rates
        seen the line is not followed under the slowest pair's seconds per
        byte."""
        if self.alpha >= 0:
            return self.alpha * cpu + self.c * self.wire * beta
        line = self.alpha + self.c * self.wire * beta
        x0, y0 = min(self.pairs, default=(beta, line))
        return max(line, y0 * beta / x0) if x0 > 0 else line

    def implied(self, seconds: float, cpu: float = 1.0) -> float:
        """The link (seconds per byte) at which this fit takes ``seconds``."""
        if not self.known or self.c * self.wire <= 0:
            return math.nan
        fixed = self.alpha * cpu if self.alpha >= 0 else self.alpha
        return max(seconds - fixed, 1e-3 * seconds) / (self.c * self.wire)

    def add_pair(self, beta: float, seconds: float) -> None:
        """A measurement at a known link; refit alpha (and c, given the spread).
        Two rates give the line through them (its fixed part may fall below 0:
        :meth:`comm`)."""
        if not (math.isfinite(beta) and beta > 0 and math.isfinite(seconds)):
            return
        self.pairs = [p for p in self.pairs if abs(p[0] / beta - 1) > 0.1]
        self.pairs = (self.pairs + [(beta, seconds)])[-PAIRS:]
        xs = [b * self.wire for b, _ in self.pairs]
        ys = [s for _, s in self.pairs]
        if len(xs) >= 2 and max(xs) >= SPREAD * min(xs):
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            sxx = sum((x - mx) ** 2 for x in xs)
            c = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
            if c > 0:
                self.c, self.alpha = c, my - c * mx
                return
        self.alpha = max(0.0, seconds - self.c * self.wire * beta)


def replay(
    arrivals: list[list[float]], per_step: float, full_every: int, mode: str,
    first_round: int = 1,
) -> float:  # fmt: skip
    """Seconds per step of a partial collective over these arrivals.

    Each rank's clock advances by its arrival and ``per_step`` (communication
    and the rest of the step); ``solo`` never waits for another rank,
    ``majority`` waits for its round's initiator when it arrives first (the
    initiator drawn as the strategy draws it, here from the round number),
    ``sync`` waits for every rank, and every ``full_every``-th round (round
    numbers from ``first_round``) waits for every rank. The pace is the
    slowest clock over the steps (the ranks meet at every full round).
    """
    if not arrivals:
        return math.nan
    P = len(arrivals[0])
    t = [0.0] * P
    for i, row in enumerate(arrivals):
        r = first_round + i
        ready = [t[q] + row[q] for q in range(P)]
        if mode == "sync" or (full_every and r % full_every == 0):
            m = max(ready)
            t = [m + per_step] * P
        elif mode == "majority":
            ini = _initiator(r, P)
            t = [max(ready[q], ready[ini]) + per_step for q in range(P)]
        else:  # solo
            t = [ready[q] + per_step for q in range(P)]
    return max(t) / len(arrivals)


def _initiator(r: int, P: int) -> int:
    # A fixed stand-in for the seeded draw: any rank equally often.
    return (r * 2654435761) % (2**32) % P


class CostModel:
    """Predicted seconds per step of every candidate (module docstring).

    Args:
      kinds: each candidate's kind, ``"dense"``, ``"sparse"`` or ``"partial"``.
      modes: each candidate's partial mode (``"solo"``, ``"majority"``) or
        ``"sync"``.
      size: ranks.
      staleness: the partial collectives' full round every this many rounds.
    """

    def __init__(
        self, kinds: list[str], modes: list[str], size: int, staleness: int
    ) -> None:
        self.kinds, self.modes = list(kinds), list(modes)
        self.size, self.staleness = int(size), int(staleness)
        self.fits = [Fit() for _ in kinds]
        self.beta = math.nan
        self.link = ChangePoint(window=3, rel=0.2)
        self.lateness = ChangePoint(window=3, rel=0.5)
        self.arrivals: list[list[float]] = []
        self.first = 1  # the round number of arrivals[0] (for the replay)
        self.speeds: list[float] = []  # the quickest rank's arrival, last steps
        self._seed_comm: dict[int, float] = {}  # start-up's, until anchored
        #: The newest link sample's side (+1, -1) when out of its band, else 0.
        self.moving = 0.0
        #: A switch's first step (link, seconds) until its second's.
        self.held = [math.nan] * 2

    @property
    def speed(self) -> float:
        """The computation's pace now: the median of the quickest rank's
        arrival over the last ``RECENT`` steps (a straggler is never the
        quickest; more load on the cores, or less, shows here)."""
        return _median(self.speeds) if self.speeds else math.nan

    def cpu(self, f: Fit) -> float:
        """How much slower (> 1) the cores work now than when ``f`` was fitted."""
        now = self.speed
        if math.isfinite(now) and math.isfinite(f.level) and f.level > 0:
            return now / f.level
        return 1.0

    def wire_factor(self, k: int) -> float:
        """Bytes on the link per byte handed in: a ring moves 2 (P - 1) / P."""
        P = self.size
        return 1.0 if self.kinds[k] == "sparse" else 2 * (P - 1) / max(P, 1)

    # -- what was measured -------------------------------------------------------
    def seed(self, k: int, comm: float, nbytes: float, other: float) -> None:
        """Start-up: candidate ``k``'s collective took ``comm`` seconds for
        ``nbytes`` bytes (at the first rate); ``other`` its other work."""
        f = self.fits[k]
        f.wire = nbytes * self.wire_factor(k)
        f.other = other
        f.pairs, f.at = [], 0
        f.alpha = comm  # until beta is known (the dense candidate sets it)
        self._seed_comm[k] = comm

    def anchor(self, dense: int, latency: float, transfer: dict | None = None) -> None:
        """Start-up: the link. From a candidate's pure transfer time where one
        says it (``transfer``: candidate -> seconds waiting for messages, top-k's
        sparse allreduce): its bytes over it; else from the dense candidate's
        collective, taking ``latency`` (a tiny message's time) as its own fixed
        part. Every candidate's fixed part is then what its collective took
        beyond its bytes at that link."""
        known = {
            k: t for k, t in (transfer or {}).items() if t > 0 and self.fits[k].wire > 0
        }
        f = self.fits[dense]
        if known:
            k, t = min(known.items(), key=lambda kv: kv[1] / self.fits[kv[0]].wire)
            self.beta = t / self.fits[k].wire
        elif f.wire > 0:
            comm = self._seed_comm[dense]
            self.beta = max(comm - latency, 1e-6 * comm) / f.wire
        else:
            # One rank: no byte crosses a link, and each candidate's time is its
            # fixed part (add_pair keeps the seed for a link of 0).
            self.beta = 0.0
        for k, c in self._seed_comm.items():
            self.fits[k].add_pair(self.beta, c)

    def observe(
        self, k: int, step: int, arrivals: list[float], comm: float,
        nbytes: float, other: float, fresh: int,
    ) -> str:  # fmt: skip
        """One agreed step of the running candidate ``k``: every rank's arrival,
        its communication (the least exposed wait of a synchronous collective,
        the longest of a partial one; NaN for a partial collective's full round,
        which says nothing of the link), bytes handed in, and the rest of the
        step (its seconds less arrival and wait, median over ranks).
        ``fresh``: 1, 2, ... for the first measured steps after a switch (their
        seconds fit ``k`` at the link last seen, :meth:`_landed`), 0 after
        them (their seconds are read as the link).
        Returns what changed (``"lateness"``, ``"link"``), "" for nothing.
        """
        changed = []
        measured = math.isfinite(comm)  # else no link in it (a full round)
        self.speeds = (self.speeds + [min(arrivals)])[-RECENT:]
        for g in self.fits:  # start-up's figures: at the first steps' speed
            if g.known and not math.isfinite(g.level):
                g.level = self.speed
        late = max(arrivals) - _median(arrivals)
        step_s = max(arrivals) + (comm + max(other, 0.0) if measured else 0.0)
        if self.lateness.add(late, floor=0.05 * step_s):
            # Only the arrivals since the change: the steps the rule saw move.
            kept = int(self.lateness.n) - 1
            self.arrivals = self.arrivals[-kept:] if kept > 0 else []
            for g in self.fits:  # a replay's bias was learnt at the old lateness
                g.scale = 1.0
            changed.append("lateness")
        self.arrivals.append(list(arrivals))
        if len(self.arrivals) > WINDOW:
            self.arrivals.pop(0)
        self.first = step - len(self.arrivals) + 1
        f = self.fits[k]
        f.at = step
        if nbytes > 0:
            f.wire = nbytes * self.wire_factor(k)
        if not measured:  # a full round: its fresh pair is lost, not mixed up
            if fresh:
                self.held, self.moving = [math.nan] * 2, 0.0
            return ",".join(changed)
        cpu = self.cpu(f)
        # The link's rule follows the link itself (seconds per byte, as this
        # candidate's fit reads its seconds, the CPU part at today's speed):
        # one series across switches, on one scale whichever candidate runs.
        # A move of less than a tenth of the step without its lateness (the
        # policy's margin) is none.
        base = min(arrivals) + comm + max(other, 0.0)
        floor = 0.1 * base / (f.c * f.wire) if f.known and f.wire > 0 else 0.0
        # A partial collective's waits hold the others' lateness (its round's
        # initiator, a straggler's round): read as the link, a straggler
        # became a slow link (4 ranks, 2026-11-28). Its own pace is followed
        # by its replay's scale; the link, by the next synchronous candidate.
        reads = self.kinds[k] != "partial"
        if fresh:  # the fit learns from these: they say nothing of the link
            if self._landed(f, fresh, comm, cpu) and reads:
                self.beta = f.implied(comm, cpu)
                self.link.reset([self.beta])
                changed.append("link")
            f.level = self.speed
        elif not reads:
            self.moving = 0.0
        elif f.known and f.c * f.wire > 0:
            if self.link.add(f.implied(comm, cpu), floor=floor):
                changed.append("link")
            self.moving = self.link.drift(floor)
            self.beta = self.link.level
        if fresh == 1:
            f.recent = []
        # Other work in the units of the fixed part's speed.
        f.recent = (f.recent + [max(other, 0.0) / self.cpu(f)])[-RECENT:]
        f.other = _median(f.recent)  # one slow step moves nothing
        return ",".join(changed)

    def _landed(self, f: Fit, fresh: int, comm: float, cpu: float) -> bool:
        """A switch's first measured steps (``fresh`` 1, 2): whether the link
        moved as the switch landed, and their pairs (link, seconds) for ``f``
        when it did not. The pairs assume the link the previous candidate
        last saw; a switch often follows a move that its rule has not yet
        declared (its newest sample out of its band, :attr:`moving`), or the
        link moves between the two steps. Then the seconds are the link's: the
        fit is kept and the link read from it (no pair), else the new link
        would be taken as the candidate's fixed part and stay in it."""
        if fresh == 1:
            moving, self.moving = self.moving, 0.0
            self.held = [self.beta, comm]
            want = f.comm(self.beta, cpu)
            off = comm - want
            if moving and off * moving > 0.3 * want:
                self.held = [0.0, math.nan]  # no pairs this switch
                return True
            return False
        held_beta, held_comm = self.held
        self.held = [math.nan] * 2
        if held_beta == 0.0:
            return False  # moved at the first step: read from the fit
        if math.isfinite(held_comm) and abs(comm - held_comm) > 0.5 * min(
            comm, held_comm
        ):
            return True  # between the two steps: neither is a pair
        f.add_pair(held_beta, held_comm)
        f.add_pair(self.beta, comm)
        return False

    def rescale(self, k: int, measured: float, replayed: float) -> None:
        """A partial candidate's measured pace against its replay over the same
        steps (unscaled): the replay's bias, kept and applied to it."""
        if self.kinds[k] == "partial" and replayed > 0 and measured > 0:
            self.fits[k].scale = min(max(measured / replayed, 0.25), 4.0)

    # -- what it predicts ----------------------------------------------------------
    def predict(self, k: int, scaled: bool = True) -> float:
        """Seconds per step of candidate ``k`` now (NaN: not enough known);
        ``scaled``: a partial candidate's replay times its measured bias."""
        f = self.fits[k]
        if not (f.known and math.isfinite(self.beta) and self.arrivals):
            return math.nan
        cpu = self.cpu(f)
        o = f.other * cpu if math.isfinite(f.other) else 0.0
        per = max(f.comm(self.beta, cpu), 0.0) + o
        mode = self.modes[k]
        if self.kinds[k] == "partial":
            pace = replay(self.arrivals, per, self.staleness, mode, self.first)
            return pace * (f.scale if scaled else 1.0)
        latest = sum(max(row) for row in self.arrivals) / len(self.arrivals)
        return latest + per

    def lateness_now(self) -> float:
        """Mean over the window of (latest - median arrival), seconds."""
        if not self.arrivals:
            return math.nan
        return sum(max(r) - _median(r) for r in self.arrivals) / len(self.arrivals)

    # -- state -------------------------------------------------------------------
    def state(self) -> list[float]:
        """Every number as a flat list of a fixed length (checkpoints)."""
        speeds = self.speeds + [math.nan] * (RECENT - len(self.speeds))
        out = [self.beta, float(self.first), float(len(self.arrivals)), *speeds]
        out += [self.moving, *self.held]
        rows = self.arrivals + [[math.nan] * self.size] * (WINDOW - len(self.arrivals))
        out += [x for r in rows for x in r]
        out += self.link.state() + self.lateness.state()
        for f in self.fits:
            pairs = f.pairs + [(math.nan, math.nan)] * (PAIRS - len(f.pairs))
            recent = f.recent + [math.nan] * (RECENT - len(f.recent))
            out += [f.alpha, f.c, f.wire, f.other, f.scale, f.level, float(f.at)]
            out += recent
            out += [x for p in pairs for x in p]
        return out

    def load(self, values: list[float]) -> None:
        """Take what :meth:`state` gave."""
        v = list(values)
        self.beta, self.first, n = v[0], int(v[1]), int(v[2])
        self.speeds = [x for x in v[3 : 3 + RECENT] if math.isfinite(x)]
        i = 3 + RECENT
        self.moving, self.held = v[i], list(v[i + 1 : i + 3])
        i += 3
        rows = [v[i + j * self.size : i + (j + 1) * self.size] for j in range(WINDOW)]
        self.arrivals = [list(r) for r in rows[:n]]
        i += WINDOW * self.size
        for cp in (self.link, self.lateness):
            m = 4 + cp.window
            cp.load(v[i : i + m])
            i += m
        for f in self.fits:
            f.alpha, f.c, f.wire, f.other, f.scale, f.level = v[i : i + 6]
            f.at = int(v[i + 6])
            i += 7
            f.recent = [x for x in v[i : i + RECENT] if math.isfinite(x)]
            i += RECENT
            flat = v[i : i + 2 * PAIRS]
            f.pairs = [
                (flat[2 * j], flat[2 * j + 1])
                for j in range(PAIRS)
                if math.isfinite(flat[2 * j])
            ]
            i += 2 * PAIRS

    def length(self) -> int:
        return len(self.state())


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
