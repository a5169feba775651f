"""The ``adaptive`` strategy's decisions: what each candidate costs, which to run.

Pure bookkeeping, no MPI: :mod:`research.comm.adaptive` gathers every rank's
figures of a window of steps, rank 0 feeds them to :meth:`Policy.decide`, and
the policy's whole state (:meth:`Policy.vector`) is broadcast, so every rank
holds the same state and switches at the same step.

What it decides from, the :class:`Estimate` of a window of steps, is defined
in :mod:`research.comm.adaptive_estimate`; the candidates and the plan are read
in :mod:`research.comm.adaptive_candidates` (both re-exported here).

Deciding, every ``interval`` steps of the running method (a *window*):

1. The guard: a top-k method whose ``lag`` exceeds ``max_lag`` is left for the
   dense one at once (its residual folded into the next gradient), and no
   top-k method is tried for ``cooldown`` windows. ``max_lag`` (10) bounds
   top-k's delay the way ``staleness`` (8 rounds) bounds the partial
   collectives', and the sparsest density bounds its sparsity.
2. Conditions changed: the window's cost or imbalance moved by more than the
   noise (``max(margin x cost, 2 standard errors)``) from the previous
   window's, or its communication did (beyond 2 standard errors and 1% of the
   step: by the margin of the step, or to twice or half what it was, which
   is how a link's new rate shows under top-k, which sends little); every
   other estimate is then stale. Between decisions, each step of a
   synchronous method is checked against its estimate: off by more than
   ``JUMP`` (25%) and 4 standard errors on any rank (agreed by a one-number
   allreduce started after the step and read before the next) twice in a
   row, and the decision comes at once, from those two steps.
3. Probes: each other candidate that has no estimate, a stale one, or one
   older than the refresh period is run for ``probe_steps`` steps (after one
   warm-up step) and measured. Partial collectives are probed only when the
   ranks are imbalanced (``imbalance > margin x cost``). The refresh period
   starts at ``refresh`` steps and doubles (up to ``max_refresh``) each time a
   probe round keeps the method that ran before it.
4. The choice, after a probe round: the cheapest candidate, unless a candidate
   listed before it (candidates are listed from the most to the least
   accurate: dense, top-k from dense to sparse, majority, solo) costs no more
   than the cheapest plus the noise of the two; then the first such. So it
   leaves a more accurate method only for one cheaper by more than the noise,
   and comes back to it once it is within the noise again.

A ``plan`` (``"host@0,sparse:0.01@40"``) replaces steps 2-4 with fixed switches
at fixed steps (tests, reproductions); the guard still runs and overrides it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from research.comm.adaptive_candidates import (  # noqa: F401 - re-exported
    DENSE,
    KINDS,
    PARTIAL,
    SPARSE,
    Candidate,
    check_text_options,
    parse_candidates,
    parse_plan,
)
from research.comm.adaptive_estimate import Estimate, Window, estimate  # noqa: F401

RUN, PROBE = 0, 1
#: A step this far off its method's estimate (relative) is anomalous.
JUMP = 0.25


@dataclass
class Decision:
    """A decision's outcome: ``to`` (a candidate index) or None to stay."""

    step: int
    to: int | None
    reason: str  # "probe", "choice", "guard", "plan", "" (no switch)
    why: str
    estimates: dict[str, Any] = field(default_factory=dict)


