"""SC18 overlap: gradient averaging hidden behind the backward and forward passes.

Paper: S. Lee, A. Agrawal, P. Balaprakash, A. Choudhary, W. Liao, *Communication-
Efficient Parallelization Strategy for Deep Convolutional Neural Network
Training*, MLHPC@SC18 (authors' code: github.com/NU-CUCIS/pcnn). Claims: with
each layer's reduce-scatter started as its gradient appears, a sharded update and
allgathers that the next forward pass waits for layer by layer, VGG-16 and
ResNet-50 scale to 8192 Cori KNL cores with 2516x and 2734x speedups (baseline
not stated; most likely one process).

What runs: for each rank count (one mpiexec job each) and each model, a few
training steps with each strategy: ``host`` (blocking allreduce after the whole
backward pass), ``fused`` (mpi4jax inside the jitted step), ``layerwise`` (DDP
buckets, an allreduce started as each fills) and ``overlap`` (the SC18 scheme;
``research.comm.overlap``, ``research.train.overlapped``); on the real
(shared-memory) link and on an emulated one (``auto``: the bandwidth at which
host's allreduce takes as long as its compute, measured first in the same job;
``fused`` cannot run on it). One table per model: median step, compute,
communication, hidden fraction, exposed communication (the compute thread's
waits), speedup over ``host`` (same ranks and link), efficiency against
``host`` on 1 rank (per-rank batch fixed), optimizer memory per rank; rows
``lw <n>MB`` are layerwise's bucket sweep; then the issue's benchmark targets
as PASS/FAIL lines (measured, never asserted in tests). Figures in the run
folder: ``breakdown.png`` (compute / exposed communication / rest per run),
``speedup.png`` (against ranks), ``timeline-<model>.png`` (one step of the
overlap run with the most ranks, every rank, from its ``trace.json``).

Reduced default (the aim: under 6 minutes on 2 otherwise idle cores): the full
VGG-16 (fc 4096-4096 after a global pool) and ResNet-50 (ImageNet stem) on
32x32 inputs, 10 classes, batch 2 per rank (was 4), 4 steps of which the first
2 (compilation, first allgathers) are left out (was 6); ranks 1, 2 and 4, but
on 1 rank only ``host`` (the serial baseline every efficiency is against) and
``overlap`` (its single-rank cost); the emulated link at 2 and 4 ranks; the
layerwise bucket sweep (1, 4, 25, 100 MiB) only on the emulated link at 2
ranks (each rank has a core there), DDP's 25 MiB elsewhere. Compiled programs
are shared across runs and jobs through the disk cache
(``research.studies.presets.enable_compile_cache``). Everything else by flag:
``--ranks``, ``--models``, ``--strategies``, ``--links``, ``--emulated-ranks``,
``--bucket-mb``, ``--sweep-ranks``, ``--steps``, ``--batch-size``,
``--no-trace``, ``--no-figures``.

What this machine can and cannot show: 4 ranks share 2 cores and memory, so
on the real link moving bytes costs the CPU time the computation needs, and
overlap can at best hide the waiting, not the copying; the emulated link sleeps
on the progress thread as a NIC would move bytes, which is where the claims can
be checked. Not built: the FC-activation exchange for dense layers (VGG's dense
layers are one stage with the pool today; see the report of issue 9).

Commands::

    python -m experiments.overlap                           # the default above
    python -m experiments.overlap --ranks 2 --models resnet50 --steps 3 \\
        --strategies host overlap --links real auto          # a quick look
    python -m experiments.overlap --ranks 4 --emulated-ranks 4 --sweep-ranks 4 \\
        --bucket-mb 0.5 2 8 32 --models resnet50             # another sweep
    # paper scale in a batch job (the launcher's world size; ImageNet-size inputs)
    sbatch -N 64 --ntasks-per-node=4 scripts/slurm.sbatch experiments.overlap \\
        --paper-scale

Measured (this 2-core CPU machine, 2026-11-23, ``python -m experiments.overlap``
under ``timeout 900``; other jobs shared the cores, load average 3-8): the
default did NOT fit its 6-minute aim: after 15 minutes it was stopped in the
last job (4 ranks, ResNet-50), so ResNet-50's emulated-link rows at 4 ranks are
missing; the rows below are every point it measured (``report`` re-read them
from ``results.jsonl``). Medians of steps 3-6, ms; "auto" is the emulated link
at which host's allreduce equals its compute (1.08 Gb/s for VGG-16 at 2 ranks,
0.55 at 4; 2.99 for ResNet-50 at 2)::

    vgg16      ranks link   step  compute  comm  hidden exposed vs host opt MB
    host           2 auto   1777     664   1017     0%   1017   1.00x   128.3
    layerwise      2 auto   1515    1062   1038    64%    370   1.17x   128.3
    overlap        2 auto   1801    1207   1242    90%    124   0.99x    64.2
    host           4 auto   5693    2415   2993     0%   2993   1.00x   128.3
    layerwise      4 auto   4739    3050   3178    61%   1224   1.20x   128.3
    overlap        4 auto   4891    3313   3189    55%   1438   1.16x    32.1
    host           4 real   3874    2948    559     0%    559   1.00x   128.3
    fused          4 real   3025    3025      -      -      -   1.28x   128.3
    layerwise      4 real   5964    4062   3698    84%    581   0.65x   128.3
    overlap        4 real   5704    4319   2353    61%    929   0.68x    32.1
    resnet50
    host           2 auto    555     223    302     0%    302   1.00x    89.8
    layerwise      2 auto    758     442    453    60%    183   0.73x    89.8
    overlap        2 auto    532     306    385    84%     62   1.04x    44.9
    host           4 real   1542    1058    356     0%    356   1.00x    89.8
    fused          4 real    991     991      -      -      -   1.56x    89.8
    layerwise      4 real   1162     740    792    65%    278   1.33x    89.8
    overlap        4 real    893     652    635    87%     82   1.73x    22.4

    targets (emulated link):
      VGG-16 2 ranks: hides 90% (>= 80%: PASS); step 1801 <= 1.1 max + one
        stage's comm = 1986 (PASS); at or ahead of layerwise: FAIL (1801/1515)
      VGG-16 4 ranks: hides 55% (FAIL); step bound PASS (4891 <= 5235);
        1.16x host (>= 1.3x: FAIL); at or ahead of layerwise within 5%: PASS
      ResNet-50 2 ranks: hides 84% (PASS); step 532 vs bound 523 (FAIL by 2%);
        1.04x host; ahead of layerwise (PASS)
      ResNet-50 4 ranks: not measured (stopped)

Reading it: the scheme hides what the paper says it hides where a link moves
the bytes (84-90% of communication hidden at 2 ranks, exposed communication
down from 0.3-1.0 s to 0.06-0.12 s), and it shards the optimizer state (1/P of
the momentum per rank, measured). It does not turn that into the step-time
gains the targets ask for here, for two measured reasons: its stage-by-stage
step costs more compute on one rank than the monolithic one (VGG-16 1079 vs
673 ms, ResNet-50 487 vs 337 ms: the per-stage flattening into padded shard
buffers and the sharded update, not the staged backward itself, which
``scripts/bench_stages`` measured at 0.98-1.03x), and with 4 ranks on 2 cores
the ranks' compute contends for the cores, so there is not enough idle CPU to
hide 3 s of communication behind. On the real shared-memory link ResNet-50 at
4 ranks is the one place overlap leads (1.73x host, 87% hidden), because there
the blocking host allreduce itself contends for the cores. The step figures
move by 20-30% between runs on this shared machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from research.launch import relaunch, set_threads
from research.studies.overlap import (
    LINKED,
    MODELS,
    STRATEGIES,
    figures,
    report,
    run_point,
)

PROG = "python -m experiments.overlap"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--models",
        nargs="+",
        default=list(MODELS),
        help="models (vgg16, resnet50 with the reduced options above; any other "
        "registered model with its defaults and --image-size)",
    )
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    p.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument(
        "--links",
        nargs="+",
        default=["real", "auto"],
        help="real, auto (comm = host's compute) or a spec like 10gbps:2us",
    )
    p.add_argument(
        "--emulated-ranks",
        nargs="+",
        type=int,
        default=[2, 4],
        help="world sizes that also run the emulated link(s)",
    )
    p.add_argument(
        "--bucket-mb",
        nargs="+",
        type=float,
        default=[1, 4, 25, 100],
        help="layerwise bucket sweep (MiB), on the emulated link at --sweep-ranks; "
        "25 elsewhere",
    )
    p.add_argument("--sweep-ranks", nargs="+", type=int, default=[2])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="steps left out (compilation; the first touch of overlap's two "
        "alternating allgather buffers)",
    )
    p.add_argument("--batch-size", type=int, default=2, help="per rank")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--figures", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument(
        "--trace",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write timelines (the figures' timeline excerpt reads them)",
    )
    p.add_argument("--threads", type=int, default=1, help="compute threads per rank")
    p.add_argument("--run-dir", default=None)
    p.add_argument("--paper-scale", action="store_true")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="re-read --run-dir (timings re-derived leaving out --warmup steps)",
    )
    p.add_argument("--point", action="store_true", help=argparse.SUPPRESS)
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.paper_scale:
        p.set_defaults(
            image_size=224, num_classes=1000, batch_size=32, steps=20, warmup=5
        )
        args = p.parse_args(argv)
    bad = [s for s in args.strategies if s not in STRATEGIES]
    if bad:
        p.error(f"unknown strategy {bad[0]!r}; choose from {', '.join(STRATEGIES)}")
    if any(k == "auto" for k in args.links) and "host" not in args.strategies:
        p.error("--links auto needs host (its compute sets the link)")
    if not set(args.strategies) & set(LINKED) and args.links != ["real"]:
        p.error("only host, layerwise and overlap run on an emulated link")
    if args.steps <= args.warmup:
        p.error("--steps must exceed --warmup")
    return args


def main(argv: list[str] | None = None) -> str | None:
    from research.comm.env import launched_by_mpi

    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if launched_by_mpi():
        set_threads(args.threads)
        from research.comm.world import get_world, install_abort_on_error
        from research.studies.presets import enable_compile_cache, run_root

        enable_compile_cache()
        world = get_world()
        install_abort_on_error()
        root = run_root(args.run_dir, world, "overlap")
        run_point(args, root, world)
        if args.point or world.rank != 0:
            return None
        text = report(root, args.models)  # a batch job: its own size only
        print(text, flush=True)
        if args.figures:
            figures(root)
        return text
    from research.rundir import default_run_dir

    root = Path(args.run_dir or default_run_dir("overlap")).absolute()
    if args.report_only:
        if not args.run_dir:
            raise SystemExit("--report-only needs --run-dir")
        text = report(root, args.models, warmup=args.warmup)
        print(text, flush=True)
        if args.figures:
            for path in figures(root, warmup=args.warmup):
                print(f"figure: {path}", flush=True)
        return text
    for n in args.ranks:
        rest = [*argv, "--run-dir", str(root), "--point"]
        code = relaunch("experiments.overlap", rest, n, args.threads)
        if code:
            raise SystemExit(code)
    text = report(root, args.models)
    print(text, flush=True)
    if args.figures:
        for path in figures(root):
            print(f"figure: {path}", flush=True)
    print(f"results: {root}", flush=True)
    return text


if __name__ == "__main__":
    main()
