"""The ``adaptive`` strategy's one call in a user's own loop: ``avg(grads)``.

::

    avg = research.averaging("adaptive", world)
    for step in ...:
        grads = grad_fn(params, batch)        # your jitted gradient
        grads, info = avg(grads)              # info.extra["method"]: what ran
        params, opt = apply(params, opt, grads)
    ckpt.save(step, {"params": params, "avg": avg.state()})   # per rank

Each call is one step. Its *arrival* is the time from the previous call's
return to this call (your computation), its total the time from that return
to this call's (your computation and the averaging), so the model of
:mod:`research.strategies.adaptive.model` sees what the Trainer's would. The
first call measures every candidate once on its gradient (:mod:`.seeding`).
The candidates run in their own one-call forms (``host``, top-k with error
feedback, ``majority``, ``solo``). A switch carries what the old method held:
what a partial collective carried and top-k's residual are added to the next
method's input (a top-k residual handed to the next density as it is), so the
results of all calls sum to every gradient given, over P.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import numpy as np

from research.comm.info import CommInfo
from research.strategies.adaptive.candidates import PARTIAL, SPARSE
from research.strategies.base import add_trees


class CallSide:
    """``grads, info = avg(grads)`` over the candidates (a part of
    :class:`~research.strategies.adaptive.strategy.Adaptive`)."""

    def _init_call(self) -> None:
        self.calls = 0
        self._last: float | None = None
        self._fold: Any = None  # what the next input gets added
        self._carried = 0  # gradients the last switch took back (this rank)
        self.startup: dict[str, Any] | None = None

    def _topk(self, label: str) -> Any:
        """A top-k candidate's one-call top-k."""
        return self.child(label).one_call()

    @property
    def method(self) -> str:
        """The candidate the next call runs."""
        return self.policy.labels[self.policy.current]

    def __call__(self, grads: Any) -> tuple[Any, CommInfo]:
        import jax

        from research.strategies.adaptive.seeding import seed

        t_in = time.perf_counter()
        policy = self.policy
        if self.startup is None:
            leaves, treedef = jax.tree.flatten(jax.tree.map(np.asarray, grads))
            topks = {}
            for c in self.cands:  # their own buffers, set up by the seeding
                if c.kind == SPARSE:
                    topks[c.label] = self._topk(c.label)
                    topks[c.label].start(leaves, treedef)
            tree = jax.tree.unflatten(treedef, leaves)
            self.startup = seed(self, tree, topks=topks)
            for topk in topks.values():
                topk.residual.fill(0.0)
            t_in = time.perf_counter()
        old = self.method
        self._carried = 0
        decision, _ = self.decide(self.calls)
        if decision.to is not None:
            if self.rank == 0:
                line, _ = self.describe(decision, old)
                print(f"research.strategies: {line}", file=sys.stderr, flush=True)
            self._switch_call(old, self.method)
        label = self.method
        lag = math.nan
        if policy.measure_lag(self.calls):
            r = float(np.linalg.norm(self._topk(label).residual))
            g = math.sqrt(
                sum(float(np.sum(np.square(x))) for x in jax.tree.leaves(grads))
            )
            lag = r / g if g > 0 else math.inf
        if self._fold is not None:
            grads, self._fold = add_trees(grads, self._fold), None
        t0 = time.perf_counter()
        out, info = self.child(label)(grads)
        t_out = time.perf_counter()
        start = self._last if self._last is not None else t_in
        partial = self.candidate(label).kind == PARTIAL
        self.stamp(self.calls, {
            "total": t_out - start,
            "arrive": t_in - start,
            "comm": t_out - t0,
            "bytes": float(info.bytes),
            "lag": lag,
            "age": info.extra.get("mean_age", math.nan) if partial else math.nan,
            "carried": self._carried,
            "full": float(bool(info.extra.get("full"))),
        })  # fmt: skip
        policy.account(t_out - start)
        self._last = t_out
        self.calls += 1
        info.extra["method"] = label
        return out, info

    def _switch_call(self, old: str, new: str) -> None:
        import jax

        kind, to = self.candidate(old).kind, self.candidate(new).kind
        if kind == PARTIAL:
            taken = self.child(old).take_carried()
            self.child(old).rest()
            if taken is not None:
                self._fold, self._carried = taken
        elif kind == SPARSE:
            topk = self._topk(old)
            if to == SPARSE:
                state = {"residual": topk.residual.copy(), "step": np.int64(topk.step)}
                self._topk(new).load_state(state)
            else:
                self._fold = jax.tree.map(np.copy, topk.residual_tree())
            topk.residual.fill(0.0)

    def drain(self) -> tuple[Any, CommInfo] | None:
        if self.startup is None:
            return None
        return self.child(self.method).drain()

    def state(self) -> dict[str, Any]:
        """The policy's state and, in a top-k phase, this rank's residual."""
        out: dict[str, Any] = {"policy": np.asarray(self.policy.vector())}
        out["calls"] = np.int64(self.calls)
        if self.candidate(self.method).kind == SPARSE and self.startup is not None:
            out["topk"] = self.child(self.method).state()
        return out

    def load_state(self, state: dict[str, Any]) -> None:
        self.policy.load(state["policy"])
        self.calls = int(state["calls"])
        self._last = None
        if "topk" in state:
            self.child(self.method).load_state(state["topk"])
