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
1 min 16 s, nothing else running, load 4-5 from the run itself; calibration
made by the run). Micro-benchmark, ResNet-50-sized vector (25,557,032 float32),
3 reps, time as a ratio to the dense allreduce of the same run, real
shared-memory link / emulated 10 Gb/s (max of measured and link model)::

    P  density  best sparse (real, emulated)   auto: picked, / dense (emul)
    2  0.1%     ssar_sag 0.020, 0.016           ssar_rd, 0.019
    2  1%       ssar_sag 0.120, 0.096           ssar_rd, 0.131
    2  10%      dsar_sag 0.835, 0.811           dense,   1.000
    2  50%      ssar_rd  1.393, 1.393           dense,   1.000
    4  0.1%     ssar_sag 0.028, 0.028           ssar_rd, 0.069
    4  1%       ssar_sag 0.142, 0.142           ssar_rd, 0.403
    4  10%      dsar_sag 0.874, 0.874           dense,   1.000
    4  50%      ssar_rd  2.096, 2.096           dense,   1.000

    bytes sent per rank / model: within 1.05x at every point (worst 0.998)

    training, cnn_small, 4 ranks, emulated 10 Gb/s, 160 steps, one seed:
    arm                  final acc  to 80%  ms/step  MB/step/rank
    dense                0.9004     1.1 s   35.0     0.608
    top-k 1% + EF        0.8926     3.0 s   36.8     0.035
    top-k 1%, no EF      0.8872     2.9 s   35.5     0.033
    top-k 1% + EF, 4-bit 0.8940     2.6 s   35.8     0.030

Against the issue's targets: sparse/dense at 0.1% is 0.069 (<= 0.1: met) and at
1% 0.403 (<= 0.3: not met, although the best fixed algorithm, ssar_sag, reaches
0.142); ``auto`` stays within 5% of dense from 10% on (met) but picks
recursive doubling where split-allgather is 1.2-2.8x faster at low density (not
met: the calibrated gamma/alpha on 2 shared cores do not rank the two sparse
algorithms right); bytes match the model (met); top-k 1% with error feedback
ends 0.78 points below dense (target 0.5: not met in this one 160-step seed),
and without it 0.54 points lower still (not "visibly" worse at this length).
The paper's order-of-magnitude claim holds at 0.1-1% density on this machine
(the best sparse algorithm 7-60x faster than the dense allreduce); at 10% and
beyond dense wins.
"""

from __future__ import annotations

import sys
from typing import Any

from research.cli import config_from_args
from research.launch import UsageError, fail_usage, maybe_relaunch, set_threads
from research.studies.presets import enable_compile_cache, experiment_parser, run_root
from research.studies.sparcml import ARMS, DENSITIES, RESNET50_DIM, run_experiment
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
    try:
        Link.parse(args.bench_link)
    except ValueError as e:
        fail_usage(PROG, f"--bench-link: {e}")
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
    set_threads(args.threads)
    enable_compile_cache()
    from research.comm.world import get_world, install_abort_on_error

    world = get_world()
    install_abort_on_error()
    root = run_root(args.run_dir, world, "sparcml")
    try:
        return run_experiment(args, root, world, base)
    except UsageError as e:
        fail_usage(PROG, str(e))


if __name__ == "__main__":
    main()
