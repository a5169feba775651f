"""The ``adaptive`` strategy: dense, top-k sparse or partial, chosen while it trains.

::

    avg = research.averaging("adaptive", world, densities="0.01,0.001")
    for step in ...:
        grads = grad_fn(params, batch)
        grads, info = avg(grads)          # info.extra["method"]: what ran
        params, opt = apply(params, opt, grads)

or ``experiments.train --strategy adaptive``. It runs one of its candidates at a
time, the existing strategies themselves: ``host`` (the dense allreduce, its
``allreduce`` path measured as usual), ``sparse`` at each of ``densities``
(top-k with error feedback), ``majority`` and ``solo`` (eager-SGD's partial
collectives, staleness bounded by ``staleness``). Every ``interval`` steps it
measures what the running method costs per step and, by probing them for a few
steps, what the others cost now, and switches when another is cheaper by more
than the noise it measured (:mod:`research.comm.adaptive_policy` says exactly
how, and what the guard on convergence measures). The decision is made on rank
0 from every rank's figures and broadcast with the policy's whole state, so
every rank switches at the same step.

A switch is exact: the old method is drained first (a partial collective runs
the synchronous round that delivers every carried gradient; top-k publishes
its residual); the error-feedback residual is kept when another density takes
over and folded back into the gradient of the first step of a method without a
residual (dense or partial), so every computed gradient is applied exactly
once. Weight decay stays in the optimizer for every method (top-k included),
so a switch never changes the optimizer state.

Options (``--strategy-opt KEY=VALUE``; ranges checked before launch):

* ``candidates``: ``host,sparse,majority,solo`` (``host`` required);
* ``densities``: top-k densities to try, ``0.01`` (the sparsest is the bound
  on sparsity);
* ``interval``: steps between decisions, 20;
* ``probe_steps``: measured steps of a probe (after one warm-up step), 3;
* ``refresh``, ``max_refresh``: a candidate's estimate older than this is
  probed again (the period doubles up to ``max_refresh`` while probes confirm
  the choice), 100 and 800 steps;
* ``margin``: least relative advantage that counts (beyond twice the measured
  standard error), 0.05;
* ``max_lag``, ``cooldown``: the guard (module ``adaptive_policy``): top-k is
  left when its residual holds more than 10 gradients' worth of update, for 5
  windows of dense;
* ``staleness``: the partial collectives' synchronous round every this many
  rounds (their bound on staleness), 8;
* ``plan``: fixed switches instead of measured ones, ``host@0,sparse:0.01@40``;
* ``allreduce``, ``seed``, ``link``: as for ``host``, ``majority``, all.

Each switch is one line on rank 0 (what, why, in numbers), a row ``kind:
"switch"`` in ``metrics.jsonl``, and a span on the timeline's ``strategy`` track;
``summary.json`` gives the time and steps spent in each method.
"""

from __future__ import annotations

import types
from typing import Any, Literal

import jax
import numpy as np

from research.comm.adaptive_policy import (
    DENSE,
    PARTIAL,
    SPARSE,
    Candidate,
    Decision,
    Policy,
    Window,
    parse_candidates,
    parse_plan,
)
from research.comm.base import Averager, CommInfo
from research.comm.registry import get_averager, register_averager
from research.comm.sparse.strategy import SparseAverager
from research.comm.world import as_world
from research.options import Range

#: Option bounds, also checked before launch (``research.comm.registry``).
RANGES = {
    "interval": (2, 10**6),
    "probe_steps": (1, 10**4),
    "refresh": (1, 10**8),
    "max_refresh": (1, 10**8),
    "cooldown": (0, 10**6),
    "staleness": (1, 10**4),
    "margin": (0.0, 1.0),
    "max_lag": (1e-6, 1e12),
}


class Folded(Averager):
    """A host-side averager whose next ``reduce`` adds a carried tree (the
    residual folded back) to the gradient it is given; else the averager."""

    executor = "host-side"

    def __init__(self, inner: Averager) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.pending: Any = None
        self.delivered = 0

    def reduce(self, grads: Any) -> tuple[Any, CommInfo]:
        if self.pending is not None:
            grads = add_trees(grads, self.pending)
            self.pending = None
        return self.inner.reduce(grads)

    def drain(self) -> tuple[Any, CommInfo] | None:
        out = self.inner.drain()
        # Gradients a partial collective carried, delivered by this drain.
        self.delivered = out[1].extra.get("carried_total", 0) if out else 0
        return out

    def close(self) -> None:
        self.inner.close()


