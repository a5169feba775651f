"""eager-SGD's logic: arms run inside the MPI job, run folders read back, table.

``python -m experiments.eager_sgd`` (the paper, the commands and the measured
table are in its docstring) parses the flags and calls :func:`run_experiment`
on every rank; rank 0 then reads the run folders into ``results.json``
(:func:`write_results`) and prints the page's part of the run
(:mod:`research.studies.eager_sgd_page`: table and checks), which renders the
same later from ``results.json`` alone.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from research.imbalance import parse_imbalance
from research.train.config import TrainConfig

ARMS = ("allreduce", "solo", "majority", "ps")
#: ``auto``: the balanced reference's median step time times --delay-scale, so the
#: delay keeps the paper's ratio (0.32 s sleeps on ~0.3-0.5 s steps) on any machine.
DEFAULT_IMBALANCE = "random:k=1:seconds=auto:how=spin"
DEFAULT_TARGET = 0.85


def check_flags(cfg: Any) -> str | None:
    """The first problem with the experiment's own values as one line, or None
    (``cfg``: ``experiments.eager_sgd.Config``)."""
    if cfg.train.strategy.name != "fused":
        return (
            "--strategy does not apply here: choose arms with --arms "
            "and the synchronous arm's strategy with --allreduce-strategy"
        )
    from research.strategies import registry

    for arm in cfg.arms:
        name = cfg.allreduce_strategy if arm == "allreduce" else arm
        problem = registry.problem(name, {}, cfg.train.strategy.link)
        if problem:
            return f"arm {arm}: {problem}"
    if cfg.full_every < 0:
        return f"--full-every must be >= 0, got {cfg.full_every}"
    if not 0 < cfg.target_acc <= 1:
        return f"--target-acc must be in (0, 1], got {cfg.target_acc}"
    if "=auto" in cfg.imbalance and cfg.reference_steps <= 0:
        return (
            "--imbalance with 'auto' needs the balanced reference "
            "(--reference-steps > 0) to measure the step time"
        )
    if cfg.delay_scale < 0:
        return f"--delay-scale must be >= 0, got {cfg.delay_scale}"
    try:
        parse_imbalance(
            resolve_auto(cfg.imbalance, 0.1), size=max(cfg.launch.np, 1), seed=0
        )
    except ValueError as e:
        return f"--imbalance: {e}"
    return None


# -- running the arms (inside the MPI job) ---------------------------------------------
def arm_config(
    base: TrainConfig,
    arm: str,
    seed: int,
    run_dir: Path,
    *,
    allreduce_strategy: str,
    full_every: int,
    reference_steps: int,
) -> TrainConfig:
    """The TrainConfig of one arm and seed (``balanced``: the short reference)."""
    import dataclasses

    synchronous = arm in ("allreduce", "balanced")
    strategy = allreduce_strategy if synchronous else arm
    options: dict[str, Any] = {}
    if arm in ("solo", "majority"):
        options = {"seed": seed, "full_every": full_every or None}
    cfg = dataclasses.replace(
        base,
        strategy=base.strategy.to(strategy, options),
        seed=seed,
        run_dir=str(run_dir / f"{arm}-s{seed}"),
    )
    if arm == "balanced":
        cfg.steps, cfg.eval_every = reference_steps, 10**9
    return cfg


def run_arm(cfg: TrainConfig, arm: str, imbalance_spec: str, world) -> dict[str, Any]:
    """Train one arm in this MPI job; returns the Trainer's summary."""
    import research.comm.partial  # noqa: F401  (registers solo, majority, sync)
    import research.comm.ps  # noqa: F401  (registers ps)
    from research.train.loop import Trainer

    spec = "none" if arm == "balanced" else imbalance_spec
    imbalance = parse_imbalance(spec, size=world.size, seed=cfg.seed)
    callbacks = []  # the Trainer binds a parameter server itself
    trainer = Trainer(cfg, world, imbalance=imbalance, callbacks=callbacks)
    if world.rank == 0:
        print(
            f"r0 | arm {arm} seed {cfg.seed}: {trainer.total_steps} steps, "
            f"imbalance {spec} -> {cfg.run_dir}",
            flush=True,
        )
    return trainer.run()


def resolve_auto(spec: str, seconds: float) -> str:
    """``spec`` with every ``=auto`` value replaced by ``seconds``."""
    return re.sub(r"=auto\b", f"={seconds:g}", spec)


