"""DeepFreeze's logic: the interleaved checkpointing job, its table and targets.

``python -m experiments.deepfreeze`` (the paper, the commands and the measured
table are in its docstring) parses the flags, starts the jobs with
:func:`launch_jobs` (or runs :func:`run_job` when started under mpiexec) and
prints :func:`report`; the table (:mod:`research.studies.deepfreeze_page`)
reads nothing but the jobs' JSON files.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from research.comm.process.malloc import launch_env
from research.entry.cli import check_private_dir
from research.entry.launch import (
    bind_args,
    check_may_launch,
    launch_command,
    mpiexec_path,
)
from research.threads import thread_env

#: Rounds of the extra jobs for the ranks figure (blocking times only).
RANKS_JOB_ROUNDS = 2


def check_flags(cfg: Any) -> str | None:
    """The first problem with the experiment's own values as one line, or None
    (``cfg``: ``experiments.deepfreeze.Config``)."""
    if min([cfg.interval, cfg.window, cfg.rounds, *cfg.intervals]) < 1:
        return "--interval, --intervals, --window and --rounds must be >= 1"
    if cfg.interval > cfg.window or max(cfg.intervals, default=1) > cfg.window:
        return f"intervals must not exceed --window ({cfg.window})"
    if not 0 < cfg.settle < cfg.window:
        return f"--settle must be between 1 and --window - 1 ({cfg.window - 1})"
    if cfg.minor_rounds < 1:
        return "--minor-rounds must be >= 1"
    from research.checkpoint.savers import check_saver_options

    for saver in cfg.savers:
        problem = check_saver_options(saver, {})
        if problem:
            return f"--savers: {problem}"
    fast = cfg.train.checkpoint.fast_dir
    if cfg.tiers != "persistent" and fast not in ("auto", None):
        return check_private_dir(fast, "--fast-dir")
    return None


# -- inside an MPI job -----------------------------------------------------------------
def arms_and_configs(cfg: Any) -> tuple[dict, dict, dict]:
    """The arms ``{name: (saver, interval)}``, a config per saver, and the
    minor arms ``{name: periods}`` (no target depends on them)."""
    from research.checkpoint import CheckpointConfig

    fast = None if cfg.tiers == "persistent" else cfg.train.checkpoint.fast_dir
    df = CheckpointConfig(
        saver="deepfreeze",
        fast_dir=fast,
        snapshot=cfg.snapshot,
        writer=cfg.writer,
        nice=cfg.nice,
        idle=cfg.writer_priority == "idle",
    )
    configs = {s: CheckpointConfig(saver=s) for s in cfg.savers}
    arms: dict[str, tuple[str, int]] = {"none": ("none", 0)}
    for s in cfg.savers:
        arms[f"{s}@{cfg.interval}"] = (s, cfg.interval)
    if "deepfreeze" in configs:
        configs["deepfreeze"] = df
        if cfg.job != "ranks":
            # Requests while one is in flight: every step, wait and skip policies.
            configs["deepfreeze-skip"] = dataclasses.replace(df, on_busy="skip")
            arms["deepfreeze@1"] = ("deepfreeze", 1)
            arms["deepfreeze-skip@1"] = ("deepfreeze-skip", 1)
    if cfg.job != "ranks":
        for s in ("rank0-blocking", "deepfreeze"):
            for i in cfg.intervals:
                if s in configs and i != cfg.interval:
                    arms[f"{s}@{i}"] = (s, i)
    minor = {
        a: cfg.minor_rounds for a, (_, i) in arms.items() if i not in (0, cfg.interval)
    }
    return arms, configs, minor


def run_job(cfg: Any, root: Path) -> dict[str, Any]:
    """One MPI job: the interleaved run; rank 0 writes ``<root>/<job>-np<P>.json``
    (``cfg``: ``experiments.deepfreeze.Config``)."""
    from research.comm.world import get_world, install_abort_on_error
    from research.studies.checkpoint_bench import run_interleaved
    from research.train.process import freeze_imports

    logging.getLogger("absl").setLevel(logging.ERROR)  # Orbax's per-save chatter
    world = get_world()
    install_abort_on_error()
    freeze_imports()
    job = "ranks" if cfg.job == "ranks" else "main"
    train = dataclasses.replace(
        cfg.train,
        run_dir=str(root / f"{job}-np{world.size}"),
        progress=False,
        records=dataclasses.replace(
            cfg.train.records, trace=cfg.train.records.trace and job != "ranks"
        ),
    )
    arms, configs, minor = arms_and_configs(cfg)
    # The ranks figure needs blocking times only: a few rounds are plenty.
    rounds = min(RANKS_JOB_ROUNDS, cfg.rounds) if job == "ranks" else cfg.rounds
    if world.rank == 0:
        print(
            f"r0 | {job} job, {world.size} ranks: {len(arms)} arms x {rounds} "
            f"rounds of {cfg.window}-step periods (settle {cfg.settle}) "
            f"-> {train.run_dir}",
            flush=True,
        )
    out = run_interleaved(
        world,
        train,
        configs,
        arms,
        rounds=rounds,
        window=cfg.window,
        settle=cfg.settle,
        minor=minor,
        seed=cfg.train.seed,
    )
    out.update(job=job, interval=cfg.interval, tiers=cfg.tiers)
    # Which cores each rank could run on (--bind core: its own), for the record.
    out["cpu_affinity"] = world.comm.allgather(sorted(os.sched_getaffinity(0)))
    if world.rank == 0:
        path = root / f"{job}-np{world.size}.json"
        path.write_text(json.dumps(out, indent=1) + "\n")
        print(f"r0 | wrote {path}", flush=True)
    world.barrier()
    return out


def launch_jobs(cfg: Any, argv: list[str], root: Path, module: str) -> int:
    """Start the main job and the ranks-sweep jobs under mpiexec, one at a time.

    Each job runs ``python -m module argv --run-dir root --job JOB``; with
    ``cfg.bind == "core"`` each rank is bound to ``cfg.train.threads`` cores (at
    least one; :func:`research.entry.launch.bind_args`), and so are its writer
    process and threads.
    """
    env = dict(launch_env(os.environ), **thread_env(cfg.train.threads))
    env["PYTHONUNBUFFERED"] = "1"
    check_may_launch()
    mpiexec = mpiexec_path()
    bind: list[str] = []
    if cfg.bind == "core" and cfg.train.threads < 1:
        print(
            "note: --bind core needs --threads >= 1 (cores per rank); with XLA's "
            "default threads the ranks run unbound",
            file=sys.stderr,
            flush=True,
        )
    elif cfg.bind == "core":
        bind = bind_args(mpiexec, cfg.train.threads) or []
        if not bind:
            print(
                f"warning: {mpiexec} is not MPICH's Hydra, so --bind core is not "
                "applied: ranks run unbound (bind them with your launcher's own "
                "option, or pass --bind none to silence this)",
                file=sys.stderr,
                flush=True,
            )
    rest = [
        sys.executable,
        "-m",
        module,
        *argv,
        "--run-dir",
        str(root),
    ]
    np_ = cfg.launch.np
    jobs = [(np_, "main")] + [(n, "ranks") for n in cfg.sweep_ranks if n != np_]
    for n, job in jobs:
        launcher, extra = launch_command(n, cfg.launch.hosts)
        cmd = [*launcher, *bind, *rest, "--job", job]
        code = subprocess.call(cmd, env={**env, **extra})
        if code != 0:
            return code
    return 0


def report(root: Path, plot: Callable[[Path], list[Path]] | None = None) -> str | None:
    """Table (printed, table.md) and figures from the job files in ``root``.

    ``plot(root)`` draws the figures and returns their paths (None: no figures).
    """
    from research.studies.deepfreeze_page import format_table, load_results

    main, _ = load_results(root)
    if main is None:
        return None
    text = format_table(main)
    (root / "table.md").write_text(text + "\n")
    print(text, flush=True)
    if plot is not None:
        for path in plot(root):
            print(f"figure {path}", flush=True)
    print(f"results in {root}", flush=True)
    return text
