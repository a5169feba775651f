"""``research.averaging("adaptive", ...)``: the adaptive strategy in your own loop.

::

    avg = research.averaging("adaptive", world, interval=20)
    for step in ...:
        grads = grad_fn(params, batch)        # your jitted gradient
        grads, info = avg(grads)              # info.extra["method"]: what ran
        params, opt = apply(params, opt, grads)
    ckpt.save(step, {"params": params, "avg": avg.state()})   # per rank

Each call is one step. A step's time is measured from one call's return to
the next's (your computation and the averaging), its *arrival* from a call's
return to the next call (your computation alone), so the decisions of
:mod:`research.comm.adaptive_policy` see what the Trainer's would. The
candidates run in their own one-call forms (``host``, top-k with error
feedback, ``majority``, ``solo``). A switch drains the old method: what a
partial collective still carried is added to the result of the call that
switches (apply it as that step's gradient, as usual); a top-k residual is
handed to the next density or added to the next method's input gradient.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import jax
import numpy as np

from research.comm.adaptive import AdaptiveAverager, add_trees
from research.comm.adaptive_policy import PARTIAL, SPARSE, Window
from research.comm.base import CommInfo
from research.comm.calling import Averaging, TopK, wrap
from research.comm.sparse.topk import TopKAllreduce


class AdaptiveCall(Averaging):
    """``grads, info = avg(grads)`` over :class:`AdaptiveAverager`'s candidates."""

    def __init__(self, averager: AdaptiveAverager) -> None:
        self.avg, self.name = averager, "adaptive"
        self.calls = 0
        self._forms: dict[str, Any] = {}
        self._window, self._fresh = Window(), True
        self._last: float | None = None
        self._fold: Any = None  # a residual to add to the next input
        self._carried: Any = None  # a drained partial's tree, for the output

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
        return self.avg.current.label

    def __call__(self, grads: Any) -> tuple[Any, CommInfo]:
        t_in = time.perf_counter()
        policy = self.avg.policy
        if policy.due(self.calls):
            self._decide(grads)
        label = self.method
        if self._fold is not None:
            grads, self._fold = add_trees(grads, self._fold), None
        out, info = self._form(label)(grads)
        if self._carried is not None:
            out, self._carried = add_trees(out, self._carried), None
        t_out = time.perf_counter()
        if self._last is not None:
            if not self._fresh:
                self._window.add(t_out - self._last, t_in - self._last, info.wait_s)
            policy.account(t_out - self._last)
        self._fresh, self._last = False, t_out
        self.calls += 1
        info.extra["method"] = label
        return out, info

    def _decide(self, grads: Any) -> None:
        old = self.method
        if self.avg.current.kind == SPARSE:
            # The guard's figure: the residual over this call's gradient.
            r = float(np.linalg.norm(self._forms[old].topk.residual))
            g = math.sqrt(
                sum(float(np.sum(np.square(x))) for x in jax.tree.leaves(grads))
            )
            self._window.lag = r / g if g > 0 else math.inf
        decision = self.avg.agree(self.calls, self._window)
        self._window = Window()
        if decision.reason and self.avg.rank == 0:
            line, _ = self.avg.describe(decision, old)
            print(f"research.comm: {line}", file=sys.stderr, flush=True)
        if decision.to is not None:
            self._switch(old, self.method)
            self._fresh = True

    def _switch(self, old: str, new: str) -> None:
        kind = self.avg.candidate(old).kind
        if kind == PARTIAL:
            rest = self._forms.pop(old).drain()
            if rest is not None:
                self._carried = rest[0]
            self.avg.release(old)
        elif kind == SPARSE:
            topk = self._forms[old].topk
            if self.avg.candidate(new).kind == SPARSE:
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
        out: dict[str, Any] = {"policy": self.avg.policy.vector()}
        out["calls"] = np.int64(self.calls)
        form = self._forms.get(self.method)
        if self.avg.current.kind == SPARSE and form is not None:
            out["topk"] = form.state()
        return out

    def load_state(self, state: dict[str, Any]) -> None:
        self.avg.policy.load(state["policy"])
        self.calls = int(state["calls"])
        self._window, self._fresh, self._last = Window(), True, None
        if "topk" in state:
            self._form(self.method).load_state(state["topk"])

    def close(self) -> None:
        self.avg.close()
