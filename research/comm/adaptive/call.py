"""``research.averaging("adaptive", ...)``: the adaptive strategy in your own loop.

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
:mod:`research.comm.adaptive.model` sees what the Trainer's would. The first
call measures every candidate once on its gradient (:mod:`.seeding`). The
candidates run in their own one-call forms (``host``, top-k with error
feedback, ``majority``, ``solo``). A switch carries what the old method held:
what a partial collective carried and top-k's residual are added to the next
method's input (a top-k residual handed to the next density as it is), so the
results of all calls sum to every gradient given, over P.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Protocol

import jax
import numpy as np

from research.comm.adaptive.candidates import PARTIAL, SPARSE
from research.comm.adaptive.carry import add_trees
from research.comm.adaptive.seeding import seed
from research.comm.base import CommInfo
from research.comm.calling import Averaging, TopK, wrap
from research.comm.sparse.topk import TopKAllreduce


class Adaptive(Protocol):
    """What the one call uses of the strategy (``AdaptiveAverager``)."""

    policy: Any
    world: Any
    rank: int

    def candidate(self, label: str) -> Any: ...
    def child(self, label: str) -> Any: ...
    def decide(self, step: int) -> Any: ...
    def stamp(self, step: int, values: dict) -> None: ...
    def describe(self, decision: Any, old: str) -> tuple[str, dict]: ...
    def close(self) -> None: ...


class AdaptiveCall(Averaging):
    """``grads, info = avg(grads)`` over the adaptive strategy's candidates."""

    def __init__(self, averager: Adaptive) -> None:
        self.avg, self.name = averager, "adaptive"
        self.calls = 0
        self._forms: dict[str, Any] = {}
        self._last: float | None = None
        self._fold: Any = None  # what the next input gets added
        self._carried = 0  # gradients the last switch took back (this rank)
        self.startup: dict[str, Any] | None = None

    def _form(self, label: str) -> Any:
        if label not in self._forms:
            child = self.avg.child(label)
            if self.avg.candidate(label).kind == SPARSE:
                self._forms[label] = TopK(TopKAllreduce(self.avg.world, averager=child))
            else:
                self._forms[label] = wrap(child)
        return self._forms[label]

    @property
    def method(self) -> str:
        """The candidate the next call runs."""
        return self.avg.policy.labels[self.avg.policy.current]

    def __call__(self, grads: Any) -> tuple[Any, CommInfo]:
        t_in = time.perf_counter()
        policy = self.avg.policy
        if self.startup is None:
            leaves, treedef = jax.tree.flatten(jax.tree.map(np.asarray, grads))
            topks = {}
            for c in self.avg.cands:  # their own buffers, set up by the seeding
                if c.kind == SPARSE:
                    topks[c.label] = self._form(c.label).topk
                    topks[c.label].start(leaves, treedef)
            tree = jax.tree.unflatten(treedef, leaves)
            self.startup = seed(self.avg, tree, topks=topks)
            for topk in topks.values():
                topk.residual.fill(0.0)
            t_in = time.perf_counter()
        old = self.method
        self._carried = 0
        decision, _ = self.avg.decide(self.calls)
        if decision.to is not None:
            if self.avg.rank == 0:
                line, _ = self.avg.describe(decision, old)
                print(f"research.comm: {line}", file=sys.stderr, flush=True)
            self._switch(old, self.method)
        label = self.method
        lag = math.nan
        if policy.measure_lag(self.calls):
            r = float(np.linalg.norm(self._forms[label].topk.residual))
            g = math.sqrt(
                sum(float(np.sum(np.square(x))) for x in jax.tree.leaves(grads))
            )
            lag = r / g if g > 0 else math.inf
        if self._fold is not None:
            grads, self._fold = add_trees(grads, self._fold), None
        t0 = time.perf_counter()
        out, info = self._form(label)(grads)
        t_out = time.perf_counter()
        start = self._last if self._last is not None else t_in
        partial = self.avg.candidate(label).kind == PARTIAL
        self.avg.stamp(self.calls, {
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

    def _switch(self, old: str, new: str) -> None:
        kind, to = self.avg.candidate(old).kind, self.avg.candidate(new).kind
        if kind == PARTIAL:
            taken = self.avg.child(old).take_carried()
            self.avg.child(old).rest()
            if taken is not None:
                self._fold, self._carried = taken
        elif kind == SPARSE:
            topk = self._forms[old].topk
            if to == SPARSE:
                state = {"residual": topk.residual.copy(), "step": np.int64(topk.step)}
                self._form(new).topk.load_state(state)
            else:
                self._fold = jax.tree.map(np.copy, topk.residual_tree())
            topk.residual.fill(0.0)

    def drain(self) -> tuple[Any, CommInfo] | None:
        form = self._forms.get(self.method)
        return None if form is None else form.drain()

    def state(self) -> dict[str, Any]:
        """The policy's state and, in a top-k phase, this rank's residual."""
        out: dict[str, Any] = {"policy": np.asarray(self.avg.policy.vector())}
        out["calls"] = np.int64(self.calls)
        form = self._forms.get(self.method)
        if self.avg.candidate(self.method).kind == SPARSE and form is not None:
            out["topk"] = form.state()
        return out

    def load_state(self, state: dict[str, Any]) -> None:
        self.avg.policy.load(state["policy"])
        self.calls = int(state["calls"])
        self._last = None
        if "topk" in state:
            self._form(self.method).load_state(state["topk"])

    def close(self) -> None:
        self.avg.close()
