"""SparCML: sparse allreduce micro-benchmark and top-k training with error feedback.

Paper: C. Renggli, S. Ashkboos, M. Aghagolzadeh, D. Alistarh, T. Hoefler,
*SparCML: High-Performance Sparse Communication for Machine Learning*, SC19
(https://arxiv.org/abs/1802.08021). Claims: allreduce collectives for sparse
inputs of different sizes per process (recursive doubling; split-allgather with
a sparse or dense result) that switch to a dense representation when the merged
result fills in, usable non-blocking and with low-precision values, give
order-of-magnitude savings in communication time over dense allreduce for
sparse gradients, and top-k training with error feedback keeps the accuracy of
dense training.

What runs (one MPI job, ``research/studies/sparcml.py``):

* micro-benchmark: every algorithm (``ssar_rd``, ``ssar_sag``, ``dsar_sag``),
  ``auto`` and the dense allreduce on a ResNet-50-sized float32 vector
  (``--dim``, 25,557,032) at densities 0.1%, 1%, 10%, 50%, at 2 ranks and at
  the job's size (4; 8 with ``--np 8``), on the real link and an emulated
  10 Gb/s link (``--bench-link``; times derived from each rank's real bytes and
  messages, see the study's docstring); bytes sent per rank against the cost
  model. The cost model is calibrated first for each P if no calibration file
  exists (``python -m scripts.calibrate_sparse``).
* training: the ``sparse`` strategy (``research.comm.sparse.strategy``) on
  ``cnn_small``, same steps for every arm: ``dense`` (host allreduce),
  ``topk_ef`` (top-k 1% with error feedback), ``topk_noef`` (without it) and
  ``topk_4bit`` (top-k 1% + error feedback + 4-bit values): final accuracy,
  time to ``--target-acc``, bytes per step. The arms run on the emulated
  10 Gb/s link by default (``--link real`` for plain shared memory), where the
  strategy's ``auto`` judges by that link (on shared memory it picks the dense
  allreduce for a model this small).

It prints both tables and the issue's targets as PASS/FAIL checks, and writes
``table.md``, ``results.json``, ``time_vs_density.png`` (with the model's
crossover marked) and ``accuracy.png`` to the run folder.

Commands::

    # laptop, the default (~6 minutes on 2 cores): 4 ranks, both parts
    python -m experiments.sparcml
    # quick look: a smaller vector, fewer steps
    python -m experiments.sparcml --dim 1000000 --reps 1 --steps 40
    # only one part
    python -m experiments.sparcml --arms            # benchmark only
    python -m experiments.sparcml --skip-bench      # training only
    # 8 ranks (benchmark at 2 and 8), per-layer top-k, 8-bit values
    python -m experiments.sparcml --np 8 --scope per-layer --bits 8
    # cluster: calibrate once per P on the nodes, then the real network link
    srun -n 16 python -m scripts.calibrate_sparse
    sbatch -N 4 --ntasks-per-node=4 scripts/slurm.sbatch experiments.sparcml \\
        --bench-link real --model resnet18 --steps 2000

Measured (this 2-core CPU machine, 2026-11-23, ``python -m experiments.sparcml``,
2 min 0 s, nothing else of ours running, load 3.4-5.3; calibration made by the
run, as below). Micro-benchmark, ResNet-50-sized vector (25,557,032 float32),
3 reps, time as a ratio to the dense allreduce of the same run, real
shared-memory link / emulated 10 Gb/s (max of measured and link model)::

    P  density  best fixed (real, emulated)   auto picked (emulated), / dense
    2  0.1%     ssar_sag 0.022, 0.014          ssar_sag, 0.014
    2  1%       ssar_sag 0.103, 0.067          ssar_sag, 0.067
    2  10%      dsar_sag 0.812, 0.600          dsar_sag, 0.600
    2  50%      dense    1.000, 1.000          dense,    1.000
    4  0.1%     ssar_sag 0.019, 0.019          ssar_sag, 0.019
    4  1%       ssar_sag 0.108, 0.108          ssar_sag, 0.108
    4  10%      dsar_sag 0.644, 0.644          dsar_sag, 0.644
    4  50%      dense    1.000, 1.000          dense,    1.000

    bytes sent per rank / model: within 1.05x at every point (worst 0.998)

    training, cnn_small, 4 ranks, emulated 10 Gb/s, 160 steps, 3 seeds:
    arm                  final acc        to 80%  ms/step  MB/step/rank
    dense                0.9085 +- .0072  1.1 s   24.4     0.608
    top-k 1% + EF        0.9004 +- .0068  2.2 s   29.4     0.052
    top-k 1%, no EF      0.8859 +- .0055  2.4 s   29.9     0.034
    top-k 1% + EF, 4-bit 0.9009 +- .0068  2.3 s   30.9     0.049

Against the issue's targets: sparse/dense on the emulated link at 4 ranks is
0.019 at 0.1% (<= 0.1: met) and 0.108 at 1% (<= 0.3: met); ``auto`` picks the
fastest algorithm at all 8 points of the emulated link (within 10%: met) and
is never above dense from 10% on (met); bytes match the model (met). On the
real link (no target) auto chose dense over dsar_sag at 2 ranks and 10% (1.18x
the best): the calibration's line through allreduces up to 16 MB predicted 20
ms for the 102 MB one that took 59 ms. Calibrating up to 64 MB since, a
benchmark-only rerun (``--arms``, 42 s, load 4) had auto choose the fastest
algorithm on the real link at 7 of 8 points and ssar_rd at 2 ranks and 50%
(1.10x dense), with every emulated-link check still met. Top-k 1% with error
feedback ends 0.81 points below dense: the 0.5-point target is not met, but
with a std of 0.7 over 3 seeds for each arm the gap's standard error is 0.57
points, so three seeds cannot tell 0.81 from 0.5 (nor, at 1.4 standard errors,
from 0). With 16 dense warm-up steps first (``--sparse-warmup 16``; Ok-Topk
and PowerSGD warm up too) the same 3 seeds end at 0.9035 +- 0.0062, 0.50
points below dense, at 0.141 MB per step (the warm-up's dense steps included;
49 s for that run, load 4-5). Without error feedback it is 1.45 points lower still
(visibly worse: met). The paper's order-of-magnitude claim holds at 0.1-1%
density here (the best sparse algorithm 9-50x faster than the dense allreduce);
at 10% dense-result split-allgather still wins (1.6x) and at 50% dense wins.

An earlier version of the cost model charged the split algorithms' final
concatenation as a scatter and calibrated with the median of float64 random
scatters; auto then took recursive doubling where split-allgather was 1.2-3.3x
faster (0.403 at 1%). Timing the pieces of the code the model walks fixed it
(``research/comm/sparse/cost.py``).
"""

