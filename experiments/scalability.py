"""SC19 scalability: ranks, threads, batch size, stragglers and update gaps.

Paper: S. Li, B. Nicolae, J. Wozniak, G. Bosilca, *Understanding Scalability and
Fine-Grain Parallelism of Synchronous Data Parallel Training*, MLHPC@SC19
(Horovod on Theta KNL; a CANDLE benchmark, most likely NT3, and ResNet-50).
Findings: (1) pipelining backward, gradient reduction and weight update
mitigates stragglers only partially; (2) there are large delays between weight
updates, which can hide background work such as checkpointing.

What runs (``research.studies.scalability``): one mpiexec job per (ranks,
threads) group, each training its configurations a few steps with the timeline
on; every configuration appends a row to ``RUN_DIR/results.jsonl``, from which
the table and figures are made. Sweeps (``--sweeps``): ``ranks`` (1, 2, 4 ranks
x host, layerwise, overlap; weak and strong scaling), ``threads`` (threads x
ranks at ``--cores``), ``batch`` (4, 8, 16 per rank), ``straggler`` (the last
rank held 50 and 200 ms after its backward pass, on an emulated 1 Gb/s link:
how much delay each strategy absorbs) and ``checkpoint`` (DeepFreeze every 3
steps: how much of its background work falls between weight updates). Laptop
default (about 6 minutes): NT3 on 1,024 features, ResNet-50 on 32x32 inputs;
``--paper-scale`` is the full models for a cluster. On 2 shared cores 4 ranks
halve each rank's CPU and background work competes with training; run-to-run
noise is 20-30%.

Commands::

    python -m experiments.scalability                     # the default above
    python -m experiments.scalability --sweeps ranks --models nt3 --ranks 1 2
    python -m experiments.scalability --sweeps straggler checkpoint --long-steps 20
    python -m experiments.scalability --merge runs/scalability-A runs/other
    # cluster: one batch job per configuration, then merge the task folders
    python -m experiments.scalability --paper-scale --ranks 1 2 4 8 16 32 64 \\
        --cores 64 --emit-cluster runs/sc19        # writes runs/sc19/submit.sh
    bash runs/sc19/submit.sh                       # sbatch lines (qsub: the same)
    python -m experiments.scalability --merge runs/sc19

Results: ``docs/results/scalability.md``; earlier runs: ``docs/journal.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from research.entry.cli import override, parse_config
from research.entry.launch import relaunch
from research.flags import OUTPUT, flag
from research.studies.presets import HOSTS_HELP
from research.studies.scalability import MODELS, STRATEGIES, SWEEPS, jobs, plan

PROG = "python -m experiments.scalability"
SC19, RUN = "sweeps", "runs and their folders"

#: --paper-scale: the paper's settings (flags given explicitly still win).
PAPER: dict[str, Any] = dict(
    steps=20,
    long_steps=40,
    warmup=5,
    batch_size=32,
    batches=[16, 32, 64],
    delays=[0.1, 0.2, 0.4],
    straggler_link="real",
    scope="full",
)


@dataclasses.dataclass
class Config:
    """The sweeps, their sizes, and where their runs go."""

    sweeps: list[str] = flag(
        None, "default %(default)s", SC19, factory=lambda: list(SWEEPS), choices=SWEEPS
    )
    models: list[str] = flag(
        None, "default %(default)s", SC19, factory=lambda: list(MODELS), choices=MODELS
    )
    strategies: list[str] = flag(
        None,
        "default %(default)s",
        SC19,
        factory=lambda: list(STRATEGIES),
        choices=STRATEGIES,
    )
    ranks: list[int] = flag(
        None, "default %(default)s", SC19, factory=lambda: [1, 2, 4]
    )
    hosts: str = flag("", HOSTS_HELP, SC19, metavar="HOSTS")
    steps: int = flag(
        22,
        "steps per configuration; default %(default)s: 20 measured after the "
        "warm-up, enough for an interval over the steps",
        SC19,
    )
    warmup: int = flag(2, "first steps left out; default %(default)s", SC19)
    long_steps: int = flag(
        22, "steps in the straggler and checkpoint sweeps; default %(default)s", SC19
    )
    batch_size: int = flag(
        8, "batch per rank (weak) and global batch (strong); default %(default)s", SC19
    )
    batches: list[int] = flag(
        None,
        "batch sweep, per rank; default %(default)s",
        SC19,
        factory=lambda: [4, 8, 16],
    )
    nt3_features: int | None = flag(
        None,
        "NT3 input length (default 1024; 60483 with --paper-scale)",
        SC19,
        type=int,
    )
    cores: int = flag(2, "threads x ranks sweep; default %(default)s", SC19)
    delays: list[float] = flag(
        None,
        "straggler delays, seconds; default %(default)s",
        SC19,
        factory=lambda: [0.05, 0.2],
    )
    straggler_link: str = flag(
        "1gbps",
        "link of the straggler sweep (real or e.g. 10gbps:2us); default %(default)s",
        SC19,
    )
    straggler_ranks: int = flag(
        2, "ranks of the straggler and checkpoint sweeps; default %(default)s", SC19
    )
    checkpoint_every: int = flag(
        3, "checkpoint sweep: every N steps; default %(default)s", SC19
    )
    scope: str = flag(
        "laptop",
        "laptop: every sweep for the first model, the weak ranks sweep (host, "
        "overlap) for the others; full: everything; default %(default)s",
        SC19,
        choices=("laptop", "full"),
    )
    paper_scale: bool = flag(False, "the paper's settings (for clusters)", SC19)
    run_dir: str | None = flag(
        None, "run folder (default runs/scalability-<timestamp>)", RUN, type=str
    )
    plots: bool = flag(True, "skip the figures", OUTPUT, name="--no-plots")
    merge: list[str] | None = flag(
        None,
        "only gather these run folders into the table and figures (into the "
        "first, or --run-dir)",
        RUN,
        type=str,
        nargs="+",
        metavar="RUN_DIR",
    )
    emit_cluster: str | None = flag(
        None,
        "write one flag file per job group and submit.sh; run nothing",
        RUN,
        type=str,
        metavar="DIR",
    )
    # Set by the driver on the jobs it launches.
    threads: int = flag(1, argparse.SUPPRESS, RUN)
    points: list[str] | None = flag(None, argparse.SUPPRESS, RUN, type=str, nargs="+")

    def problem(self) -> str | None:
        """The first problem with the values as one line, or None."""
        if self.steps <= self.warmup:
            return "--steps must exceed --warmup"
        if min(self.ranks) < 1 or self.cores < 1 or self.straggler_ranks < 2:
            return "--ranks and --cores must be >= 1, --straggler-ranks >= 2"
        if any(d <= 0 for d in self.delays):
            return "--delays must be > 0"
        return None


def get_config(model: str | None = None, paper_scale: bool = False) -> Config:
    """The laptop sweeps, or the paper's settings."""
    return override(Config(), **PAPER, paper_scale=True) if paper_scale else Config()


