"""The ``adaptive`` strategy's decisions: which candidate runs each step.

Pure bookkeeping, no MPI. Every rank feeds the same agreed *stamps* (each
rank's figures of a step, exchanged by :mod:`research.strategies.adaptive.stamps`)
to its own :class:`Policy`, in the same order, so every rank takes the same
decisions at the same step without a message of their own.

Each step (:meth:`Policy.observe`, then :meth:`Policy.decide`):

1. The model (:mod:`research.strategies.adaptive.model`) takes the running
   candidate's step: every rank's arrival, its communication and bytes, its
   seconds. Its change-point rules say when the lateness (a straggler came or
   went) or the link's rate changed.
2. The guard: a top-k candidate whose residual holds more than ``max_lag``
   gradients' worth of update (measured every ``interval`` steps) is left for
   the dense one, and no top-k candidate runs for ``cooldown`` x ``interval``
   steps. For the first ``dense_steps`` steps only the dense candidate runs.
3. Time to progress: every candidate's predicted seconds per step, divided by
   what a step of it achieves, ``1 / (1 + delay_cost x delay)``, ``delay``
   being how many steps late its gradients are applied on average (top-k: the
   residual's lag, the guard's figure; partial: the rounds' mean age; dense:
   0). Unmeasured delays count as 1 (top-k) and 0.5 (partial).
4. The choice: the candidate of least score, when it beats the running one's
   by more than ``margin`` (``UNRUN`` x that for a candidate not yet run,
   whose prediction rests on start-up's figures alone) and the running one
   has had its steps measured
   (``settle`` steps after a switch; a partial candidate's figures come
   ``staleness`` steps late).
5. Probes: the model's error, the running candidate's predicted steps
   against its measured ones over the last ``staleness`` steps (a partial
   collective's steps differ one by one, its full rounds wait: only their mean
   is its pace), is followed; when it stays above ``error_bound`` for
   ``patience`` steps with no change to explain it, the model is not trusted:
   the candidate of next-best score runs for ``probe_steps`` steps, its own
   figures refit its model, and the choice is made again. Each probe is
   counted, with its steps' seconds.

A ``plan`` (``"host@0,sparse:0.01@40"``) replaces 3-5 with fixed switches
(tests, reproductions); the guard still runs and overrides it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from research.strategies.adaptive.candidates import (  # noqa: F401 - re-exported
    DENSE,
    KINDS,
    PARTIAL,
    SPARSE,
    Candidate,
    check_text_options,
    parse_candidates,
    parse_plan,
)
from research.strategies.adaptive.model import CostModel
from research.strategies.adaptive.stamp import FIELDS, Stamp

#: Unmeasured delays (steps) of a top-k and a partial candidate.
PRIOR_DELAY = {DENSE: 0.0, SPARSE: 1.0, PARTIAL: 0.5}
#: Steps after a switch not used by the model (the switch, compilation).
SKIP = 1
#: Steps after those whose seconds fit the new candidate at the old link.
FRESH = 2
#: A candidate not yet run must beat the running one by this many margins.
UNRUN = 1.5


@dataclass
class Decision:
    """A decision's outcome: ``to`` (a candidate index) or None to stay."""

    step: int
    to: int | None
    reason: str  # "model", "probe", "guard", "plan", "dense", "" (no switch)
    why: str
    estimates: dict[str, Any] = field(default_factory=dict)


