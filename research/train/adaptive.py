"""The step side of the ``adaptive`` strategy (``research/comm/adaptive.py``).

The executor owns one executor per candidate, made with
:func:`~research.train.executors.make_executor` from the candidate's own
averager (``host-side`` for ``host``, ``majority`` and ``solo``; ``sparse`` for
each top-k density), and runs each step on the current one::

    if policy.due(step):                  # every rank at the same step
        figures -> rank 0 -> decision -> every rank (collective)
        on a switch: old.drain(state); fold or hand over the residual
    state, m, info, phases = current.step(state, x, y, ...)   # timed

What it adds around the candidates' steps:

* the state's ``strategy`` holds ``residual`` (the top-k executors' error
  feedback, rank-local, shared by every density) and ``adaptive`` (the
  policy's state, the same on every rank); a candidate sees only what it uses;
* top-k runs with weight decay in the optimizer, as dense does, so every
  candidate updates with the same optimizer and its state carries over
  (the candidates get a :class:`~research.train.executors.StepContext` whose
  optimizer is the run's, whose ``weight_decay`` is 0);
* leaving top-k for a method without a residual folds the residual into that
  method's first gradient (``research.comm.adaptive.Folded``) and zeroes it;
* a partial collective left behind is drained (its synchronous round delivers
  what it carried, applied as the executor's drain does) and closed.

Resume: ``drain`` publishes the policy's state into ``state.strategy``; a state
that comes back from a checkpoint carries it, and the next step takes it (the
method, the window, the estimates), so a run resumed in any phase continues
with the same method at the same step as one that never stopped, bit for bit
where its decisions are the same (always with a ``plan``; measured decisions
after a resume come from the resumed run's own timings).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from mpi4py import MPI

from research.comm.adaptive import Folded
from research.comm.adaptive_policy import PARTIAL, SPARSE, Window
from research.trace import get_tracer
from research.train import step as steps
from research.train.executors import Executor, StepOut, make_executor, register_executor
from research.train.state import TrainState

_KEY = "adaptive"


class AdaptiveCandidates(Protocol):
    """What the ``adaptive`` executor calls beyond ``Averager``."""

    policy: Any
    cands: list

    def child(self, label: str) -> Any:
        """The candidate's averager (built on first use)."""

    def release(self, label: str) -> None:
        """Close a partial candidate (collective)."""

    def agree(self, step: int, window: Window) -> Any:
        """The decision from every rank's window (collective)."""


