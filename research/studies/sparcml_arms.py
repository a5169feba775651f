"""One training arm of the SparCML study: its config, its run and its numbers.

Shared by the study's training arms (:mod:`research.studies.sparcml`) and its
communication-bound comparison (:mod:`research.studies.sparcml_commbound`).
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any


def arm_config(base, arm: str, run_dir: Path, *, density: float, bits: int, **opts):
    """The TrainConfig of one training arm."""
    if arm == "dense":
        strategy, options = "host", {}
    else:
        options = {
            "density": density,
            "error_feedback": arm != "topk_noef",
            "bits": bits if arm == "topk_4bit" else 0,
            **opts,
        }
        strategy = "sparse"
    return dataclasses.replace(
        base,
        strategy=base.strategy.to(strategy, options),
        run_dir=str(run_dir / f"{arm}-s{base.seed}"),
    )


def run_arm(cfg, arm: str, world) -> dict[str, Any]:
    from research.train.loop import Trainer

    trainer = Trainer(cfg, world)
    if world.rank == 0:
        print(
            f"r0 | arm {arm}: {trainer.total_steps} steps -> {cfg.run_dir}", flush=True
        )
    return trainer.run()


def load_arm(run_dir: Path, target_acc: float) -> dict[str, Any]:
    """An arm's numbers from its folder: accuracy, time to target, bytes per step."""
    from research.rundir import read_metrics
    from research.studies.eager_sgd import load_run

    out = load_run(run_dir, target_acc)
    rows = read_metrics(run_dir)
    sent = [r["comm_bytes"] for r in rows if "comm_bytes" in r and "step_time" in r]
    out["bytes_per_step"] = statistics.fmean(sent) if sent else None
    out["curve"] = [(e["step"], e["test_acc"]) for e in rows if e.get("kind") == "eval"]
    # Median ms per step of each phase the strategy reports (step 1 compiles):
    # the common keys (research.strategies.base.PHASES) and top-k's selection.
    keys = {"compute": "compute_s", "select": "select_s", "comm": "comm_busy_s"}
    keys["update"] = "update_s"
    out["phases_ms"] = {
        name: 1e3 * statistics.median(vals)
        for name, key in keys.items()
        if (vals := [r[key] for r in rows if r.get(key) is not None and r["step"] > 1])
    }
    return out
