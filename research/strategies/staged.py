"""Steps run stage by stage, collectives on the progress thread as each stage's
gradient exists: what ``layerwise`` and ``overlap`` share.

:class:`Staged` runs the model with :class:`research.steps.stages.StagedGrad`
(forward per stage, backward per stage), each stage timed and traced, and its
collectives are handles of :class:`research.comm.asynchronous.handles.AsyncComm`
on the rank's progress thread. Collectives start in the same order on every
rank: stages come out of the backward pass in one fixed order, and buckets are
fixed by the parameter shapes. Every collective carries a name on the timeline
(``reduce-scatter <stage>``, ``allgather <stage>``, ``allreduce <bucket>``,
track ``comm-bg``), every wait of the compute thread is ``wait <collective>
<stage>`` on track ``comm`` (what an analyzer counts as exposed communication).

Per-step record (``CommInfo``): ``bytes`` handed to MPI, ``wait_s`` (exposed),
and in ``extra``: ``comm_s`` (time with at least one of the step's collectives
in flight), ``hidden`` (1 - exposed / comm), ``opt_bytes`` (optimizer state
held by this rank).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from research.comm.info import CommInfo
from research.strategies.base import StepContext, Strategy, StrategyOptions
from research.trace import get_tracer

if TYPE_CHECKING:
    import numpy as np

    from research.steps.stages import Stage

#: Why a staged strategy has no ``avg(grads)`` form.
NO_CALL_FORM = (
    "its collectives start stage by stage inside the backward pass (and the "
    "next forward), inside the Trainer's step. Use experiments.train "
    "--strategy NAME, or research.comm.asynchronous.handles.AsyncComm for the "
    "nonblocking calls"
)


class Staged(Strategy):
    """Forward and backward stage by stage; collectives as handles."""

    def __init__(self, world: Any, options: StrategyOptions) -> None:
        super().__init__(world, options)
        from research.comm.asynchronous.handles import AsyncComm

        self.engine = AsyncComm(self.world, link=options.link, name=self.name)
        self.link = self.engine.link

    def start(self, state: Any, ctx: StepContext) -> None:
        super().start(state, ctx)
        from research.steps.stages import StagedGrad, split_model

        if ctx.model is None:
            raise ValueError(f"strategy {self.name!r} needs the model (ctx.model)")
        exchange = self._exchanged(split_model(ctx.model))
        self.staged = StagedGrad.shared(ctx.model, exchange)
        self.stages = self.staged.stages

    def _exchanged(self, stages: Sequence[Stage]) -> list[int]:
        """Stages to run tapped (their activations exchanged): none here."""
        return []

    def _forward_done(self, i: int) -> None:
        """Called once stage ``i``'s forward output is ready."""

    def _wait(self, h: Any, what: str, step: int) -> np.ndarray:
        with get_tracer().span(f"wait {what}", "comm", step=step):
            out = h.wait()
        self._waited += h.wait_s
        self._retired.append(h)
        return out

    def _forward(self, state, x, y, step: int, stage_params=None) -> dict:
        import jax

        tracer, begun = get_tracer(), {}

        def before(i: int):
            params = stage_params(i) if stage_params else None
            begun[i] = time.perf_counter()
            return params

        def after(i: int, out: jax.Array) -> None:
            jax.block_until_ready(out)
            t1 = time.perf_counter()
            self._compute += t1 - begun[i]
            name = f"forward {self.stages[i].name}"
            tracer.complete(name, "compute", begun[i], t1, step=step)
            self._forward_done(i)

        return self.staged.forward(state, x, y, stage_params=before, after_stage=after)

    def _backward(
        self, step: int, on_grad: Callable[[int, Any], None], post=None
    ) -> None:
        """Backward stage by stage; ``on_grad(i, grads)`` once each is ready
        (``grads`` is ``post(i)(leaves)`` with a ``post``: see ``StagedGrad``)."""
        import jax

        tracer = get_tracer()
        t0 = time.perf_counter()
        for i, grads in self.staged.backward(post=post):
            grads = jax.block_until_ready(grads)
            on_grad(i, grads)  # packing for MPI is the compute thread's work
            t1 = time.perf_counter()
            self._compute += t1 - t0
            name = f"backward {self.stages[i].name}"
            tracer.complete(name, "compute", t0, t1, step=step)
            t0 = time.perf_counter()

    def _begin(self) -> None:
        self._compute = self._waited = 0.0
        self._retired: list[Any] = []
        self._sent = 0

    def _info(self, step: int, opt_bytes: int) -> CommInfo:
        from research.steps.flat import busy_time

        comm = busy_time(self._retired)
        return CommInfo(
            bytes=self._sent,
            contributors=self.size,
            wait_s=self._waited,
            round=step + 1,
            extra={
                "comm_s": comm,
                "hidden": 1.0 - min(1.0, self._waited / comm) if comm > 0 else 0.0,
                "opt_bytes": opt_bytes,
            },
        )

    def close(self) -> None:
        # The Trainer drains on the success path; close is then local.
        self.engine.close()
