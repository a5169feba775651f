"""SC19 scalability: ranks, threads, batch size, stragglers and update gaps.

Paper: S. Li, B. Nicolae, J. Wozniak, G. Bosilca, *Understanding Scalability and
Fine-Grain Parallelism of Synchronous Data Parallel Training*, MLHPC@SC19
(Horovod on Theta KNL; a CANDLE benchmark, most likely NT3, and ResNet-50).
Findings: (1) pipelining backward, gradient reduction and weight update
mitigates stragglers only partially; (2) there are large delays between weight
updates, which can hide background work such as checkpointing.

The two findings here (default run below; 2 shared cores, so read with care):

(1) Pipelining mitigates stragglers only partially: PARTLY REPRODUCED. On an
emulated 1 Gb/s link (one step's communication about 90-100 ms), a 200 ms
delay on one of 2 ranks raised the median step by 96 ms (layerwise), 165 ms
(host) and 181 ms (overlap): every strategy absorbed part of it (18-104 ms),
none all of it, and no more than about one step's communication. But here the
pipelined strategies did not absorb measurably more than host (host 35-41 ms at
50 and 200 ms; layerwise 4 and 104; overlap 25 and 18): with no delay at all
the ranks' arrivals already differ by about 100 ms (host, layerwise) on 2
contended cores, so the ordering among strategies is within the noise.

(2) Large gaps between weight updates can hide background work such as
checkpointing: the gaps REPRODUCED, the hiding NOT MEASURABLE here. Between two
updates of the same stage 147 ms (host) and 210 ms (overlap, per stage) pass,
96-100% of each update-to-update interval free of updates; DeepFreeze every 3
steps ran 250-462 ms of background work per save, 97-98% of it outside every
update, blocking the training thread 5 ms (overlap) and 130 ms (host) per save.
Its step-time overhead measured -23% and -8%: below the run-to-run noise (20-30%
here), since the background thread competes with training for the same 2 cores.

The latest default run, 2026-11-24 on a quiet machine, is
``docs/results/scalability.md`` (generated from its run folder). The figures
below are the 2026-11-23 runs'.

Measured (2026-11-23, ``flock /work/bench.lock timeout 900 python -m
experiments.scalability``: 179 s with a warm compile cache; load average 7.1 at
its start and 4.9 at its end: other helpers' tests ran beside it). Median step
ms of the measured steps, samples/s, efficiency against 1 rank (weak: T1/TP;
strong: T1/(P TP)), compute, communication, exposed, hidden fraction::

    ranks, weak scaling (batch 8 per rank)
    nt3      host        1x1    8   106    75.4  1.00   102     0     0
    nt3      host        2x1    8   154   104.1  0.69   129    16    16
    nt3      host        4x1    8   363    88.1  0.29   237   105   105
    nt3      layerwise   2x1    8   114   139.8  0.93    93     8     8
    nt3      layerwise   4x1    8   339    94.3  0.31   187   142   146
    nt3      overlap     2x1    8   210    76.1  0.50   167    56    13  76%
    nt3      overlap     4x1    8   362    88.5  0.29   273   232    85  64%
    resnet50 host        1x1    8   446    17.9  1.00   402     0     0
    resnet50 host        2x1    8   516    31.0  0.86   354   131   131
    resnet50 host        4x1    8  1309    24.4  0.34  1003   192   192
    resnet50 overlap     2x1    8   580    27.6  0.77   482   283    15  95%
    resnet50 overlap     4x1    8  1659    19.3  0.27   987  1209   502  58%
    ranks, strong scaling (global batch 8)
    nt3      host        2x1    4    81    99.0  0.66    67     8     8
    nt3      host        4x1    2   147    54.4  0.18    59    69    69
    nt3      layerwise   2x1    4    70   113.5  0.75    50     7     7
    nt3      layerwise   4x1    2   166    48.2  0.16    60    44    45
    nt3      overlap     2x1    4    95    83.9  0.56    79    24     0  99%
    nt3      overlap     4x1    2   156    51.2  0.17    68   145    79  46%
    threads x ranks at 2 cores (global batch 16)
    nt3      host        1 rank x 2 threads       227    70.5
    nt3      host        2 ranks x 1 thread       154   104.1
    batch per rank, host, 2 ranks: 4 -> 99.0, 8 -> 104.1, 16 -> 137.2 samples/s
    straggler, nt3, 2 ranks, 1 Gb/s, 10 steps: step ms at delay 0 / 50 / 200
    (absorbed ms at 50 / 200; the straggler's lateness at 200)
    host       224 / 234 / 389   (41 / 35; late 284)
    layerwise  214 / 260 / 310   ( 4 / 104; late 162)
    overlap    147 / 172 / 328   (25 / 18; late 191)
    DeepFreeze every 3 steps, nt3, 2 ranks, 10 steps: see finding (2)

Rerun on the merged code (2026-11-23 10:26 UTC, same command, 214 s, warm
cache, load 2.9 at the start and 5.5 at the end, no other job): the same
picture. Weak scaling at 4 ranks 0.32-0.45 (NT3) and 0.33-0.37 (ResNet-50);
overlap hides 74-100% of its communication. A 200 ms straggler raised the step
by 186 ms (host), 106 ms (layerwise) and 189 ms (overlap): absorbed 14, 94 and
11 ms, so again partly, and most by layerwise. With DeepFreeze every 3 steps
98-100% of the background work fell in the update gaps (gaps 104-105 ms, 95-100%
of each step free); overhead +23% (host, 36 ms blocking per save) and +13%
(overlap, 1 ms blocking), both within this machine's noise.

What 2 shared cores can show: 4 ranks on 2 cores halve each rank's CPU, so
weak-scaling efficiency at 4 ranks is at most 0.5 before any communication
(measured 0.27-0.34), and strong scaling at 4 ranks (batch 2 per rank) is
dominated by per-step overheads; 2 ranks x 1 thread beat 1 rank x 2 threads
(1.48x) because XLA:CPU's second thread helps NT3's small convolutions less than
a second rank does; larger batches per rank raise throughput (1.39x from 4 to
16). A first default run under the same lock (load 7-10, 3 measured steps in
every sweep) gave efficiencies above 1 and absorbed delays of -290 to +286 ms:
that noise is why the straggler and checkpoint sweeps now run 10 steps. Rerun
on a node of its own (or a cluster, below) before reading any ratio as a
property of the strategies.

What runs (``research.studies.scalability``: points; ``..._report``: table;
``..._plots``: figures): one mpiexec job per (ranks, threads) group, each
training its configurations a few steps with the timeline on; every
configuration appends a row to ``RUN_DIR/results.jsonl``; the table and figures
are then re-read from those rows and traces. Sweeps (``--sweeps``):

* ``ranks``: 1, 2, 4 ranks x host, layerwise, overlap; weak scaling (batch 8
  per rank) and strong scaling (global batch 8); efficiency against 1 rank;
* ``threads``: threads x ranks at ``--cores`` (2 here: 1x2 and 2x1), host;
* ``batch``: batch per rank 4, 8, 16 at 2 ranks, host;
* ``straggler``: the last of 2 ranks is held 50 and 200 ms after its backward
  pass, every measured step (spinning: busy, as a rank with more work); host,
  layerwise, overlap on an emulated 1 Gb/s
  link (``--straggler-link``), where communication takes time a NIC would and
  a pipeline has something to hide the delay behind; delay absorbed = delay -
  increase of the median step over the same run without delay;
* ``checkpoint``: DeepFreeze every 3 steps at 2 ranks with host and overlap;
  the update gaps of the same run without checkpointing, the checkpoint's
  blocking time, its background time, the share of that background time that
  ran outside every weight update, and the step-time overhead.

Reductions made for the laptop default (2 cores, about 6 minutes): NT3 on 1,024
features instead of 60,483 (its layers unchanged: 2.7 M parameters instead of
155 M), ResNet-50 on 32x32 inputs and 10 classes (23.5 M parameters); 5 steps
per configuration of which the first 2 (compilation) are left out, 10 in the
straggler and checkpoint sweeps (``--long-steps``); every sweep on NT3 (the
first of ``--models``), ResNet-50 only in the weak-scaling ranks sweep with
host and overlap (``--scope full`` runs everything for every model: each new
batch size or strategy is a 30-60 s compilation of ResNet-50 here).
``--paper-scale``: full NT3 (60,483 features) and 224x224 ResNet-50 with 1000
classes, batch 32 per rank, 20 steps (5 left out), delays 0.1-0.4 s on the real
link, for a cluster.

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
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from research.cli import override, parse_config
from research.launch import relaunch
from research.studies.scalability import MODELS, STRATEGIES, SWEEPS, jobs, plan
from research.train.config import OUTPUT, flag

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
    steps: int = flag(5, "steps per configuration; default %(default)s", SC19)
    warmup: int = flag(2, "first steps left out; default %(default)s", SC19)
    long_steps: int = flag(
        10, "steps in the straggler and checkpoint sweeps; default %(default)s", SC19
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
    from research.comm.env import launched_by_mpi
    from research.studies.scalability_report import cluster_lists, report

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
        code = relaunch("experiments.scalability", rest, n, t)
        if code:
            raise SystemExit(code)
    text = report([root], root, cfg.plots)
    print(text, flush=True)
    print(f"results: {root} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return text


if __name__ == "__main__":
    main()
