"""``ps``: an asynchronous parameter server, the baseline of eager-SGD (PPoPP'20).

Over :class:`research.comm.ps.ParameterServer`: rank ``root`` holds the
parameters; every rank (the root too) pushes its gradient and pulls the
parameters back, waiting only for the server, never for the other workers. The
server applies each push at once with the run's optimizer scaled for P pushes
per synchronous step (lr / P on a P-times-longer schedule: the same
per-example rate), so a worker's gradient is stale by the updates others made
since it pulled. Its step exchanges gradients for parameters: there is no
``avg(grads)`` form, and ranks run apart without bound (:attr:`PS.drift`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from research.comm.info import CommInfo
from research.options import Range, option
from research.strategies.base import GradientStrategy, StepContext, StrategyOptions
from research.strategies.registry import register


@register("ps")
@dataclasses.dataclass(frozen=True)
class PSOptions(StrategyOptions):
    """Options of ``ps``.

    Attributes:
      root: the rank that holds the parameters (and also works); below the
        world's size, checked when the world is known.
      max_sleep: longest sleep between probes while idle, seconds.
      link: an emulated link for the server's port (``research.comm.link``).
    """

    deterministic: ClassVar[bool] = False
    no_call_form: ClassVar[str | None] = (
        "the parameter server exchanges gradients for parameters (push, pull); "
        "it returns no mean. Use the Trainer: experiments.train --strategy ps"
    )

    root: int = option(0, Range(ge=0))
    max_sleep: float = option(5e-4, Range(gt=0, le=1))
    link: str = "real"

    def create(self, world: Any) -> PS:
        return PS(world, self)


class PS(GradientStrategy):
    """Push gradients to the parameter server, pull its parameters."""

    def __init__(self, world: Any, options: PSOptions) -> None:
        super().__init__(world, options)
        from research.comm.ps import ParameterServer

        self.ps = ParameterServer(
            self.world,
            root=options.root,
            max_sleep=options.max_sleep,
            link=options.link,
        )

    def start(self, state: Any, ctx: StepContext) -> None:
        super().start(state, ctx)
        from research.comm.ps import optimizer_update

        # P pushes make one synchronous step's worth of gradient.
        _, tx = ctx.optimizer(self.size)
        update = optimizer_update(tx, state.params) if self.ps.is_server else None
        self.ps.bind(state.params, update)

    def reduce(self, grads: Any) -> tuple[Any, CommInfo]:
        return self.ps.push_pull(grads)

    def carried(self) -> tuple[Any, CommInfo] | None:
        return None if self.ps._tmpl is None else self.ps.finish()

    def apply(self, state: Any, params: Any, batch_stats: Any) -> Any:
        import jax

        from research.steps import jitted as steps

        state = steps.set_params_step(state, params, batch_stats)
        jax.block_until_ready(state.params)
        return state

    def drain_into(self, state: Any, final: bool = False) -> Any:
        # Push-pull is synchronous for the worker: nothing is in flight between
        # steps. Only the end retires the server (every rank's final pull).
        return super().drain_into(state, final) if final else state

    @property
    def drift(self) -> int | None:
        return None

    def close(self) -> None:
        self.ps.close()
