"""Measure one checkpointing strategy inside a real training run (in the MPI job).

:func:`run_one` trains with a :class:`~research.train.loop.Trainer`, checkpointing
every N steps with one strategy, and returns what the DeepFreeze table needs:
blocking time per checkpoint (slowest rank), time until committed, the wall
time of the steps after warm-up (end-to-end cost), bytes written per rank and,
afterwards, the time to restore the newest checkpoint.
"""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from research.checkpoint.callback import CheckpointCallback
from research.checkpoint.config import CheckpointConfig
from research.comm.world import World
from research.train.config import TrainConfig
from research.train.loop import Callback, Trainer


class StepClock(Callback):
    """Wall-clock time at the end of every step (after the other callbacks' work)."""

    def __init__(self) -> None:
        self.times: dict[int, float] = {}

    def on_step_end(self, trainer: Trainer, step: int) -> None:
        self.times[step] = time.perf_counter()


def _median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _worst(records: list[dict], key: str) -> float | None:
    """Largest value among the ranks that have one (rank-0 strategies: rank 0)."""
    vals = [r[key] for r in records if r[key] is not None]
    return max(vals) if vals else None


def run_one(
    world: World,
    train: TrainConfig,
    ckpt: CheckpointConfig,
    *,
    warm_steps: int = 3,
    restore: bool = True,
) -> dict[str, Any]:
    """Train once with ``ckpt``; every rank returns the same result dict.

    Args:
      world: the job's world (collective).
      train: the run (its ``run_dir`` holds the run's files and checkpoints).
      ckpt: strategy and interval; ``resume`` is ignored (a fresh run).
      warm_steps: steps excluded from the end-to-end time (compilation).
      restore: time a restore of the newest checkpoint after training.
    """
    ckpt = dataclasses.replace(ckpt, resume=False)
    run_dir = Path(train.run_dir)
    if not ckpt.directory:
        ckpt = dataclasses.replace(ckpt, directory=str(run_dir / "checkpoints"))
    clock = StepClock()
    cb = CheckpointCallback(ckpt) if ckpt.strategy != "none" else None
    # The clock goes last so a step's end includes its checkpoint's blocking.
    trainer = Trainer(train, world, callbacks=[c for c in (cb, clock) if c])
    summary = trainer.run()
    steps = sorted(clock.times)
    first, last = min(warm_steps, steps[-1] - 1), steps[-1]
    timed_s = clock.times[last] - clock.times[first]
    out: dict[str, Any] = {
        "strategy": ckpt.strategy,
        "interval": ckpt.every,
        "ranks": world.size,
        "model": train.model,
        "steps": last,
        "timed_steps": last - first,
        "timed_s": max(world.allgather(timed_s)),
        "median_step_s": summary["median_step_s"],
        "run_dir": str(run_dir),
    }
    if cb is None:
        return out
    recs = world.allgather(
        [
            dataclasses.asdict(r)
            for r in sorted(cb.ckpt.records.values(), key=lambda r: r.step)
        ]
    )
    by_step: dict[int, list[dict]] = {}
    for rank_recs in recs:
        for r in rank_recs:
            by_step.setdefault(r["step"], []).append(r)
    # The training is synchronous: a checkpoint costs what its slowest rank pays.
    blocking = [max(r["blocking_s"] for r in rs) for rs in by_step.values()]
    committed = [_worst(rs, "committed_s") for rs in by_step.values()]
    persisted = [_worst(rs, "persisted_s") for rs in by_step.values()]
    per_rank_bytes = [
        _median([r["bytes_written"] for r in rank_recs]) or 0 for rank_recs in recs
    ]
    out.update(
        {
            "checkpoints": len(by_step),
            "blocking_s": blocking,
            "median_blocking_s": _median(blocking),
            "median_wait_s": _median(
                [max(r["wait_s"] for r in rs) for rs in by_step.values()]
            ),
            "stalled": sum(any(r["wait_s"] > 0 for r in rs) for rs in by_step.values()),
            "skipped": sum(any(r["skipped"] for r in rs) for rs in by_step.values()),
            "median_committed_s": _median(committed),
            "median_persisted_s": _median(persisted),
            "bytes_per_rank": per_rank_bytes,
            "snapshot_mode": getattr(cb.ckpt, "snapshot_mode", None),
        }
    )
    if restore:
        out["restore_s"], out["restored_step"] = _time_restore(world, ckpt, trainer)
    _remove_checkpoints(world, cb)
    return out


def _time_restore(
    world: World, ckpt: CheckpointConfig, trainer: Trainer
) -> tuple[float, int | None]:
    """Slowest rank's time to restore the newest checkpoint with a new checkpointer."""
    fresh = ckpt.create(world, trainer.run_dir)
    world.barrier()
    t0 = time.perf_counter()
    restored = fresh.restore(trainer.state)
    dt = time.perf_counter() - t0
    fresh.close()
    return max(world.allgather(dt)), (restored.step if restored else None)


def _remove_checkpoints(world: World, cb: CheckpointCallback) -> None:
    """Free the tiers (the fast one is memory) once measured."""
    world.barrier()
    for tier in cb.ckpt.tiers:
        shutil.rmtree(tier.rank_dir(world.rank), ignore_errors=True)
    world.barrier()
    if world.rank == 0:
        for tier in cb.ckpt.tiers:
            shutil.rmtree(tier.root, ignore_errors=True)