from __future__ import annotations

import sys
from typing import Any

from research.cli import config_from_args
from research.launch import UsageError, fail_usage, maybe_relaunch
from research.studies.presets import experiment_parser, start_job
from research.studies.sparcml import (
    ARMS,
    COMM_BOUND,
    DENSITIES,
    RESNET50_DIM,
    run_experiment,
)
from research.train.config import TrainConfig

PROG = "python -m experiments.sparcml"


def build_parser():
    p = experiment_parser(
        PROG,
        __doc__,
        TrainConfig(
            model="cnn_small",
            steps=160,
            batch_size=32,
            eval_every=20,
            log_every=1,
            momentum=0.9,
            link="10gbps",
            strategy="host",  # each arm sets its own; host accepts the link
        ),
        np_=4,
    )
    g = p.add_argument_group("SparCML")
    g.add_argument("--dim", type=int, default=RESNET50_DIM, help="benchmark vector")
    g.add_argument(
        "--densities", nargs="+", type=float, default=list(DENSITIES), help="benchmark"
    )
    g.add_argument("--reps", type=int, default=3, help="timed calls per point")
    g.add_argument(
        "--bench-link", default="10gbps", help="emulated link of the benchmark"
    )
    g.add_argument("--skip-bench", action="store_true", help="training only")
    g.add_argument(
        "--arms",
        nargs="*",
        default=list(ARMS),
        choices=ARMS,
        help="training arms (none: benchmark only); default %(default)s",
    )
    g.add_argument("--train-density", type=float, default=0.01)
    g.add_argument("--bits", type=int, default=4, choices=(2, 4, 8))
    g.add_argument("--scope", default="global", choices=("global", "per-layer"))
    g.add_argument(
        "--sparse-warmup", type=int, default=0, help="dense steps before top-k"
    )
    g.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=[0, 1, 2],
        help="training seeds, every arm each (mean +- std); default %(default)s",
    )
    g.add_argument("--target-acc", type=float, default=0.8)
    c = p.add_argument_group("communication-bound comparison (--comm-bound)")
    c.add_argument(
        "--comm-bound",
        action="store_true",
        help="also train dense / top-k + EF / top-k 4-bit on big models",
    )
    c.add_argument(
        "--cb-models",
        nargs="+",
        default=["candle_p1b2", "resnet50"],
        choices=sorted(COMM_BOUND),
        help="default %(default)s",
    )
    c.add_argument(
        "--cb-links",
        nargs="+",
        default=["1gbps", "10gbps", "real"],
        help="default %(default)s",
    )
    c.add_argument("--cb-steps", type=int, default=60)
    c.add_argument("--cb-eval-every", type=int, default=10)
    c.add_argument(
        "--cb-target",
        type=float,
        default=None,
        help="test accuracy to reach (default: per model, 0.3 for P1B2, 0.2 else)",
    )
    g.add_argument("--no-plots", action="store_true", help="skip the figures")
    return p


def parse(argv: list[str]):
    from research.comm.link import Link

    args = build_parser().parse_args(argv)
    if args.dim < 1 or args.reps < 1:
        fail_usage(PROG, "--dim and --reps must be >= 1")
    if not all(0 < d <= 1 for d in args.densities):
        fail_usage(PROG, "--densities must lie in (0, 1]")
    if not 0 < args.train_density <= 1:
        fail_usage(PROG, "--train-density must lie in (0, 1]")
    for name, spec in [("--bench-link", args.bench_link)] + [
        ("--cb-links", x) for x in args.cb_links
    ]:
        try:
            Link.parse(spec)
        except ValueError as e:
            fail_usage(PROG, f"{name}: {e}")
    if args.cb_steps < 1:
        fail_usage(PROG, "--cb-steps must be >= 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.list:
        from research.cli import listing

        print(listing())
        return None
    base = config_from_args(args, PROG)  # validate before paying for MPI start-up
    maybe_relaunch("experiments.sparcml", argv, args.np_, args.threads)
    world, root = start_job(args, "sparcml")
    try:
        return run_experiment(args, root, world, base)
    except UsageError as e:
        fail_usage(PROG, str(e))


if __name__ == "__main__":
    main()
