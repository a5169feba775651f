"""Hooks into the training loop (``research.train.loop.Trainer``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from research.train.loop import Trainer


class Callback:
    """Hooks into the loop (checkpointing, custom logging). All are optional."""

    def on_train_start(self, trainer: Trainer) -> None:
        """Before the first step; may call ``trainer.restore`` to resume."""

    def on_step_end(self, trainer: Trainer, step: int) -> None:
        """After the update of step ``step`` (number of completed steps)."""

    def on_stop(self, trainer: Trainer) -> None:
        """The run was told to stop after step ``trainer.step`` (collective;
        communication drained): save what must survive. ``on_train_end`` follows.
        """

    def on_train_end(self, trainer: Trainer) -> None:
        """After the last step and the final evaluation."""

    def summary(self) -> dict[str, Any]:
        """Numbers merged into ``summary.json``."""
        return {}
