"""The ``adaptive`` strategy: its options, its candidates, and the one object.

:class:`Adaptive` is what the Trainer and a user's loop call: its steps
(:class:`~research.strategies.adaptive.trainer.TrainerSide`) and its one call
(:class:`~research.strategies.adaptive.call.CallSide`) share what is here: the
candidates (the strategies themselves, each made once for the whole run, so a
switch costs no set-up), the policy and the stamps every rank exchanges.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from research.options import Range, option
from research.strategies.adaptive.call import CallSide
from research.strategies.adaptive.candidates import (
    DENSE,
    PARTIAL,
    SPARSE,
    Candidate,
    check_text_options,
    parse_candidates,
    parse_plan,
)
from research.strategies.adaptive.policy import Decision, Policy
from research.strategies.adaptive.trainer import TrainerSide
from research.strategies.base import Strategy, StrategyOptions
from research.strategies.fused import dense_xla_runtime
from research.strategies.host import HostOptions
from research.strategies.partial import MajorityOptions, SoloOptions
from research.strategies.registry import register
from research.strategies.sparse import SparseOptions

#: The policy's options (the rest make the candidates).
POLICY = ("margin", "settle", "error_bound", "patience", "probe_steps")
POLICY += ("delay_cost", "dense_steps", "max_lag", "cooldown", "interval", "staleness")


@register("adaptive")
@dataclasses.dataclass(frozen=True)
class AdaptiveOptions(StrategyOptions):
    """Options of ``adaptive`` (``--strategy-opt KEY=VALUE``).

    Attributes:
      candidates: its methods, ``host,sparse,majority,solo`` (``host``
        required); ``sparse`` runs once per density.
      densities: top-k densities, ``0.01`` or ``0.01,0.001``.
      margin: least relative gain (time to progress) a switch needs.
      settle: measured steps of a method before it is left.
      error_bound, patience, probe_steps: the model is not trusted when its
        error stays above ``error_bound`` for ``patience`` steps; a probe then
        runs the next best candidate for ``probe_steps`` steps.
      delay_cost: what a step whose gradients are applied one step late is
        worth less.
      dense_steps: dense only for the first this many steps.
      max_lag, cooldown, interval: the guard: top-k is left when its residual
        holds more than ``max_lag`` gradients' worth of update (measured every
        ``interval`` steps of it), for ``cooldown`` x ``interval`` steps.
      staleness: the partial collectives' full round every this many rounds.
      plan: fixed switches instead of the model's, ``host@0,sparse:0.01@40``.
      allreduce, seed, link: as for ``host``, ``majority``, all.
    """

    deterministic = False

    candidates: str = "host,sparse,majority,solo"
    densities: str | float = "0.01"
    margin: float = option(0.1, Range(ge=0.0, le=1.0))
    settle: int = option(3, Range(ge=1, le=10**6))
    error_bound: float = option(0.3, Range(gt=0.0, le=10.0))
    patience: int = option(20, Range(ge=1, le=10**6))
    probe_steps: int = option(3, Range(ge=1, le=10**4))
    delay_cost: float = option(0.02, Range(ge=0.0, le=10.0))
    dense_steps: int = option(10, Range(ge=0, le=10**9))
    max_lag: float = option(10.0, Range(ge=1e-6, le=1e12))
    cooldown: int = option(5, Range(ge=0, le=10**6))
    interval: int = option(20, Range(ge=1, le=10**6))
    staleness: int = option(8, Range(ge=1, le=10**4))
    plan: str = ""
    allreduce: Literal["auto", "ring", "mpi", "hierarchical", "xla"] = "auto"
    seed: int = option(0, Range(ge=0))
    link: str = "real"

    @classmethod
    def problem(cls, values: dict[str, Any]) -> str | None:
        """As every strategy's, then candidates, densities and plan parsed
        (numpy only: before launch)."""
        return super().problem(values) or check_text_options(values)

    def create(self, world: Any) -> Adaptive:
        return Adaptive(world, self)

    def xla_runtime(self, platform: str) -> str | None:
        return dense_xla_runtime(self.allreduce, platform)  # its dense candidate


class Adaptive(CallSide, TrainerSide, Strategy):
    """Chooses among dense, top-k and partial averaging as it trains (see the
    package docstring)."""

    def __init__(self, world: Any, options: AdaptiveOptions) -> None:
        super().__init__(world, options)
        from research.strategies.adaptive.exchange import Exchange

        o = options
        # ``--strategy-opt densities=0.01`` arrives as a number.
        self.cands: list[Candidate] = parse_candidates(o.candidates, str(o.densities))
        labels = [c.label for c in self.cands]
        given = {k: getattr(o, k) for k in POLICY}
        self.policy = Policy(
            self.cands, size=self.size, plan=parse_plan(o.plan, labels), **given
        )
        self.comm = self.world.dup("adaptive")
        self.exchange = Exchange(self.comm)
        # Every candidate for the whole run: a switch sets nothing up.
        self.children: dict[str, Strategy] = {
            c.label: self._make(c) for c in self.cands
        }
        self._dense = self.children[self.cands[self.policy.dense].label]
        self._init_call()

    # -- the candidates -------------------------------------------------------------
    def candidate(self, label: str) -> Candidate:
        return self.cands[self.policy.labels.index(label)]

    def child(self, label: str) -> Any:
        """The candidate's strategy."""
        return self.children[label]

    def _make(self, c: Candidate) -> Strategy:
        o = self.options
        if c.kind == SPARSE:
            made = SparseOptions(density=c.density, seed=o.seed, link=o.link)
        elif c.kind == DENSE:
            made = HostOptions(allreduce=o.allreduce, link=o.link)
        else:
            partial = {"solo": SoloOptions, "majority": MajorityOptions}[c.strategy]
            made = partial(seed=o.seed, full_every=o.staleness, link=o.link)
        return made.create(self.world)

    @property
    def current(self) -> Candidate:
        return self.cands[self.policy.current]

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
        from research.strategies.adaptive.stamp import FIELDS

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

    # -- what others ask ------------------------------------------------------------
    @property
    def drift(self) -> int | None:
        """A partial candidate lets ranks run ``staleness`` rounds apart."""
        partial = any(c.kind == PARTIAL for c in self.cands)
        return self.options.staleness if partial else 0

    @property
    def allreduce_choice(self) -> dict[str, Any] | None:
        return self._dense.allreduce_choice

    def record(self) -> dict[str, Any]:
        return self._dense.record()

    def adopt(self, record: dict[str, Any]) -> None:
        self._dense.adopt(record)

    def close(self) -> None:
        self.exchange.flush()
        for label in list(self.children):
            self.children.pop(label).close()
