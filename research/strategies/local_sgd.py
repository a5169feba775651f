"""``local_sgd``: H local steps on each rank, then parameters and optimizer state
averaged.

Local SGD (Stich, *Local SGD Converges Fast and Communicates Little*, ICLR'19;
Lin, Stich, Patel, Jaggi, *Don't Use Large Mini-Batches, Use Local SGD*,
ICLR'20, post-local SGD; Douillard et al., *DiLoCo*, 2023): every rank steps on
its own gradients with the run's optimizer, communicating nothing, and every
``local_steps`` steps the ranks replace their parameters and optimizer state
by the mean over ranks (one host allreduce of both, ``research.comm.dense.
HostAllreduce``: ring, MPI or hierarchical, whichever ``auto`` measured
fastest). With ``sync_steps``, the first steps average after every step
(post-local SGD's synchronous warm-up). ``local_steps=1`` is synchronous SGD
with the averaging done on the parameters instead of the gradients.

Under the Trainer a step is one jitted program of gradient and update, then
the average where one is due (after step ``s`` when ``s + 1 <= sync_steps`` or
``(s + 1) % local_steps == 0``, counted on the state's step, so a resumed run
averages where the first one would have). A drain (evaluation, a checkpoint
snapshot, the end) averages first where ranks have stepped apart, so what is
evaluated and saved is one model on every rank, and a resumed run continues bit
for bit. Ranks may run ``local_steps`` steps apart between averages
(:attr:`LocalSGD.drift`).

In a user's own loop it takes the state it averages, after each local update::

    avg = research.averaging("local_sgd", world, local_steps=8)
    for step in ...:
        params, opt = local_update(params, opt, batch)       # your jitted step
        (params, opt), info = avg((params, opt))             # the mean, when due
    rest = avg.drain()                      # the last state averaged, or None
    if rest is not None:
        (params, opt), _ = rest

Per step (``CommInfo``): ``bytes`` averaged (0 between averages),
``contributors`` (the ranks in the state: all after an average, else 1),
``round`` (averages so far), ``extra["averaged"]`` (1 where this step averaged).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Literal

import numpy as np

from research.comm.info import CommInfo
from research.options import Range, option
from research.strategies.base import (
    RecordsItsMean,
    StepContext,
    StepOut,
    Strategy,
    StrategyOptions,
    like,
    step_phases,
)
from research.strategies.registry import register
from research.trace import get_tracer


@register("local_sgd")
@dataclasses.dataclass(frozen=True)
class LocalSGDOptions(StrategyOptions):
    """Options of ``local_sgd``.

    Attributes:
      local_steps: H, the steps each rank takes between two averages.
      sync_steps: the first steps, each followed by an average (post-local
        SGD's warm-up; 0: local from the start).
      allreduce: the host allreduce of the average (``auto``, ``ring``,
        ``mpi``, ``hierarchical``), as ``host``'s.
      link: an emulated link (``research.comm.link``), or ``real``.
    """

    local_steps: int = option(8, Range(ge=1, le=10**6))
    sync_steps: int = option(0, Range(ge=0))
    allreduce: Literal["auto", "ring", "mpi", "hierarchical"] = "auto"
    link: str = "real"

    def create(self, world: Any) -> LocalSGD:
        return LocalSGD(world, self)


class LocalSGD(RecordsItsMean, Strategy):
    """Local steps, then the mean of parameters and optimizer state."""

    def __init__(self, world: Any, options: LocalSGDOptions) -> None:
        super().__init__(world, options)
        from research.comm.dense import HostAllreduce

        self.mean = HostAllreduce(
            self.world, allreduce=options.allreduce, link=options.link
        )
        self.averages = 0  # averages so far
        self.calls = 0  # the one call's calls (a user's loop)
        self._given: Any = None  # the one call's last state, not averaged yet
        self._apart = False  # stepped apart since the last average (Trainer)
        self._local: Any = None

    def due(self, step: int) -> bool:
        """Whether an average follows step ``step`` (0-based)."""
        o = self.options
        return step + 1 <= o.sync_steps or (step + 1) % o.local_steps == 0

    def _average(self, tree: Any) -> tuple[Any, CommInfo]:
        """The mean over ranks of ``tree`` (collective)."""
        out, info = self.mean.reduce(tree)
        self.averages += 1
        info.round, info.extra["averaged"] = self.averages, 1
        return out, info

    def _local_info(self) -> CommInfo:
        return CommInfo(contributors=1, round=self.averages, extra={"averaged": 0})

    # -- a user's own loop ------------------------------------------------------------
    def __call__(self, tree: Any) -> tuple[Any, CommInfo]:
        """After each local update: the state's mean over ranks where an average
        is due (every ``local_steps``-th call, every call of the first
        ``sync_steps``), else the state as given."""
        import jax

        given = jax.tree.leaves(tree)
        if any(isinstance(x, jax.core.Tracer) for x in given):
            raise TypeError("local_sgd averages on the host: call it outside jit")
        self.calls += 1
        if not self.due(self.calls - 1):
            self._given = tree
            return tree, self._local_info()
        self._given = None
        out, info = self._average(tree)
        return like(given, out), info

    def drain(self) -> tuple[Any, CommInfo] | None:
        """The last state given, averaged, where it was not (collective)."""
        if self._given is None:
            return None
        import jax

        tree, self._given = self._given, None
        out, info = self._average(tree)
        return like(jax.tree.leaves(tree), out), info

    def state(self) -> dict[str, Any]:
        return {"calls": np.int64(self.calls), "averages": np.int64(self.averages)}

    def load_state(self, state: dict[str, Any]) -> None:
        self.calls, self.averages = int(state["calls"]), int(state["averages"])

    # -- the Trainer ------------------------------------------------------------------
    def start(self, state: Any, ctx: StepContext) -> None:
        super().start(state, ctx)
        from research.steps import jitted as steps

        self._local = steps.make_fused_step(lambda grads: grads)  # no mean

    def _average_state(self, state: Any, step: int) -> tuple[Any, CommInfo]:
        import jax
        import jax.numpy as jnp

        with get_tracer().span("average", "comm", step=step, strategy=self.name):
            tree = {"params": state.params, "opt_state": state.opt_state}
            out, info = self._average(tree)
            out = jax.tree.map(jnp.array, out)  # copies: the buckets are reused
        self._apart = False
        return state.replace(params=out["params"], opt_state=out["opt_state"]), info

    def step(self, state, x, y, *, step, hold) -> StepOut:
        import jax

        t0 = time.perf_counter()
        with get_tracer().span("fwd+bwd+update", "compute", step=step):
            state, m = self._local(state, x, y)
            m = jax.device_get(m)
        compute_s = time.perf_counter() - t0
        hold()  # a slower rank's extra time follows its own computation
        if not self.due(step):
            self._apart = True
            phases = step_phases(compute_s, exposed_s=0.0, busy_s=0.0)
            return state, m, self._local_info(), phases
        t1 = time.perf_counter()
        state, info = self._average_state(state, step)
        waited = time.perf_counter() - t1
        return state, m, info, step_phases(compute_s, exposed_s=waited, busy_s=waited)

    def drain_into(self, state: Any, final: bool = False) -> Any:
        if not self._apart:
            return state
        return self._average_state(state, int(state.step))[0]

    # -- what others ask --------------------------------------------------------------
    @property
    def drift(self) -> int | None:
        return self.options.local_steps
