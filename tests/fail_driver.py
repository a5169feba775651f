"""A real training job in which one rank raises mid-run (used by test_train_cli).

mpiexec -n 2 python tests/fail_driver.py RUN_DIR FAIL_RANK FAIL_STEP
"""

from __future__ import annotations

import sys

from research.train.config import TrainConfig
from research.train.loop import Callback


class FailAt(Callback):
    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_step_end(self, trainer, step: int) -> None:
        if trainer.world.rank == self.rank and step == self.step:
            raise RuntimeError(f"injected failure on rank {self.rank} at step {step}")


if __name__ == "__main__":
    from research.runner import run_training

    run_dir, rank, step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cfg = TrainConfig(
        model="candle_p1b2_tiny",
        dataset="synthetic_tabular",
        data_options={"features": 256, "n_train": 512, "n_test": 64},
        batch_size=8,
        steps=50,
        eval_every=0,
        strategy="host",
        progress=False,
        run_dir=run_dir,
    )
    run_training(cfg, "fail", callbacks=[FailAt(rank, step)])
