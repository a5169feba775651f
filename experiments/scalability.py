"""SC19 scalability: ranks, threads, batch size, stragglers and update gaps.

Paper: S. Li, B. Nicolae, J. Wozniak, G. Bosilca, *Understanding Scalability and
Fine-Grain Parallelism of Synchronous Data Parallel Training*, MLHPC@SC19
(Horovod on Theta KNL; a CANDLE benchmark, most likely NT3, and ResNet-50).
Findings: (1) pipelining backward, gradient reduction and weight update
mitigates stragglers only partially; (2) there are large delays between weight
updates, which can hide background work such as checkpointing.

MEASURED TABLE AND FINDINGS: filled in from the default run below.

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

Reductions made for the laptop default (2 cores, about 6 minutes): NT3 on 2,048
features instead of 60,483 (its layers unchanged: 4.4 M parameters instead of
155 M), ResNet-50 on 32x32 inputs and 10 classes (23.5 M parameters); 5 steps
per configuration of which the first 2 (compilation) are left out; the
straggler and checkpoint sweeps on NT3 only (the first of ``--models``).
``--paper-scale``: full NT3 (60,483 features) and 224x224 ResNet-50 with 1000
classes, batch 32 per rank, 20 steps (5 left out), delays 0.1-0.4 s on the real
link, for a cluster.

Commands::

    python -m experiments.scalability                     # the default above
    python -m experiments.scalability --sweeps ranks --models nt3 --ranks 1 2
    python -m experiments.scalability --sweeps straggler checkpoint --steps 8
    python -m experiments.scalability --merge runs/scalability-A runs/other
    # cluster: one batch job per configuration, then merge the task folders
    python -m experiments.scalability --paper-scale --ranks 1 2 4 8 16 32 64 \\
        --cores 64 --emit-cluster runs/sc19        # writes runs/sc19/submit.sh
    bash runs/sc19/submit.sh                       # sbatch lines (qsub: the same)
    python -m experiments.scalability --merge runs/sc19
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from research.launch import relaunch, set_threads
from research.studies.scalability import MODELS, STRATEGIES, SWEEPS, jobs, plan

PROG = "python -m experiments.scalability"
PAPER = dict(
    steps=20,
    long_steps=40,
    warmup=5,
    batch_size=32,
    batches=[16, 32, 64],
    delays=[0.1, 0.2, 0.4],
    straggler_link="real",
    scope="full",
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sweeps", nargs="+", default=list(SWEEPS), choices=SWEEPS)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument(
        "--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES
    )
    p.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--steps", type=int, default=5, help="steps per configuration")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out")
    p.add_argument(
        "--long-steps",
        type=int,
        default=10,
        help="steps in the straggler and checkpoint sweeps",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=8,
        help="batch per rank (weak) and global batch (strong)",
    )
    p.add_argument(
        "--batches",
        nargs="+",
        type=int,
        default=[4, 8, 16],
        help="batch sweep, per rank",
    )
    p.add_argument(
        "--nt3-features",
        type=int,
        default=None,
        help="NT3 input length (default 1024; 60483 with --paper-scale)",
    )
    p.add_argument("--cores", type=int, default=2, help="threads x ranks sweep")
    p.add_argument(
        "--delays",
        nargs="+",
        type=float,
        default=[0.05, 0.2],
        help="straggler delays, seconds",
    )
    p.add_argument(
        "--straggler-link",
        default="1gbps",
        help="link of the straggler sweep (real or e.g. 10gbps:2us)",
    )
    p.add_argument(
        "--straggler-ranks",
        type=int,
        default=2,
        help="ranks of the straggler and checkpoint sweeps",
    )
    p.add_argument("--checkpoint-every", type=int, default=3)
    p.add_argument(
        "--scope",
        choices=("laptop", "full"),
        default="laptop",
        help="laptop: every sweep for the first model, the weak ranks "
        "sweep (host, overlap) for the others; full: everything",
    )
    p.add_argument("--paper-scale", action="store_true")
    p.add_argument("--run-dir", default=None)
    p.add_argument("--no-plots", action="store_true")
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="RUN_DIR",
        help="only gather these run folders into the table and figures "
        "(into the first, or --run-dir)",
    )
    p.add_argument(
        "--emit-cluster",
        metavar="DIR",
        help="write one flag file per job group and submit.sh; run nothing",
    )
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--points", nargs="+", help=argparse.SUPPRESS)
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.paper_scale:
        p.set_defaults(**PAPER)  # explicit flags still win
        args = p.parse_args(argv)
    if args.steps <= args.warmup:
        p.error("--steps must exceed --warmup")
    if min(args.ranks) < 1 or args.cores < 1 or args.straggler_ranks < 2:
        p.error("--ranks and --cores must be >= 1, --straggler-ranks >= 2")
    if any(d <= 0 for d in args.delays):
        p.error("--delays must be > 0")
    return args


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
    args = parse(argv)
    if args.merge:
        text = report(args.merge, args.run_dir or args.merge[0], not args.no_plots)
        print(text, flush=True)
        return text
    points = plan(args)
    if args.emit_cluster:
        files, cmds = cluster_lists(points, _sweep_flags(argv), args.emit_cluster)
        print(f"{len(points)} configurations in {len(files)} flag files; submit:")
        print(cmds, flush=True)
        return cmds
    if launched_by_mpi():
        set_threads(args.threads)
        from research.comm.world import get_world, install_abort_on_error
        from research.studies.presets import enable_compile_cache, run_root
        from research.studies.scalability import run_points

        enable_compile_cache()
        world = get_world()
        install_abort_on_error()
        root = run_root(args.run_dir, world, "scalability")
        ids = args.points or jobs(points).get((world.size, args.threads), [])
        run_points(ids, args, root, world)
        if args.points or world.rank != 0:
            return None
        text = report([root], root, not args.no_plots)
        print(text, flush=True)
        return text
    from research.rundir import default_run_dir

    root = Path(args.run_dir or default_run_dir("scalability")).absolute()
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
    text = report([root], root, not args.no_plots)
    print(text, flush=True)
    print(f"results: {root} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return text


if __name__ == "__main__":
    main()