@register_executor("adaptive")
class AdaptiveExecutor(Executor):
    """Runs each step on the candidate the policy chose (module docstring)."""

    needs = AdaptiveCandidates

    def start(self, state: TrainState) -> TrainState:
        avg = self.averager
        tx = state.tx
        self._ctx = dataclasses.replace(
            self.ctx,
            optimizer=lambda pushes=1, weight_decay=None: (None, tx),
            weight_decay=0.0,
        )
        self._execs: dict[str, Executor] = {}
        for c in avg.cands:  # top-k first: they add the residual to the state
            if c.kind != PARTIAL:
                state = self._exec(c.label, state)[1]
        flat, self._unravel = ravel_pytree(state.params)
        self._warm(flat)
        self._window, self._fresh = Window(), True
        self._flag_out, self._flag_in = np.zeros(1, np.int32), np.zeros(1, np.int32)
        self._flag_req: Any = None
        self._anomalies = 0
        self._last = (0.0, 0.0, 0.0)
        self._rows: list[dict[str, Any]] = []
        self._since = time.perf_counter()  # the current method's span
        return self._publish(state)

    def _warm(self, flat: Any) -> None:
        """What a first switch would otherwise pay inside a step (collective):
        the folding's unravel compiled, the sparse cost model agreed."""
        jax.block_until_ready(self._unravel(jnp.zeros_like(flat)))
        if any(c.kind == SPARSE for c in self.averager.cands):
            from research.comm.sparse.calibration import agreed_model

            agreed_model(self.averager.world.comm)

    # -- the candidates' executors -------------------------------------------------
    def _exec(self, label: str, state: Any = None) -> tuple[Executor, Any]:
        if label not in self._execs:
            avg = self.averager
            child = avg.child(label)
            if avg.candidate(label).kind != SPARSE:
                child = Folded(child)
            ex = make_executor(child, self._ctx)
            if state is not None:
                started = ex.start(state)
                state = state if started is None else started
            self._execs[label] = ex
        return self._execs[label], state

    def _inner(self, state: TrainState, label: str) -> tuple[TrainState, dict]:
        """The state a candidate sees, and the entries held back from it."""
        keep = {_KEY}
        if self.averager.candidate(label).kind != SPARSE:
            keep.add("residual")
        strategy = dict(state.strategy or {})
        hidden = {k: strategy.pop(k) for k in keep if k in strategy}
        return state.replace(strategy=strategy), hidden

    @staticmethod
    def _outer(state: TrainState, hidden: dict) -> TrainState:
        return state.replace(strategy={**state.strategy, **hidden})

    # -- a step ---------------------------------------------------------------------
    def step(self, state, x, y, *, step, hold) -> StepOut:
        policy = self.averager.policy
        state = self._adopt(state)
        early = self._agreed_anomaly()
        if early or policy.due(step):
            state = self._decide(state, step, early, x, y)
        label = policy.labels[policy.current]
        ex = self._exec(label)[0]
        inner, hidden = self._inner(state, label)
        t0 = time.perf_counter()
        arrived: list[float] = []

        def held() -> None:
            hold()
            arrived.append(time.perf_counter() - t0)

        inner, m, info, phases = ex.step(inner, x, y, step=step, hold=held)
        dt = time.perf_counter() - t0
        state = self._outer(inner, hidden)
        if not self._fresh:
            comm = phases.get("comm_exposed_s") or 0.0
            self._last = (dt, arrived[0] if arrived else dt, comm)
            self._window.add(*self._last)
            self._post_anomaly(policy.anomalous(dt))
        self._fresh = False
        policy.account(dt)
        if info is not None:
            info.extra["method"] = label
        return state, m, info, phases

    # -- an early decision: two anomalous steps in a row, agreed ----------------
    def _post_anomaly(self, mine: bool) -> None:
        """Start the agreement on this step: any rank's anomaly counts. Every
        rank posts it or none does (the policy's state decides, the same on
        every rank): after a measured step of a synchronous method in a run
        window that has an estimate."""
        if not self.averager.policy.watching():
            return  # partial collectives' ranks run apart: it would bind them
        self._flag_out[0] = int(mine)
        self._flag_req = self.averager.comm.Iallreduce(
            self._flag_out, self._flag_in, op=MPI.MAX
        )

    def _agreed_anomaly(self) -> bool:
        """The previous step's agreement: True at the second anomalous step
        in a row (the window then holds just those two)."""
        if self._flag_req is None:
            return False
        self._flag_req.Wait()
        self._flag_req = None
        if not self._flag_in[0]:
            self._anomalies = 0
            return False
        self._anomalies += 1
        if self._anomalies == 1:
            self._window = Window()
            self._window.add(*self._last)
        return self._anomalies >= 2

    def _decide(
        self, state: TrainState, step: int, early: bool, x: Any, y: Any
    ) -> TrainState:
        avg, policy = self.averager, self.averager.policy
        self._anomalies = 0
        t0 = time.perf_counter()
        old = policy.labels[policy.current]
        if avg.candidate(old).kind == SPARSE:
            state = self._drain_one(state, old)  # publishes the residual
            self._window.lag = self._lag(state, x, y)
        decision = avg.agree(step, self._window, early)
        self._window = Window()
        if not decision.reason:
            return state
        self._delivered = None
        if decision.to is not None:
            state = self._switch(state, old, policy.labels[decision.to])
        line, row = avg.describe(decision, old)
        if self._delivered is not None:
            row["delivered"] = self._delivered
        switch_s = time.perf_counter() - t0
        if decision.to is not None:
            policy.switch_s += switch_s
            row["switch_ms"] = round(switch_s * 1e3, 3)
            tracer = get_tracer()
            tracer.complete(old, "strategy", self._since, t0, reason=decision.reason)
            tracer.complete(
                row["event"], "strategy", t0, t0 + switch_s, why=decision.why
            )
            self._since = t0 + switch_s
            self._fresh = True
        if avg.rank == 0:
            print(f"r0 | {line}", flush=True)
            self._rows.append(row)
        return state

    def _lag(self, state: TrainState, x: Any, y: Any) -> float:
        """The guard's figure on this rank: the error-feedback residual's norm
        over the norm of this step's gradient (the same batch and parameters
        the step is about to use: one more forward and backward pass)."""
        grads = steps.grad_step(state, x, y)[0]
        g = float(jnp.linalg.norm(ravel_pytree(grads)[0]))
        r = float(np.linalg.norm(np.asarray(state.strategy["residual"])))
        return r / g if g > 0 else math.inf

    def _switch(self, state: TrainState, old: str, new: str) -> TrainState:
        avg = self.averager
        kind, to = avg.candidate(old).kind, avg.candidate(new).kind
        state = self._drain_one(state, old)
        if kind == PARTIAL:
            self._delivered = self._execs.pop(old).averager.delivered
            avg.release(old)
        if kind == SPARSE and to != SPARSE:
            residual = state.strategy["residual"]
            ex = self._exec(new)[0]
            ex.averager.pending = self._unravel(jnp.asarray(residual))
            zero = jnp.zeros_like(residual)
            state = state.replace(strategy={**state.strategy, "residual": zero})
        return state

    def _drain_one(self, state: TrainState, label: str, final: bool = False):
        inner, hidden = self._inner(state, label)
        return self._outer(self._execs[label].drain(inner, final), hidden)

    # -- drain, resume, close ----------------------------------------------------------
    def drain(self, state: TrainState, final: bool = False) -> TrainState:
        policy = self.averager.policy
        if final and self._flag_req is not None:  # posted by every rank
            self._flag_req.Wait()
            self._flag_req = None
        state = self._drain_one(state, policy.labels[policy.current], final)
        if final:
            now = time.perf_counter()
            label = policy.labels[policy.current]
            get_tracer().complete(label, "strategy", self._since, now, reason="end")
            self._since = now
        return self._publish(state)

    def _publish(self, state: TrainState) -> TrainState:
        self._published = self.averager.policy.vector()
        return state.replace(strategy={**state.strategy, _KEY: self._published})

    def _adopt(self, state: TrainState) -> TrainState:
        """A state whose policy is not the one published last came from a
        checkpoint: continue from its policy."""
        held = (state.strategy or {}).get(_KEY)
        if held is None or held is self._published:
            return state
        self.averager.policy.load(np.asarray(held))
        self._published = held
        self._window, self._fresh = Window(), True
        return state

    def take_rows(self) -> list[dict[str, Any]]:
        rows, self._rows = self._rows, []
        return rows

    def summary(self) -> dict[str, Any]:
        return {"adaptive": self.averager.policy.summary()}

    def close(self) -> None:
        self.averager.close()