class Policy:
    """The decision state machine (module docstring); identical on every rank.

    Args:
      candidates: from :func:`parse_candidates`.
      interval, probe_steps, refresh, max_refresh, margin, max_lag, cooldown:
        as the strategy's options of the same names.
      plan: from :func:`parse_plan` (empty: decide by measurement).
    """

    HEADER = (
        "current", "phase", "window_start", "stale_before", "refresh_now",
        "cooldown_until", "back", "queue", "switches", "probes", "guard_fired",
        "switch_s", "ref_cost", "ref_se", "ref_comm", "ref_comm_se", "ref_imbalance",
    )  # fmt: skip
    PER = (*Estimate.FIELDS, "seconds", "steps")

    def __init__(
        self,
        candidates: list[Candidate],
        *,
        interval: int,
        probe_steps: int,
        refresh: int,
        max_refresh: int,
        margin: float,
        max_lag: float,
        cooldown: int,
        plan: list[tuple[int, int]] = (),
    ) -> None:
        self.candidates = list(candidates)
        self.labels = [c.label for c in candidates]
        self.dense = next(i for i, c in enumerate(candidates) if c.kind == DENSE)
        self.interval, self.probe_steps = int(interval), int(probe_steps)
        self.refresh, self.max_refresh = int(refresh), int(max_refresh)
        self.margin, self.max_lag, self.cooldown = margin, max_lag, int(cooldown)
        self.plan = list(plan)
        first = [i for s, i in self.plan if s == 0]
        self.current = first[0] if first else self.dense
        self.phase = RUN
        self.window_start = 0
        self.stale_before = 0
        self.refresh_now = self.refresh
        self.cooldown_until = -1
        self.back = self.current
        self.queue: list[int] = []
        self.switches = self.probes = self.guard_fired = 0
        self.switch_s = 0.0
        self.ref = Estimate()
        self.est = [Estimate() for _ in candidates]
        self.seconds = [0.0] * len(candidates)
        self.steps = [0] * len(candidates)

    # -- when -------------------------------------------------------------------------
    def window_length(self) -> int:
        return self.probe_steps + 1 if self.phase == PROBE else self.interval

    def due(self, step: int) -> bool:
        """Whether a decision falls at the start of ``step`` (every rank alike)."""
        if step == 0:
            return False
        if any(s == step for s, _ in self.plan):
            return True
        return step - self.window_start >= self.window_length()

    def account(self, seconds: float) -> None:
        """One step of the running method took ``seconds`` (this rank's)."""
        self.seconds[self.current] += seconds
        self.steps[self.current] += 1

    # -- what -------------------------------------------------------------------------
    def anomalous(self, seconds: float) -> bool:
        """Whether a step of the running method that took ``seconds`` is off
        its estimate by more than ``JUMP`` of it and 4 standard errors (False
        where no early decision applies: a probe, a partial collective, no
        estimate yet). Two agreed such steps in a row bring the decision
        forward (:meth:`decide` with ``early``)."""
        e = self.est[self.current]
        return self.watching() and abs(seconds - e.cost) > max(JUMP * e.cost, 4 * e.se)

    def watching(self) -> bool:
        """Whether steps are checked for :meth:`anomalous` now: a run window
        of a synchronous method with an estimate (the same on every rank)."""
        if self.phase != RUN or self.plan or not self.est[self.current].known:
            return False
        return self.candidates[self.current].kind != PARTIAL

    def decide(self, step: int, windows: list[Window], early: bool = False) -> Decision:
        """Fold in the window's figures and decide what runs from ``step`` on.

        ``early``: brought forward by two anomalous steps (the windows hold
        only those): conditions changed, whatever the window says.
        """
        cur = self.current
        before = self.est[cur]
        est = estimate(windows, step)
        if est.known:
            self.est[cur] = est
        planned = [i for s, i in self.plan if s == step]
        # A probe round goes on after a trip (the method is then not chosen).
        if self._guard_trips(cur, est, step) and (self.phase == RUN or not self.queue):
            return self._finish(
                step,
                self.dense,
                "guard",
                f"{self.labels[cur]}'s residual holds {est.lag:.1f} gradients "
                f"> max_lag {self.max_lag:g}: dense for "
                f"{self.cooldown} windows",
            )
        if planned:
            to = planned[0]
            if self.candidates[to].kind == SPARSE and step < self.cooldown_until:
                to = self.dense
            return self._finish(step, to, "plan", "the plan")
        if self.plan:
            self._restart(step)
            return self._stay(step)
        if self.phase == PROBE:
            if self.queue:
                return self._probe_next(step)
            return self._choose(step)
        changed = self._changed(est)
        if early and before.known and est.known:
            changed = (
                f"step {before.cost * 1e3:.1f} -> {est.cost * 1e3:.1f} ms for "
                f"{len(windows[0].step_s)} steps"
            )
        self.ref = est if est.known else self.ref
        if changed:
            self.stale_before = step
            self.refresh_now = self.refresh
        queue = self._to_probe(step, est)
        if queue:
            self.phase, self.back, self.queue = PROBE, cur, queue
            return self._probe_next(step, changed)
        self._restart(step)
        return self._stay(step)

    def _guard_trips(self, cur: int, est: Estimate, step: int) -> bool:
        if self.candidates[cur].kind != SPARSE or not est.lag > self.max_lag:
            return False
        self.guard_fired += 1
        self.cooldown_until = step + self.cooldown * self.interval
        return True

    def _noise(self, a: Estimate, b: Estimate) -> float:
        return max(self.margin * a.cost, 2 * math.hypot(a.se, b.se))

    def _changed(self, est: Estimate) -> str:
        ref = self.ref
        if not (est.known and ref.known):
            return ""
        tol = self.margin * ref.cost
        moved = []
        if abs(est.cost - ref.cost) > self._noise(ref, est):
            moved.append(f"step {ref.cost * 1e3:.1f} -> {est.cost * 1e3:.1f} ms")
        # Communication: by more than the noise and by 1% of the step, and
        # either by the margin of the step or twice or half what it was (the
        # link's rate under a method that sends little).
        d_comm = abs(est.comm - ref.comm)
        low, high = sorted((est.comm, ref.comm))
        real = d_comm > max(0.01 * ref.cost, 2 * math.hypot(est.comm_se, ref.comm_se))
        if real and (d_comm > tol or high >= 2 * low):
            moved.append(f"comm {ref.comm * 1e3:.1f} -> {est.comm * 1e3:.1f} ms")
        if abs(est.imbalance - ref.imbalance) > tol:
            moved.append(
                f"imbalance {ref.imbalance * 1e3:.1f} -> {est.imbalance * 1e3:.1f} ms"
            )
        return ", ".join(moved)

    def _to_probe(self, step: int, est: Estimate) -> list[int]:
        imbalanced = est.known and est.imbalance > self.margin * est.cost
        out = []
        for i, c in enumerate(self.candidates):
            e = self.est[i]
            if i == self.current:
                continue
            if c.kind == SPARSE and step < self.cooldown_until:
                continue
            if c.kind == PARTIAL and not imbalanced:
                continue
            if (
                not e.known
                or e.at < self.stale_before
                or step - e.at >= self.refresh_now
            ):
                out.append(i)
        return out

    def _probe_next(self, step: int, changed: str = "") -> Decision:
        to = self.queue.pop(0)
        self.phase = PROBE
        self.probes += 1
        why = f"probe {self.probe_steps} steps"
        if changed:
            why += f" (conditions changed: {changed})"
        elif not self.est[to].known:
            why += " (never measured)"
        else:
            why += f" (last measured at step {self.est[to].at})"
        return self._finish(step, to, "probe", why, keep_phase=True)

    def _considered(self, step: int) -> list[int]:
        cur_est = self.est[self.current]
        imbalanced = cur_est.known and cur_est.imbalance > self.margin * cur_est.cost
        out = []
        for i, c in enumerate(self.candidates):
            e = self.est[i]
            if not e.known or e.at < self.stale_before:
                continue
            if step - e.at > self.refresh_now + self.interval:
                continue
            if c.kind == SPARSE and step < self.cooldown_until:
                continue
            if c.kind == PARTIAL and not imbalanced and i != self.back:
                continue
            out.append(i)
        return out or [self.back]

    def _choose(self, step: int) -> Decision:
        considered = self._considered(step)
        best = min(considered, key=lambda i: self.est[i].cost)
        b = self.est[best]
        pick = next(
            i
            for i in sorted(considered)
            if self.est[i].cost <= b.cost + self._noise(b, self.est[i])
        )
        p = self.est[pick]
        if pick == best:
            why = f"cheapest: {self.labels[pick]} {p.ms()}"
        else:
            why = (
                f"{self.labels[pick]} {p.ms()} within noise "
                f"{self._noise(b, p) * 1e3:.1f} ms of the cheapest, "
                f"{self.labels[best]} {b.ms()}"
            )
        if pick != self.back and self.est[self.back].known:
            saved = self.est[self.back].cost - p.cost
            if saved > 0:
                why += (
                    f"; {saved * 1e3:.1f} ms/step cheaper than {self.labels[self.back]}"
                )
        self.refresh_now = (
            min(2 * self.refresh_now, self.max_refresh)
            if pick == self.back
            else self.refresh
        )
        self.ref = Estimate()
        return self._finish(step, pick, "choice", why)

    # -- outcomes ---------------------------------------------------------------
    def _restart(self, step: int) -> None:
        self.window_start = step

    def _stay(self, step: int) -> Decision:
        return Decision(step, None, "", "", self.table(step))

    def _finish(
        self, step: int, to: int, reason: str, why: str, keep_phase: bool = False
    ) -> Decision:
        if not keep_phase:
            self.phase, self.queue = RUN, []
        self._restart(step)
        if to == self.current:
            return Decision(step, None, reason, why, self.table(step))
        if reason != "probe":
            self.ref = Estimate()
        self.current = to
        self.switches += 1
        return Decision(step, to, reason, why, self.table(step))

    def table(self, step: int) -> dict[str, Any]:
        """Every candidate's latest estimate (ms, for the log and metrics)."""
        out = {}
        for label, e in zip(self.labels, self.est):
            if e.known:
                out[label] = {
                    "ms": round(e.cost * 1e3, 3),
                    "se_ms": round(e.se * 1e3, 3),
                    "comm_ms": round(e.comm * 1e3, 3),
                    "imbalance_ms": round(e.imbalance * 1e3, 3),
                    "age": step - e.at,
                    **({"lag": round(e.lag, 3)} if math.isfinite(e.lag) else {}),
                }
        return out

    # -- state ------------------------------------------------------------------
    def vector(self) -> np.ndarray:
        """The whole state as a fixed-length float64 vector (checkpoints)."""
        # The queue is always in candidate order: a bit mask keeps it.
        mask = sum(1 << i for i in self.queue)
        head = [getattr(self, n) for n in self.HEADER[:7]]
        head += [mask, self.switches, self.probes, self.guard_fired]
        head += [self.switch_s]
        head += [getattr(self.ref, f) for f in ("cost", "se", "comm", "comm_se")]
        head += [self.ref.imbalance]
        rows = [
            [*(getattr(e, f) for f in Estimate.FIELDS), s, n]
            for e, s, n in zip(self.est, self.seconds, self.steps)
        ]
        return np.asarray(head + [x for r in rows for x in r], np.float64)

    def load(self, vec: Any) -> None:
        """Take the state :meth:`vector` gave (on any rank, or from a checkpoint)."""
        v = np.asarray(vec, np.float64)
        n = len(self.HEADER) + len(self.PER) * len(self.candidates)
        if v.shape != (n,):
            raise ValueError(
                f"adaptive: a state of {v.size} numbers for {len(self.candidates)} "
                f"candidates (want {n}): resumed with other candidates?"
            )
        h = dict(zip(self.HEADER, v[: len(self.HEADER)].tolist()))
        for name in ("current", "phase", "window_start", "stale_before"):
            setattr(self, name, int(h[name]))
        for name in ("refresh_now", "cooldown_until", "back"):
            setattr(self, name, int(h[name]))
        mask = int(h["queue"])
        self.queue = [i for i in range(len(self.candidates)) if mask >> i & 1]
        self.switches, self.probes = int(h["switches"]), int(h["probes"])
        self.guard_fired, self.switch_s = int(h["guard_fired"]), h["switch_s"]
        self.ref = Estimate(
            h["ref_cost"], h["ref_se"], h["ref_comm"], h["ref_comm_se"],
            h["ref_imbalance"], math.nan, 0 if math.isfinite(h["ref_cost"]) else -1,
        )  # fmt: skip
        rows = v[len(self.HEADER) :].reshape(len(self.candidates), len(self.PER))
        for i, row in enumerate(rows.tolist()):
            vals = dict(zip(self.PER, row))
            e = {f: vals[f] for f in Estimate.FIELDS}
            e["at"] = int(e["at"])
            self.est[i] = Estimate(**e)
            self.seconds[i], self.steps[i] = vals["seconds"], int(vals["steps"])

    def summary(self) -> dict[str, Any]:
        """Time and steps in each method (this rank's), switches, probes, guard."""
        return {
            "seconds": dict(zip(self.labels, self.seconds)),
            "steps": dict(zip(self.labels, self.steps)),
            "switch_s": self.switch_s,
            "switches": self.switches,
            "probes": self.probes,
            "guard_fired": self.guard_fired,
            "final": self.labels[self.current],
            # The latest estimate of each candidate, its age at the last one.
            "estimates": self.table(max(e.at for e in self.est)),
        }
