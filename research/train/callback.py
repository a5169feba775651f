"""Hooks into the training loop, and what they see of a run.

:class:`Callback` is what a hook subclasses; :class:`Run` is what hooks and the
run's records (``research.train.report``) may read of the run, so that they
need nothing of the loop: :class:`research.train.loop.Trainer` is a ``Run``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from research.steps.state import TrainState
from research.train.config import TrainConfig


class Run(Protocol):
    """A training run as its hooks see it (the Trainer's public face)."""

    config: TrainConfig
    world: Any  # research.comm.world.World
    state: TrainState
    dataset: Any
    loader: Any  # research.train.prefetch.DeviceFeed around the data's loader
    model: Any
    strategy: Any  # research.strategies.base.Strategy
    imbalance: Any  # research.imbalance.Imbalance
    stop: Any  # research.train.preemption.StopAgreement
    tracer: Any  # research.trace.Tracer or NullTracer
    schedule: Any
    callbacks: list[Callback]
    # research.train.records.Records: the run folder's writers and each
    # rank's platform and device (``records.devices``)
    records: Any
    run_dir: Path
    step: int  # completed steps
    total_steps: int
    train_time: float  # seconds in training steps, evaluation excluded
    t_start: float  # when the first step began (perf_counter)
    start_s: float  # from the constructor's start to the first step (seconds)
    logged: tuple[int, float]  # (step, train_time) of the last metrics row
    step_times: list[float]
    delays: list[float]  # injected into each step (imbalance)
    data_waits: list[float]  # each step's input wait (research.train.prefetch)
    contributors: list[int]
    evals: list[dict[str, Any]]

    def restore(
        self, state: TrainState, step: int, data_position: dict | None
    ) -> None: ...

    def drain(self, final: bool = False) -> None: ...

    def log_scalars(self, step: int, values: dict[str, float]) -> None: ...


class Callback:
    """Hooks into the loop (checkpointing, custom logging). All are optional."""

    def on_train_start(self, trainer: Run) -> None:
        """Before the first step; may call ``trainer.restore`` to resume."""

    def on_step_end(self, trainer: Run, step: int) -> None:
        """After the update of step ``step`` (number of completed steps)."""

    def on_stop(self, trainer: Run) -> None:
        """The run was told to stop after step ``trainer.step`` (collective;
        communication drained): save what must survive. ``on_train_end`` follows.
        """

    def on_train_end(self, trainer: Run) -> None:
        """After the last step and the final evaluation."""

    def summary(self) -> dict[str, Any]:
        """Numbers merged into ``summary.json``."""
        return {}