def run_experiment(
    cfg: Any,
    root: Path,
    world,
    *,
    plot: Callable[[Path, float], list[Path]] | None = None,
) -> list[dict[str, Any]]:
    """Every arm for every seed; rank 0 then writes the table and figures.

    ``cfg``: ``experiments.eager_sgd.Config``; ``plot(root, target_acc)`` draws
    the figures and returns their paths (None: no figures).
    """
    spec = run_arms(cfg, base_config(cfg), root, world)
    rows: list[dict[str, Any]] = []
    if world.rank == 0:
        from research.studies.eager_sgd_page import render

        rows = write_results(root, cfg.target_acc, spec)
        print("\n".join(render(root)), flush=True)
        if plot is not None:
            for path in plot(root, cfg.target_acc):
                print(f"r0 | figure {path}", flush=True)
        print(f"r0 | results in {root}", flush=True)
    world.barrier()
    return rows


def base_config(cfg: Any) -> TrainConfig:
    """The arms' shared TrainConfig: the synchronous arm's; each sets its own."""
    import dataclasses

    return dataclasses.replace(
        cfg.train, strategy=cfg.train.strategy.to(cfg.allreduce_strategy)
    )


def run_arms(cfg: Any, base: TrainConfig, root: Path, world) -> str:
    """Train every arm (and the balanced reference) for every seed into ``root``.

    Returns the imbalance spec the arms ran under (``auto`` resolved).
    """
    arms = (["balanced"] if cfg.reference_steps > 0 else []) + list(cfg.arms)
    spec = cfg.imbalance
    for seed in cfg.seeds:
        for arm in arms:
            run = arm_config(
                base,
                arm,
                seed,
                root,
                allreduce_strategy=cfg.allreduce_strategy,
                full_every=cfg.full_every,
                reference_steps=cfg.reference_steps,
            )
            summary = run_arm(run, arm, spec, world)
            if arm == "balanced" and "=auto" in spec:
                # Measured once (first seed), then the same delay for every arm.
                step = max(summary["median_step_s_per_rank"])
                spec = resolve_auto(spec, round(cfg.delay_scale * step, 3))
                if world.rank == 0:
                    print(
                        f"r0 | no-imbalance step {step * 1e3:.1f} ms: imbalance {spec}",
                        flush=True,
                    )
    return spec


# -- reading run folders (rank 0, or later from disk) ----------------------------------
def load_run(run_dir: str | Path, target_acc: float) -> dict[str, Any]:
    """The numbers of one arm's run folder (summary.json and metrics.jsonl only).

    Times are on the training clock without evaluation and without step 1, which
    compiles (cached across the arms of a job: seconds that differ with the
    arms' order and say nothing about a strategy). The time to the target adds
    the arm's own set-up before its first step (``start_s``: its strategy's
    start-up), the same for every arm.
    """
    from research.rundir import read_metrics

    run_dir = Path(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = read_metrics(run_dir)
    steps = [r for r in rows if r.get("kind") != "eval" and "step_time" in r]
    evals = [r for r in rows if r.get("kind") == "eval"]
    first = steps[0]["step_time"] if steps and steps[0].get("step") == 1 else 0.0
    start = summary.get("start_s") or 0.0
    reached = next(
        (start + e["train_time"] - first for e in evals if e["test_acc"] >= target_acc),
        None,
    )
    contrib = [r["comm_contributors"] for r in steps if "comm_contributors" in r]
    # Mean lateness (rounds) of the gradients applied: every rank's, from the
    # rounds (partial collectives), or this rank's pushes (parameter server).
    age = [r.get("comm_mean_age", r.get("comm_staleness")) for r in steps]
    age = [a for a in age if a is not None]
    arm, _, seed = run_dir.name.rpartition("-s")
    return {
        "arm": arm,
        "seed": int(seed),
        "steps": summary["steps"],
        "samples_per_s": summary["samples_per_s"],
        "median_step_s": summary["median_step_s"],
        "step_without_delay_s": summary.get("median_step_without_delay_s"),
        "mean_step_s": (
            statistics.fmean(r["step_time"] for r in steps[1:])
            if len(steps) > 1
            else None
        ),
        "time_to_target_s": reached,
        "final_test_acc": summary.get("final_test_acc"),
        "mean_contributors": (
            statistics.fmean(contrib) if contrib and arm != "ps" else None
        ),
        "mean_age": statistics.fmean(age) if age else None,
        "train_time_s": summary["train_time_s"] - first,
        "start_s": summary.get("start_s"),
        "world_size": summary["world_size"],
    }


def write_results(
    root: Path, target_acc: float, imbalance: str = ""
) -> list[dict[str, Any]]:
    """Read every arm's folder under ``root``; write ``results.json`` and
    ``table.md`` (the page's part of the run); returns the rows per arm."""
    from research.studies.eager_sgd_page import aggregate, render

    runs = [
        load_run(d, target_acc)
        for d in sorted(root.iterdir())
        if (d / "summary.json").exists()
    ]
    rows = aggregate(runs)
    (root / "results.json").write_text(
        json.dumps(
            {"target_acc": target_acc, "imbalance": imbalance, "runs": runs},
            indent=2,
        )
        + "\n"
    )
    (root / "table.md").write_text("\n".join(render(root)) + "\n")
    return rows
