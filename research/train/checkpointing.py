"""The training-loop hook: resume at start, checkpoint every N steps, finish at end.

    from research.checkpoint import CheckpointConfig
    from research.train.checkpointing import CheckpointCallback

    cb = CheckpointCallback(CheckpointConfig(saver="deepfreeze", every=10))
    Trainer(cfg, world, callbacks=[cb]).run()

What a checkpoint holds: the whole TrainState (parameters, optimizer state,
batch statistics, step, RNG key) plus each rank's data position, so a resumed
run continues exactly like one that never stopped.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from research.checkpoint.base import Checkpointer
from research.checkpoint.config import CheckpointConfig
from research.comm.faults import watchdog
from research.periodic import itstime
from research.train.callback import Callback, Run


class CheckpointCallback(Callback):
    """Checkpoints a :class:`research.train.loop.Trainer` with one saver.

    Args:
      config: saver, interval, tiers, policies.
      **kw: passed to the saver's constructor (e.g. ``fault_hook``).

    Attributes:
      ckpt: the checkpointer (None for saver ``"none"``), made at train start.
      resumed_from: the step restored at train start, or None.
    """

    def __init__(self, config: CheckpointConfig, **kw: Any) -> None:
        problem = config.validate()
        if problem:
            raise ValueError(problem)
        self.config = config
        self.ckpt: Checkpointer | None = None
        self.resumed_from: int | None = None
        self._kw = kw
        self._world = None
        self._end_s = 0.0
        self._saved_at: int | None = None

    @classmethod
    def for_run(cls, config: Any) -> CheckpointCallback:
        """The callback a ``TrainConfig`` asks for (its ``checkpoint``),
        checkpointing after the last step too."""
        return cls(dataclasses.replace(config.checkpoint, final=True))

    def on_train_start(self, trainer: Run) -> None:
        with watchdog.watch("checkpoint start-up and restore"):
            self._start(trainer)

    def _start(self, trainer: Run) -> None:
        self._world = trainer.world
        self.ckpt = self.config.create(trainer.world, trainer.run_dir, **self._kw)
        if self.ckpt is None:
            return
        if not self.config.resume:
            dropped = self.ckpt.forget_all()
            if dropped:
                trainer.world.log(
                    f"not resuming: forgot committed steps {dropped} in "
                    f"{self.ckpt.tiers[-1].root}"
                )
            return
        restored = self.ckpt.restore(trainer.state)
        if restored is not None:
            extra = restored.extra_for(trainer.world.rank)
            trainer.restore(restored.state, restored.step, extra.get("data"))
            # What the interrupted run's strategy recorded (the allreduce it
            # measured and took): the same again, so it continues bit for bit.
            trainer.strategy.adopt(extra.get("strategy") or {})
            self.resumed_from = restored.step
            trainer.world.log(
                f"resumed from step {restored.step} "
                f"({restored.seconds:.2f} s, tiers {restored.tiers})"
            )

    def on_step_end(self, trainer: Run, step: int) -> None:
        if self.ckpt is not None and itstime(
            step, self.config.every, trainer.total_steps, last=self.config.final
        ):
            trainer.drain()  # nothing in flight or carried in the snapshot
            self._save(trainer, step)

    def on_stop(self, trainer: Run) -> None:
        """Told to stop: checkpoint this step unless it was just saved."""
        if self.ckpt is not None and self._saved_at != trainer.step:
            self.ckpt.wait()  # a free slot: on_busy="skip" must not drop this one
            self._save(trainer, trainer.step)

    def _save(self, trainer: Run, step: int) -> None:
        extra = {"data": trainer.loader.position, "step": step}
        extra["strategy"] = trainer.strategy.record()
        record = self.ckpt.save(step, trainer.state, extra=extra)
        self._saved_at = step
        trainer.log_scalars(
            step,
            {
                "checkpoint/blocking_s": record.blocking_s,
                "checkpoint/wait_s": record.wait_s,
            },
        )

    def on_train_end(self, trainer: Run) -> None:
        if self.ckpt is not None:
            t0 = time.perf_counter()
            with watchdog.watch("checkpoint close"):
                self.ckpt.close()  # waits for checkpoints in flight, raises failures
            self._end_s = time.perf_counter() - t0

    def summary(self) -> dict[str, Any]:
        """Per-rank checkpoint numbers (collective: every rank calls it)."""
        if self.ckpt is None:
            return {"resumed_from": None, "checkpoint": {"saver": "none"}}
        mine = self.ckpt.summary()
        mine["close_s"] = self._end_s
        mine["resumed_from"] = self.resumed_from
        records = mine.pop("records")
        per_rank = self._world.allgather(mine) if self._world else [mine]
        return {
            "resumed_from": self.resumed_from,
            "checkpoint": {
                "saver": self.ckpt.name,
                "every": self.config.every,
                "per_rank": per_rank,
                "records": records if self._world.rank == 0 else None,
            },
        }
