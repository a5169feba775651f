"""The ``adaptive`` strategy: dense, top-k sparse or partial, chosen while it trains.

::

    avg = research.averaging("adaptive", world, densities="0.01,0.001")
    for step in ...:
        grads = grad_fn(params, batch)
        grads, info = avg(grads)          # info.extra["method"]: what ran
        params, opt = apply(params, opt, grads)

or ``experiments.train --strategy adaptive``. It runs one of its candidates at a
time, the existing strategies themselves: ``host`` (the dense allreduce),
``sparse`` at each of ``densities`` (top-k with error feedback), ``majority``
and ``solo`` (eager-SGD's partial collectives, staleness bounded by
``staleness``). It predicts what each would cost now from a model fitted to
the running one's own steps (the link's rate, each rank's lateness) and
switches to the one that makes progress fastest
(:mod:`research.comm.adaptive.policy` says how, :mod:`.model` what is
fitted). Every rank stamps every step with its figures; the stamps are
exchanged (:mod:`.exchange`) and every rank decides alike from them.

A switch carries what the old method had not delivered into the new one
(:mod:`.carry`): top-k's error-feedback residual (handed to another density,
or added to the next method's first gradient), the gradients a partial
collective carried (taken back and added likewise), so every computed
gradient is applied exactly once; every candidate keeps its buffers and
communicators for the whole run, so a switch costs no set-up.

Options (``--strategy-opt KEY=VALUE``; ranges checked before launch):

* ``candidates``: ``host,sparse,majority,solo`` (``host`` required);
* ``densities``: top-k densities, ``0.01``;
* ``margin``: least relative gain (time to progress) a switch needs, 0.1;
* ``settle``: measured steps of a method before it is left, 3;
* ``error_bound``, ``patience``, ``probe_steps``: the model is not trusted
  when its error stays above 0.3 for 20 steps; a probe then runs the next
  best candidate for 3 steps;
* ``delay_cost``: what a step whose gradients are applied one step late is
  worth less, 0.02; ``dense_steps``: dense only for the first 10 steps;
* ``max_lag``, ``cooldown``, ``interval``: the guard: top-k is left when its
  residual holds more than 10 gradients' worth of update (measured every 20
  steps of it), for 5 x 20 steps;
* ``staleness``: the partial collectives' full round every this many rounds, 8;
* ``plan``: fixed switches instead of the model's, ``host@0,sparse:0.01@40``;
* ``allreduce``, ``seed``, ``link``: as for ``host``, ``majority``, all.
* ``refresh``, ``max_refresh``: before 2026-11-28 the period of re-probing;
  accepted and unused (the model predicts instead).

Each switch is one line on rank 0 and a row ``kind: "switch"`` in
``metrics.jsonl`` (each change the model saw a row ``kind: "change"``), a span
on the timeline's ``strategy`` track; ``summary.json`` gives the time and steps
in each method, the switches, the probes and their seconds.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Literal

from research.comm.adaptive.call import AdaptiveCall
from research.comm.adaptive.carry import Folded, add_trees  # noqa: F401 - re-exported
from research.comm.adaptive.exchange import Exchange
from research.comm.adaptive.policy import (
    DENSE,
    PARTIAL,
    SPARSE,
    Candidate,
    Decision,
    Policy,
    parse_candidates,
    parse_plan,
)
from research.comm.base import Averager
from research.comm.registry import get_averager, register_averager
from research.comm.sparse.strategy import SparseAverager
from research.comm.world import as_world
from research.options import Range


@register_averager("adaptive")
class AdaptiveAverager(Averager):
    """Chooses among dense, top-k and partial averaging as it trains.

    See the module docstring for the options; the Trainer runs it on the
    ``adaptive`` executor (``research/train/adaptive.py``), a user's loop
    through ``research.averaging("adaptive", ...)``.
    """

    executor = "adaptive"
    name = "adaptive"
    #: Parses candidates, densities and plan before launch (numpy only).
    options_check = "research.comm.adaptive.candidates:check_text_options"
    option_ranges = {
        "margin": Range(ge=0.0, le=1.0),
        "settle": Range(ge=1, le=10**6),
        "error_bound": Range(gt=0.0, le=10.0),
        "patience": Range(ge=1, le=10**6),
        "probe_steps": Range(ge=1, le=10**4),
        "delay_cost": Range(ge=0.0, le=10.0),
        "dense_steps": Range(ge=0, le=10**9),
        "max_lag": Range(ge=1e-6, le=1e12),
        "cooldown": Range(ge=0, le=10**6),
        "interval": Range(ge=1, le=10**6),
        "staleness": Range(ge=1, le=10**4),
        "refresh": Range(ge=1, le=10**8),
        "max_refresh": Range(ge=1, le=10**8),
        "seed": Range(ge=0),
    }

    @classmethod
    def averaging(cls, world: Any, **options: Any) -> Any:
        """``research.averaging("adaptive", ...)``: :class:`AdaptiveCall`."""
        return AdaptiveCall(cls(world, **options))

    def __init__(
        self,
        world: Any,
        *,
        candidates: str = "host,sparse,majority,solo",
        densities: str | float = "0.01",
        margin: float = 0.1,
        settle: int = 3,
        error_bound: float = 0.3,
        patience: int = 20,
        probe_steps: int = 3,
        delay_cost: float = 0.02,
        dense_steps: int = 10,
        max_lag: float = 10.0,
        cooldown: int = 5,
        interval: int = 20,
        staleness: int = 8,
        plan: str = "",
        allreduce: Literal["auto", "ring", "mpi", "hierarchical", "xla"] = "auto",
        seed: int = 0,
        link: str = "real",
        refresh: int | None = None,
        max_refresh: int | None = None,
    ) -> None:
        given = dict(
            margin=margin, settle=settle, error_bound=error_bound,
            patience=patience, probe_steps=probe_steps, delay_cost=delay_cost,
            dense_steps=dense_steps, max_lag=max_lag, cooldown=cooldown,
            interval=interval, staleness=staleness,
        )  # fmt: skip
        for key, value in given.items():
            bounds = self.option_ranges[key]
            if not bounds.contains(value):
                raise ValueError(f"adaptive: {key}={value!r} must be {bounds}")
        if refresh is not None or max_refresh is not None:
            _note_unused()
        self.world = world = as_world(world)
        self.size, self.rank = world.size, world.rank
        # ``--strategy-opt densities=0.01`` arrives as a number.
        self.cands: list[Candidate] = parse_candidates(candidates, str(densities))
        labels = [c.label for c in self.cands]
        self.policy = Policy(
            self.cands, size=self.size, plan=parse_plan(plan, labels), **given
        )
        self.staleness, self.seed, self.link = staleness, seed, link
        self._allreduce = allreduce
        self.comm = world.dup("adaptive")
        self.exchange = Exchange(self.comm)
        # Every candidate for the whole run: a switch sets nothing up.
        self.children: dict[str, Averager] = {
            c.label: self._make(c) for c in self.cands
        }
        self._dense = self.children[self.cands[self.policy.dense].label]
        partial = [c.strategy for c in self.cands if c.kind == PARTIAL]
        # research.train.preemption.lag_for: how far apart the ranks may run.
        self.pa = types.SimpleNamespace(
            mode=partial[0] if partial else "sync", full_every=staleness
        )

    # -- the candidates -------------------------------------------------------------
    def candidate(self, label: str) -> Candidate:
        return self.cands[self.policy.labels.index(label)]

    def child(self, label: str) -> Averager:
        """The candidate's averager."""
        return self.children[label]

    def _make(self, c: Candidate) -> Averager:
        if c.kind == SPARSE:
            return SparseAverager(
                self.world, density=c.density, seed=self.seed, link=self.link
            )
        if c.kind == DENSE:
            return get_averager(
                "host", self.world, allreduce=self._allreduce, link=self.link
            )
        return get_averager(
            c.strategy, self.world, seed=self.seed, full_every=self.staleness,
            link=self.link,
        )  # fmt: skip

    @property
    def current(self) -> Candidate:
        return self.cands[self.policy.current]

    # -- what the dense candidate chose (config.json, checkpoints) -------------------
    @property
    def allreduce_choice(self) -> dict[str, Any] | None:
        return getattr(self._dense, "allreduce_choice", None)

    def adopt_allreduce(self, recorded: dict[str, Any] | None) -> None:
        self._dense.adopt_allreduce(recorded)  # type: ignore[attr-defined]

    # -- deciding, on every rank alike ---------------------------------------------
    def decide(self, step: int) -> tuple[Decision, list[dict[str, Any]]]:
        """Read the stamps due at ``step``, then decide what runs at it (every
        rank alike, no collective of its own); returns the decision and the
        model's events (rows for ``metrics.jsonl``)."""
        events: list[dict[str, Any]] = []
        for rows in self.exchange.due(step):
            events += self.policy.observe(rows)
        before = self.policy.current
        decision = self.policy.decide(step)
        if decision.to is not None and self.cands[before].kind == PARTIAL:
            # Its ranks ran apart: the stamps still in flight are read now.
            for rows in self.exchange.flush():
                events += self.policy.observe(rows)
        return decision, events

    def stamp(self, step: int, values: dict[str, float]) -> None:
        """Send this rank's stamp of ``step`` (read ``lag_of`` steps later)."""
        from research.comm.adaptive.stamp import FIELDS

        p = self.policy
        base = {"step": step, "method": p.current, "since": p.since}
        row = [float({**base, **values}.get(f, float("nan"))) for f in FIELDS]
        self.exchange.post(row, step + p.lag_of(step))

    def describe(self, decision: Decision, old: str) -> tuple[str, dict[str, Any]]:
        """A decision's line and its ``metrics.jsonl`` row ``kind: "switch"``."""
        new = old if decision.to is None else self.policy.labels[decision.to]
        event = f"{old} -> {new}" if decision.to is not None else f"keeps {old}"
        table = ", ".join(f"{k} {v['ms']:.1f}" for k, v in decision.estimates.items())
        line = (
            f"adaptive: step {decision.step}: {event} ({decision.reason}): "
            f"{decision.why}" + (f" | predicted ms/step: {table}" if table else "")
        )
        row = {
            "kind": "switch" if decision.to is not None else "decision",
            "step": decision.step,
            "event": event,
            "from": old,
            "to": new,
            "reason": decision.reason,
            "why": decision.why,
            "estimates": decision.estimates,
        }
        return line, row

    def close(self) -> None:
        self.exchange.flush()
        for label in list(self.children):
            self.children.pop(label).close()


_NOTED: list[bool] = []


def _note_unused() -> None:
    from research.comm.process.env import env_rank

    if not _NOTED and env_rank() == 0:
        print(
            "research: adaptive options refresh and max_refresh are no longer "
            "used (the model predicts instead of re-probing); accepted for one "
            "release",
            file=sys.stderr,
            flush=True,
        )
    _NOTED.append(True)
