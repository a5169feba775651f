"""The ``adaptive`` strategy's steps under the Trainer.

It runs each step on the candidate the policy chose, the candidates' own
steps (``host``, ``majority`` and ``solo``: host-side gradient strategies;
``sparse`` at each top-k density)::

    stamps due -> model -> decision          # every rank alike, no collective
    on a switch: carry what the old one holds into the new one
    state, m, info, phases = current.step(state, x, y, ...)   # timed
    this rank's stamp of the step -> every rank (non-blocking)

What it adds around the candidates' steps:

* start-up (:meth:`TrainerSide.start`, before the first step, outside the
  steps' time): every candidate's collective and update run once on a
  gradient-shaped tree, so their buffers, communicators, algorithm choices
  and programs exist before a step needs them, and what they took seeds the
  model (its figures are in ``summary.json``, ``adaptive.startup``;
  :func:`research.strategies.adaptive.seeding.startup`);
* every candidate sees the same state (the ``residual`` of top-k included),
  so they share one compiled gradient and update; top-k runs with weight
  decay in the optimizer, as dense does, so every candidate updates with the
  same optimizer state;
* a switch: top-k's residual goes to the next density, or into the next
  method's first gradient (``GradientStrategy.fold``); what a partial
  collective carried is taken back (no round) and goes the same way; nothing
  is closed, so a later switch back costs nothing either.

Resume: ``drain_into`` publishes the policy's state into ``state.strategy``; a
state that comes back from a checkpoint carries it and the next step takes
it, so a run resumed in any phase continues with the same method at the same
step as one that never stopped, bit for bit where its decisions are the same
(always with a ``plan``; the model's later decisions come from the resumed
run's own timings).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from research.strategies.adaptive.candidates import PARTIAL, SPARSE
from research.strategies.base import StepContext, StepOut, Strategy
from research.trace import get_tracer

if TYPE_CHECKING:
    from research.steps.state import TrainState

_KEY = "adaptive"


class TrainerSide:
    """The Trainer's steps over the candidates (a part of
    :class:`~research.strategies.adaptive.strategy.Adaptive`)."""

    def start(self, state: TrainState, ctx: StepContext) -> TrainState:
        Strategy.start(self, state, ctx)
        from jax.flatten_util import ravel_pytree

        from research.strategies.adaptive.seeding import startup

        avg, tx = self, state.tx
        self._ctx = dataclasses.replace(
            ctx,
            optimizer=lambda pushes=1, weight_decay=None: (None, tx),
            weight_decay=0.0,
        )
        for c in sorted(avg.cands, key=lambda c: c.kind != SPARSE):
            started = avg.child(c.label).start(state, self._ctx)  # top-k: residual
            state = state if started is None else started
        flat, self._unravel = ravel_pytree(state.params)
        self._rows: list[dict[str, Any]] = []
        avg.policy.record = avg.rank == 0  # rows for metrics.jsonl
        topks = {c.label: avg.child(c.label).topk for c in avg.cands
                 if getattr(avg.child(c.label), "topk", None) is not None}  # fmt: skip
        self._startup = startup(self, self._inner(state)[0], flat, topks)
        self._since = time.perf_counter()  # the current method's span
        return self._publish(state)

    # -- what a candidate sees ------------------------------------------------------
    @staticmethod
    def _inner(state: TrainState) -> tuple[TrainState, dict]:
        """The state a candidate sees (the policy's entry held back)."""
        strategy = dict(state.strategy or {})
        hidden = {_KEY: strategy.pop(_KEY)} if _KEY in strategy else {}
        return state.replace(strategy=strategy), hidden

    @staticmethod
    def _outer(state: TrainState, hidden: dict) -> TrainState:
        return state.replace(strategy={**state.strategy, **hidden})

    # -- a step ---------------------------------------------------------------------
    def step(self, state, x, y, *, step, hold) -> StepOut:
        avg, policy = self, self.policy
        state = self._adopt(state)
        t_in = time.perf_counter()
        decision, events = avg.decide(step)
        if avg.rank == 0:
            self._rows += events
        self._carried = 0
        if decision.reason:
            state = self._decided(state, decision, t_in)
        label = policy.labels[policy.current]
        kind = avg.cands[policy.current].kind
        lag = math.nan
        if policy.measure_lag(step):
            state = self._drain_one(state, label)  # publishes the live residual
            lag = self._lag(self._inner(state)[0], x, y)
        inner, hidden = self._inner(state)
        t0 = time.perf_counter()
        arrived: list[float] = []

        def held() -> None:
            hold()
            arrived.append(time.perf_counter() - t0)

        inner, m, info, phases = avg.child(label).step(
            inner, x, y, step=step, hold=held
        )
        dt = time.perf_counter() - t0
        state = self._outer(inner, hidden)
        age = info.extra.get("mean_age", math.nan) if kind == PARTIAL else math.nan
        avg.stamp(step, {
            "total": dt,
            "arrive": arrived[0] if arrived else dt,
            "comm": phases.get("comm_exposed_s") or 0.0,
            "bytes": float(info.bytes) if info is not None else 0.0,
            "lag": lag,
            "age": age,
            "carried": self._carried,
            "full": float(bool(info.extra.get("full"))) if info else 0.0,
        })  # fmt: skip
        policy.account(time.perf_counter() - t_in)
        if info is not None:
            info.extra["method"] = label
        return state, m, info, phases

    def _decided(self, state: TrainState, decision: Any, t0: float) -> TrainState:
        avg, policy = self, self.policy
        old = policy.labels[policy.back if decision.to is not None else policy.current]
        if decision.to is not None:
            state, carried = self._switch(state, old, policy.labels[decision.to])
        line, row = avg.describe(decision, old)
        if decision.to is None:
            return state
        switch_s = time.perf_counter() - t0
        policy.switch_s += switch_s
        row["switch_ms"] = round(switch_s * 1e3, 3)
        self._carried = carried or 0  # in the stamp: every rank's, a "carry" row
        tracer = get_tracer()
        tracer.complete(old, "strategy", self._since, t0, reason=decision.reason)
        tracer.complete(row["event"], "strategy", t0, t0 + switch_s, why=decision.why)
        self._since = t0 + switch_s
        if avg.rank == 0:
            print(f"r0 | {line}", flush=True)
            self._rows.append(row)
        return state

    def _lag(self, inner: TrainState, x: Any, y: Any) -> float:
        """The guard's figure on this rank: the error-feedback residual's norm
        over the norm of this step's gradient (the same batch and parameters
        the step is about to use: one more forward and backward pass)."""
        import jax.numpy as jnp
        from jax.flatten_util import ravel_pytree

        from research.steps import jitted as steps

        grads = steps.grad_step(inner, x, y)[0]
        g = float(jnp.linalg.norm(ravel_pytree(grads)[0]))
        r = float(np.linalg.norm(np.asarray(inner.strategy["residual"])))
        return r / g if g > 0 else math.inf

    def _switch(self, state: TrainState, old: str, new: str):
        """Carry what ``old`` holds into ``new``; the state, and the number of
        carried gradients taken back on this rank (None: not partial)."""
        import jax.numpy as jnp

        avg = self
        kind, to = avg.candidate(old).kind, avg.candidate(new).kind
        carried, count = None, None
        if kind == SPARSE:
            topk = avg.child(old).topk
            if to == SPARSE or topk is None:
                state = self._drain_one(state, old)  # publishes the live residual
            if to != SPARSE:
                # The live residual's views, summed into in place by the fold
                # (top-k takes its buffer afresh from the state when it runs).
                carried = (
                    topk.residual_tree()
                    if topk is not None
                    else self._unravel(jnp.asarray(state.strategy["residual"]))
                )
                # A new array each time: a candidate's update donates the state.
                zeros = jnp.zeros_like(state.strategy["residual"])
                strategy = {**state.strategy, "residual": zeros}
                state = state.replace(strategy=strategy)
        elif kind == PARTIAL:
            taken = avg.child(old).take_carried(flat=to == SPARSE)
            avg.child(old).rest()  # idle until a switch back
            count = 0 if taken is None else taken[1]
            if taken is not None and to == SPARSE:  # into the residual
                r = np.add(np.asarray(state.strategy["residual"]), taken[0])
                residual = jnp.asarray(r.astype(np.float32, copy=False))
                state = state.replace(strategy={**state.strategy, "residual": residual})
            elif taken is not None:
                carried = taken[0]
        if to == PARTIAL:  # every rank switches now: poll at its usual pace
            avg.child(new).rest(False)
        if carried is not None:
            avg.child(new).fold(carried)
        return state, count

    def _drain_one(self, state: TrainState, label: str, final: bool = False):
        inner, hidden = self._inner(state)
        return self._outer(self.child(label).drain_into(inner, final), hidden)

    # -- drain, resume, close ----------------------------------------------------------
    def drain_into(self, state: TrainState, final: bool = False) -> TrainState:
        avg, policy = self, self.policy
        label = policy.labels[policy.current]
        state = self._drain_one(state, label, final)
        if final:
            for rows in avg.exchange.flush():  # every stamp read before closing
                policy.observe(rows)
            now = time.perf_counter()
            get_tracer().complete(label, "strategy", self._since, now, reason="end")
            self._since = now
        return self._publish(state)

    def _publish(self, state: TrainState) -> TrainState:
        self._published = np.asarray(self.policy.vector(), np.float64)
        return state.replace(strategy={**state.strategy, _KEY: self._published})

    def _adopt(self, state: TrainState) -> TrainState:
        """A state whose policy is not the one published last came from a
        checkpoint: continue from its policy (stamps in flight are dropped)."""
        held = (state.strategy or {}).get(_KEY)
        if held is None or held is self._published:
            return state
        self.exchange.flush()
        self.policy.load(np.asarray(held))
        self._published = held
        return state

    def take_rows(self) -> list[dict[str, Any]]:
        rows, self._rows = self._rows, []
        return rows

    def summary(self) -> dict[str, Any]:
        out = self.policy.summary()
        out["startup"] = getattr(self, "_startup", None) or self.startup
        return {"adaptive": out}