class Policy:
    """The decisions (module docstring); identical on every rank.

    Args:
      candidates: from :func:`parse_candidates`.
      size: ranks.
      staleness: the partial candidates' full round every this many rounds.
      margin, error_bound, patience, probe_steps, settle, max_lag, cooldown,
        interval, dense_steps, delay_cost: the strategy's options.
      plan: from :func:`parse_plan` (empty: decide from the model).
    """

    HEADER = (
        "current", "since", "measured", "probe_left", "back", "cooldown_until",
        "switches", "probes", "probe_s", "guard_fired", "mispredicted",
        "switch_s", "err", "err_high", "last_change",
    )  # fmt: skip
    PER = ("seconds", "steps", "delay")

    def __init__(
        self,
        candidates: list[Candidate],
        *,
        size: int,
        staleness: int = 8,
        margin: float = 0.1,
        error_bound: float = 0.3,
        patience: int = 20,
        probe_steps: int = 3,
        settle: int = 3,
        max_lag: float = 10.0,
        cooldown: int = 5,
        interval: int = 20,
        dense_steps: int = 10,
        delay_cost: float = 0.02,
        plan: list[tuple[int, int]] = (),
    ) -> None:
        self.candidates = list(candidates)
        self.labels = [c.label for c in candidates]
        self.dense = next(i for i, c in enumerate(candidates) if c.kind == DENSE)
        self.size, self.staleness = int(size), int(staleness)
        self.margin, self.error_bound = float(margin), float(error_bound)
        self.patience, self.probe_steps = int(patience), int(probe_steps)
        self.settle, self.max_lag = int(settle), float(max_lag)
        self.cooldown, self.interval = int(cooldown), int(interval)
        self.dense_steps, self.delay_cost = int(dense_steps), float(delay_cost)
        self.plan = list(plan)
        modes = [c.strategy if c.kind == PARTIAL else "sync" for c in candidates]
        self.model = CostModel(
            [c.kind for c in candidates], modes, self.size, self.staleness
        )
        first = [i for s, i in self.plan if s == 0]
        self.current = first[0] if first else self.dense
        self.since = 0  # the step the current candidate started at
        self.measured = 0  # its steps the model has taken
        self.probe_left = 0
        self.back = self.current
        self.cooldown_until = -1
        self.switches = self.probes = self.guard_fired = self.mispredicted = 0
        self.probe_s = self.switch_s = 0.0
        self.err, self.err_high, self.last_change = 0.0, 0, -1
        self.seconds = [0.0] * len(candidates)
        self.steps = [0] * len(candidates)
        self.delay = [math.nan] * len(candidates)
        self.events: list[dict[str, Any]] = []
        self._guard_lag = math.nan  # the newest top-k lag, for the next decide
        #: (measured, predicted, replayed unscaled) of the last steps.
        self._recent: list[tuple[float, float, float]] = []
        #: Whether :meth:`observe` returns a ``kind: "model"`` row per step too
        #: (what the model took and predicted; rank 0 of the Trainer's).
        self.record = False

    # -- what the steps measured -----------------------------------------------
    def lag_of(self, step: int) -> int:
        """How many steps late the stamps of ``step``'s candidate are read: 1
        for a synchronous one, ``staleness`` for a partial one (its ranks run
        apart; the full rounds bound how far)."""
        partial = self.candidates[self.current].kind == PARTIAL
        return self.staleness if partial else 1

    def measure_lag(self, step: int) -> bool:
        """Whether the guard's figure is measured at ``step`` (top-k running,
        every ``interval`` steps of it)."""
        c = self.candidates[self.current]
        n = step - self.since
        return c.kind == SPARSE and n > 0 and n % self.interval == 0

    def account(self, seconds: float) -> None:
        """One step of the running candidate took ``seconds`` (this rank's)."""
        self.seconds[self.current] += seconds
        self.steps[self.current] += 1
        if self.probe_left > 0:
            self.probe_s += seconds

    def observe(self, rows: list[list[float]]) -> list[dict[str, Any]]:
        """Every rank's stamp of one step, in rank order; returns the events
        (a change the model saw, also kept in :attr:`events`; with
        :attr:`record`, a row of what the model took and now predicts)."""
        st = [Stamp(*r) for r in rows]
        step, k = int(st[0].step), int(st[0].method)
        if any(int(s.step) != step or int(s.method) != k for s in st):
            raise RuntimeError(
                "adaptive: the ranks' stamps disagree on the step or the method: "
                + ", ".join(f"{int(s.step)}/{int(s.method)}" for s in st)
            )
        c = self.candidates[k]
        lags = [s.lag for s in st if math.isfinite(s.lag)]
        if lags:
            self.delay[k] = max(lags)
            self._guard_lag = max(lags)
        ages = [s.age for s in st if math.isfinite(s.age)]
        if ages:
            a = sum(ages) / len(ages)
            d = self.delay[k]
            self.delay[k] = a if not math.isfinite(d) else 0.9 * d + 0.1 * a
        carried = int(sum(s.carried for s in st if math.isfinite(s.carried)))
        events = []
        if carried:  # gradients a switch carried over, all ranks together
            events.append({"kind": "carry", "step": step, "gradients": carried})
        n = step - int(st[0].since)
        if n < SKIP or k != self.current and int(st[0].since) != self.since:
            self.events += events
            return events  # compilation, the switch itself, or an older candidate
        comms = [s.comm for s in st]
        comm = max(comms) if c.kind == PARTIAL else min(comms)
        if any(s.full > 0 for s in st):  # a full round waited for the last rank
            comm = math.nan
        total = sum(s.total for s in st) / len(st)
        other = _median([s.total - s.arrive - s.comm for s in st])
        if not math.isfinite(comm):
            other = math.nan
        pred, raw = self.model.predict(k), self.model.predict(k, scaled=False)
        fresh = n - SKIP + 1 if n < SKIP + FRESH else 0  # 1, 2: fit k
        changed = self.model.observe(
            k, step, [s.arrive for s in st], comm, max(s.bytes for s in st),
            other, fresh,
        )  # fmt: skip
        self.measured += 1
        if changed:  # the steps before it are another regime's: not compared
            self.last_change, self._recent, self.err = step, [], 0.0
            for what in changed.split(","):
                events.append(self._event(step, what, k))
        elif math.isfinite(pred) and total > 0:
            self._recent = (self._recent + [(total, pred, raw)])[-self.staleness :]
            measured = sum(r[0] for r in self._recent)
            self.err = abs(measured - sum(r[1] for r in self._recent)) / measured
            if len(self._recent) >= self.staleness:
                self.model.rescale(k, measured, sum(r[2] for r in self._recent))
            if n == SKIP + FRESH and self.err > self.error_bound:
                self.mispredicted += 1  # a switch's (or start's) prediction
        full = len(self._recent) >= self.staleness
        high = full and self.err > self.error_bound
        self.err_high = self.err_high + 1 if high else 0
        self.events += events
        if self.record:
            predicted = {
                label: round(self.model.predict(i) * 1e3, 3)
                for i, label in enumerate(self.labels)
            }
            events = events + [{
                "kind": "model", "step": step, "method": self.labels[k],
                "arrive_ms": [round(s.arrive * 1e3, 3) for s in st],
                "comm_ms": round(comm * 1e3, 3), "other_ms": round(other * 1e3, 3),
                "total_ms": round(total * 1e3, 3),
                "predicted_ms": {k2: v for k2, v in predicted.items() if v == v},
                "error": round(self.err, 4),
            }]  # fmt: skip
        return events

    def _event(self, step: int, what: str, k: int) -> dict[str, Any]:
        m = self.model
        if what == "link":  # and what the running candidate's transfer takes now
            comm = m.fits[k].comm(m.beta, m.cpu(m.fits[k]))
            return {"kind": "change", "step": step, "what": "link",
                    "comm_ms": round(comm * 1e3, 3),
                    "ns_per_byte": round(m.beta * 1e9, 4)}  # fmt: skip
        return {"kind": "change", "step": step, "what": "lateness",
                "lateness_ms": round(m.lateness.level * 1e3, 3)}  # fmt: skip

    # -- what runs next ---------------------------------------------------------
    def efficiency(self, i: int) -> float:
        """What a step of candidate ``i`` achieves against a dense step."""
        c = self.candidates[i]
        d = self.delay[i] if math.isfinite(self.delay[i]) else PRIOR_DELAY[c.kind]
        return 1.0 / (1.0 + self.delay_cost * (0.0 if c.kind == DENSE else d))

    def score(self, i: int) -> float:
        """Predicted seconds per dense step's worth of progress (NaN: unknown)."""
        return self.model.predict(i) / self.efficiency(i)

    def decide(self, step: int) -> Decision:
        """What runs at ``step`` (call once per step, after :meth:`observe`)."""
        cur = self.current
        c = self.candidates[cur]
        lag, self._guard_lag = self._guard_lag, math.nan
        if c.kind == SPARSE and lag > self.max_lag:
            self.guard_fired += 1
            self.cooldown_until = step + self.cooldown * self.interval
            why = (
                f"{self.labels[cur]}'s residual holds {lag:.1f} gradients > "
                f"max_lag {self.max_lag:g}: dense for {self.cooldown} x "
                f"{self.interval} steps"
            )
            return self._switch(step, self.dense, "guard", why)
        planned = [i for s, i in self.plan if s == step]
        if planned:
            to = planned[0]
            if self.candidates[to].kind == SPARSE and step < self.cooldown_until:
                to = self.dense
            return self._switch(step, to, "plan", "the plan")
        if self.plan or step < self.dense_steps:
            return self._stay(step)
        if self.probe_left > 0:
            self.probe_left -= 1
            if self.probe_left > 0:
                return self._stay(step)
        settle = self.settle + (self.staleness if c.kind == PARTIAL else 0)
        if step - self.since < settle:
            return self._stay(step)
        allowed = [
            i for i, k in enumerate(self.candidates)
            if not (k.kind == SPARSE and step < self.cooldown_until)
        ]  # fmt: skip
        scores = {i: self.score(i) for i in allowed}
        known = {i: s for i, s in scores.items() if math.isfinite(s)}
        if cur not in allowed:  # a top-k candidate in the guard's cooldown
            return self._switch(step, self.dense, "guard", "top-k cooling down")
        if not known or cur not in known:
            return self._stay(step)
        ranked = sorted(known, key=lambda i: known[i])
        best = ranked[0]
        if self.err_high >= self.patience and step - self.last_change >= self.patience:
            other = next((i for i in ranked if i != cur), None)
            if other is not None:
                self.probes += 1
                self.probe_left = self.probe_steps + SKIP
                self.err_high = 0
                why = (
                    f"the model's error {self.err:.0%} > {self.error_bound:.0%} "
                    f"for {self.patience} steps: {self.labels[other]} measured "
                    f"for {self.probe_steps} steps"
                )
                return self._switch(step, other, "probe", why)
        # A candidate never run is predicted from start-up's figures only.
        margin = self.margin * (UNRUN if self.steps[best] == 0 else 1.0)
        if best != cur and known[best] < known[cur] * (1 - margin):
            why = (
                f"{self.labels[best]} {known[best] * 1e3:.1f} ms/step-of-progress "
                f"against {self.labels[cur]} {known[cur] * 1e3:.1f}"
            )
            return self._switch(step, best, "model", why)
        return self._stay(step)

    def _stay(self, step: int) -> Decision:
        return Decision(step, None, "", "")

    def _switch(self, step: int, to: int, reason: str, why: str) -> Decision:
        if to == self.current:
            return Decision(step, None, reason, why, self.table(step))
        self.back, self.current = self.current, to
        self.since, self.measured = step, 0
        self.switches += 1
        self.err, self.err_high, self._recent = 0.0, 0, []
        return Decision(step, to, reason, why, self.table(step))

    def table(self, step: int) -> dict[str, Any]:
        """Every candidate's prediction (ms/step), efficiency and score."""
        out = {}
        for i, label in enumerate(self.labels):
            p = self.model.predict(i)
            if math.isfinite(p):
                f = self.model.fits[i]
                out[label] = {
                    "ms": round(p * 1e3, 3),
                    "comm_ms": round(f.comm(self.model.beta) * 1e3, 3),
                    "efficiency": round(self.efficiency(i), 4),
                    "age": step - f.at if f.at >= 0 else None,
                }
                if math.isfinite(self.delay[i]):
                    out[label]["delay"] = round(self.delay[i], 3)
        return out

    # -- state ------------------------------------------------------------------
    def vector(self) -> list[float]:
        """The whole state as a flat list of a fixed length (checkpoints)."""
        head = [float(getattr(self, n)) for n in self.HEADER]
        rows = [
            x
            for s, n, d in zip(self.seconds, self.steps, self.delay)
            for x in (s, n, d)
        ]
        return head + rows + self.model.state()

    def length(self) -> int:
        return (
            len(self.HEADER)
            + len(self.PER) * len(self.candidates)
            + len(self.model.state())
        )

    #: What only this rank measured (its own seconds), left out of :meth:`agreed`.
    LOCAL = ("probe_s", "switch_s")

    def agreed(self) -> list[float]:
        """The state every rank holds alike: :meth:`vector` without this
        rank's own seconds (a test that the ranks agree compares it)."""
        head = [float(getattr(self, n)) for n in self.HEADER if n not in self.LOCAL]
        rows = [x for n, d in zip(self.steps, self.delay) for x in (n, d)]
        return head + rows + self.model.state()

    def load(self, vec: Any) -> None:
        """Take the state :meth:`vector` gave (on any rank, or from a checkpoint)."""
        v = [float(x) for x in vec]
        if len(v) != self.length():
            raise ValueError(
                f"adaptive: a state of {len(v)} numbers for {len(self.candidates)} "
                f"candidates at {self.size} ranks (want {self.length()}): resumed "
                "with other candidates or ranks?"
            )
        h = dict(zip(self.HEADER, v[: len(self.HEADER)]))
        for name in self.HEADER:
            value = h[name]
            setattr(
                self,
                name,
                value if name in ("probe_s", "switch_s", "err") else int(value),
            )
        i = len(self.HEADER)
        for j in range(len(self.candidates)):
            self.seconds[j], self.steps[j], self.delay[j] = (
                v[i],
                int(v[i + 1]),
                v[i + 2],
            )
            i += 3
        self.model.load(v[i:])

    def summary(self) -> dict[str, Any]:
        """Time and steps in each candidate (this rank's), switches, probes
        (count and seconds), the model's mispredicted switches, the guard."""
        last = max((f.at for f in self.model.fits), default=0)
        return {
            "seconds": dict(zip(self.labels, self.seconds)),
            "steps": dict(zip(self.labels, self.steps)),
            "switch_s": self.switch_s,
            "switches": self.switches,
            "probes": self.probes,
            "probe_s": self.probe_s,
            "mispredicted": self.mispredicted,
            "guard_fired": self.guard_fired,
            "final": self.labels[self.current],
            "changes": [e for e in self.events if e.get("kind") == "change"],
            "estimates": self.table(last),
        }


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


__all__ = ["FIELDS", "Decision", "Policy", "Stamp"]
