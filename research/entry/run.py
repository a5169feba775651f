"""Start one training run inside an MPI world: abort-on-error, run folder, plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from research.comm.world import get_world, install_abort_on_error
from research.rundir import default_run_dir, read_metrics
from research.train.config import TrainConfig
from research.train.process import freeze_imports


def run_training(
    cfg: TrainConfig, experiment: str, **trainer_kw: Any
) -> dict[str, Any]:
    """Train with ``cfg`` on this process's world; rank 0 plots and prints a summary.

    Bad data or settings found while the Trainer is built raise
    :class:`research.usage.UsageError` on every rank alike, for the caller to
    report as one line; any other exception, on any rank, aborts the whole job.
    """
    world = get_world()
    install_abort_on_error()
    freeze_imports()
    if not cfg.run_dir:
        cfg.run_dir = world.bcast(
            default_run_dir(experiment) if world.rank == 0 else None
        )
    from research.train.loop import Trainer

    trainer = Trainer(cfg, world, **trainer_kw)
    summary = trainer.run()
    if world.rank == 0:
        from research.plots import plot_training_curves

        rows = read_metrics(cfg.run_dir)
        plot_training_curves(rows, Path(cfg.run_dir) / "curves.png")
        acc = summary.get("final_test_acc")
        print(
            f"r0 | done: {summary['steps']} steps on {world.size} ranks, "
            f"median step {summary['median_step_s'] * 1e3:.1f} ms, "
            f"{summary['samples_per_s']:.0f} samples/s, test accuracy "
            f"{acc:.4f} -> {cfg.run_dir}",
            flush=True,
        )
    return summary