def add_trees(a: Any, b: Any) -> Any:
    """``a + b`` leaf by leaf, as float32 numpy (the same bits jax would give)."""
    return jax.tree.map(lambda x, y: np.add(np.asarray(x), np.asarray(y)), a, b)


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
    options_check = "research.comm.adaptive_candidates:check_text_options"
    option_ranges = {  # RANGES, as research.comm.declared reads them
        "interval": Range(ge=2, le=10**6),
        "probe_steps": Range(ge=1, le=10**4),
        "refresh": Range(ge=1, le=10**8),
        "max_refresh": Range(ge=1, le=10**8),
        "cooldown": Range(ge=0, le=10**6),
        "staleness": Range(ge=1, le=10**4),
        "margin": Range(ge=0.0, le=1.0),
        "max_lag": Range(ge=1e-6, le=1e12),
        "seed": Range(ge=0),
    }

    @classmethod
    def averaging(cls, world: Any, **options: Any) -> Any:
        """``research.averaging("adaptive", ...)``: :class:`AdaptiveCall`."""
        from research.comm.adaptive_call import AdaptiveCall

        return AdaptiveCall(cls(world, **options))

    def __init__(
        self,
        world: Any,
        *,
        candidates: str = "host,sparse,majority,solo",
        densities: str | float = "0.01",
        interval: int = 20,
        probe_steps: int = 3,
        refresh: int = 100,
        max_refresh: int = 800,
        margin: float = 0.05,
        max_lag: float = 10.0,
        cooldown: int = 5,
        staleness: int = 8,
        plan: str = "",
        allreduce: Literal["auto", "ring", "mpi", "hierarchical"] = "auto",
        seed: int = 0,
        link: str = "real",
    ) -> None:
        given = dict(
            interval=interval, probe_steps=probe_steps, refresh=refresh,
            max_refresh=max_refresh, cooldown=cooldown, staleness=staleness,
            margin=margin, max_lag=max_lag,
        )  # fmt: skip
        for key, value in given.items():
            low, high = RANGES[key]
            if not low <= value <= high:
                raise ValueError(
                    f"adaptive: {key}={value!r} must be in [{low}, {high}]"
                )
        # ``--strategy-opt densities=0.01`` arrives as a number.
        self.cands: list[Candidate] = parse_candidates(candidates, str(densities))
        labels = [c.label for c in self.cands]
        self.policy = Policy(
            self.cands,
            interval=interval,
            probe_steps=probe_steps,
            refresh=refresh,
            max_refresh=max(refresh, max_refresh),
            margin=margin,
            max_lag=max_lag,
            cooldown=cooldown,
            plan=parse_plan(plan, labels),
        )
        self.world = world = as_world(world)
        self.size, self.rank = world.size, world.rank
        self.staleness, self.seed, self.link = staleness, seed, link
        self._allreduce = allreduce
        self.comm = world.dup("adaptive")
        self.children: dict[str, Averager] = {}
        for c in self.cands:  # partial ones when first run (each its own comm)
            if c.kind != PARTIAL:
                self.child(c.label)
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
        """The candidate's averager, built on first use (collective then)."""
        if label not in self.children:
            c = self.candidate(label)
            if c.kind == SPARSE:
                avg: Averager = SparseAverager(
                    self.world, density=c.density, seed=self.seed, link=self.link
                )
            elif c.kind == DENSE:
                avg = get_averager(
                    "host", self.world, allreduce=self._allreduce, link=self.link
                )
            else:
                avg = get_averager(
                    c.strategy,
                    self.world,
                    seed=self.seed,
                    full_every=self.staleness,
                    link=self.link,
                )
            self.children[label] = avg
        return self.children[label]

    def release(self, label: str) -> None:
        """Close a partial candidate's collective (after its drain; collective)."""
        if self.candidate(label).kind == PARTIAL and label in self.children:
            self.children.pop(label).close()

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
    def agree(self, step: int, window: Window, early: bool = False) -> Decision:
        """Every rank's ``window`` to rank 0, which decides; the policy's state
        back to all (collective). ``early``: brought forward by anomalous
        steps (:meth:`Policy.decide`)."""
        windows = self.comm.gather(window, root=0)
        out = None
        if self.rank == 0:
            decision = self.policy.decide(step, windows, early)
            out = (self.policy.vector(), decision)
        vec, decision = self.comm.bcast(out, root=0)
        if self.rank != 0:
            self.policy.load(vec)
        return decision

    def describe(self, decision: Decision, old: str) -> tuple[str, dict[str, Any]]:
        """A decision's line and its ``metrics.jsonl`` row: ``kind: "switch"``
        (``from``, ``to``) or, when it keeps the method, ``kind: "decision"``."""
        new = old if decision.to is None else self.policy.labels[decision.to]
        event = f"{old} -> {new}" if decision.to is not None else f"keeps {old}"
        table = ", ".join(
            f"{k} {v['ms']:.1f}+-{v['se_ms']:.1f}"
            for k, v in decision.estimates.items()
        )
        line = (
            f"adaptive: step {decision.step}: {event} ({decision.reason}): "
            f"{decision.why}" + (f" | ms/step: {table}" if table else "")
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
        for label in list(self.children):
            self.children.pop(label).close()