def parse(argv: list[str]) -> Config:
    return parse_config(argv, get_config, prog=PROG, doc=__doc__)


def _sweep_flags(argv: list[str]) -> list[str]:
    """``argv`` without the driver's own flags (for a cluster job's line)."""
    out, skip = [], False
    for a in argv:
        if a.startswith("--"):
            skip = a in ("--emit-cluster", "--run-dir", "--merge", "--points")
        if not skip:
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> str | None:
    from research.comm.process.env import launched_by_mpi
    from research.studies.scalability_page import report
    from research.studies.scalability_report import cluster_lists

    argv = sys.argv[1:] if argv is None else argv
    cfg = parse(argv)
    if cfg.merge:
        text = report(cfg.merge, cfg.run_dir or cfg.merge[0], cfg.plots)
        print(text, flush=True)
        return text
    points = plan(cfg)
    if cfg.emit_cluster:
        files, cmds = cluster_lists(points, _sweep_flags(argv), cfg.emit_cluster)
        print(f"{len(points)} configurations in {len(files)} flag files; submit:")
        print(cmds, flush=True)
        return cmds
    if launched_by_mpi():
        from research.studies.presets import start_job
        from research.studies.scalability import run_points

        world, root = start_job(cfg.threads, cfg.run_dir, "scalability")
        ids = cfg.points or jobs(points).get((world.size, cfg.threads), [])
        run_points(ids, cfg, root, world)
        if cfg.points or world.rank != 0:
            return None
        text = report([root], root, cfg.plots)
        print(text, flush=True)
        return text
    from research.rundir import default_run_dir

    root = Path(cfg.run_dir or default_run_dir("scalability")).absolute()
    groups = jobs(points)
    t0 = time.perf_counter()
    for k, ((n, t), ids) in enumerate(groups.items(), 1):
        print(
            f"[{k}/{len(groups)}] {n} rank(s) x {t} thread(s): {len(ids)} "
            f"configuration(s), {time.perf_counter() - t0:.0f} s so far",
            flush=True,
        )
        rest = [*argv, "--run-dir", str(root), "--threads", str(t), "--points", *ids]
        code = relaunch("experiments.scalability", rest, n, t, cfg.hosts)
        if code:
            raise SystemExit(code)
    text = report([root], root, cfg.plots)
    print(text, flush=True)
    print(f"results: {root} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return text


if __name__ == "__main__":
    main()
