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
32x32 inputs, 10 classes, batch 2 per rank (was 4), 5 steps of which the first
3 (compilation; first touch of overlap's two allgather buffers) are left out
(was 6 and 2); ranks 1, 2 and 4, but
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

Measured (this 2-core CPU machine, 2026-11-23, under ``flock
/work/bench.lock``; load average 5-7 throughout: a scalability benchmark and
other helpers' tests shared the cores). The default did NOT fit 6 minutes here:
a first run (09:05-09:21 UTC, then 4 steps, cold compile cache for the new
batch size) was stopped by ``timeout 900`` at ResNet-50's 4 ranks; the 4-rank
job alone, rerun into the same folder with the current defaults (``--ranks 4``,
09:23-09:30, warm cache), took 6.5 minutes, so the whole default needs about
12 minutes on this loaded machine (it reuses the cache; use ``--ranks 1 4`` or
one model for a shorter look). The first run showed that overlap's step 3 is
still a warm-up step (its second allgather buffer is touched for the first
time), hence 3 of 5 steps are now left out. The table is ``--report-only
--warmup 3`` over both: 1- and 2-rank rows are ONE step (step 4), 4-rank rows
the median of two, so read differences under ~20% as noise. ms; "auto" is the
emulated link at which host's allreduce equals its compute (VGG-16 1.25 Gb/s
at 2 ranks, 1.45 at 4; ResNet-50 3.03 at 2, 2.64 at 4)::

    vgg16      ranks link   step compute  comm hidden exposed vs host eff opt MB
    host           1 real   1079     992     0     -       0  1.00x 1.00 128.3
    overlap        1 real    611     548    57  100%       0  1.77x 1.77 128.3
    host           2 real   1266     891   156    0%     156  1.00x 0.85 128.3
    fused          2 real   1616    1616     -     -       -  0.78x 0.67 128.3
    layerwise      2 real   1639    1299   558  100%       0  0.77x 0.66 128.3
    overlap        2 real    988     905   612   98%      11  1.28x 1.09  64.2
    host           4 real   1766    1117   378    0%     378  1.00x 0.61 128.3
    fused          4 real   1641    1641     -     -       -  1.08x 0.66 128.3
    layerwise      4 real   1924    1715   826   95%      37  0.92x 0.56 128.3
    overlap        4 real   1887    1663   914   84%     146  0.94x 0.57  32.1
    host           2 auto   1638     637   913    0%     913  1.00x 0.66 128.3
    lw 1MB         2 auto   1175     565   873   48%     457  1.39x 0.92 128.3
    lw 4MB         2 auto   1113     553   861   54%     394  1.47x 0.97 128.3
    layerwise      2 auto   1333     903   861   61%     340  1.23x 0.81 128.3
    lw 100MB       2 auto   1715     932   861   19%     699  0.96x 0.63 128.3
    overlap        2 auto   1060     739   910   70%     276  1.55x 1.02  64.2
    host           4 auto   2291     988  1145    0%    1145  1.00x 0.47 128.3
    layerwise      4 auto   1825    1277  1177   71%     342  1.25x 0.59 128.3
    overlap        4 auto   1577    1037  1519   69%     465  1.45x 0.68  32.1
    resnet50
    host           1 real    372     302     0     -       0  1.00x 1.00  89.8
    overlap        1 real    772     616    50  100%       0  0.48x 0.48  89.8
    host           2 real    682     284   325    0%     325  1.00x 0.55  89.8
    fused          2 real    706     706     -     -       -  0.97x 0.53  89.8
    layerwise      2 real    605     507   178  100%       0  1.13x 0.62  89.8
    overlap        2 real    487     400   187  100%       1  1.40x 0.76  44.9
    host           4 real    698     428   204    0%     204  1.00x 0.53  89.8
    fused          4 real    639     639     -     -       -  1.09x 0.58  89.8
    layerwise      4 real    698     578   330   94%      19  1.00x 0.53  89.8
    overlap        4 real    605     461   332   87%      44  1.16x 0.62  22.4
    host           2 auto    782     410   285    0%     285  1.00x 0.48  89.8
    lw 1MB         2 auto    472     288   289   63%     106  1.66x 0.79  89.8
    lw 4MB         2 auto    463     415   297  100%       0  1.69x 0.80  89.8
    layerwise      2 auto    737     467   485   55%     216  1.06x 0.51  89.8
    lw 100MB       2 auto    950     476   418    0%     423  0.82x 0.39  89.8
    overlap        2 auto    553     258   499   61%     196  1.41x 0.67  44.9
    host           4 auto    901     189   681    0%     681  1.00x 0.41  89.8
    layerwise      4 auto    742     462   428   55%     190  1.21x 0.50  89.8
    overlap        4 auto    644     520   583   88%      71  1.40x 0.58  22.4

    targets (emulated link), as printed:
      VGG-16 2 ranks: hides 70% (>= 80%: FAIL); step 1060 <= 1456 (PASS);
        at or ahead of layerwise 1333 (PASS; the best bucket, 4 MiB: 1113)
      VGG-16 4 ranks: hides 69% (FAIL); step 1577 <= 2429 (PASS); 1.45x host
        (>= 1.3x: PASS); ahead of layerwise 1825 (PASS)
      ResNet-50 2 ranks: hides 61% (FAIL); step 553 <= 677 (PASS); ahead of
        layerwise 737 (PASS), not of its 4 MiB bucket (463)
      ResNet-50 4 ranks: hides 88% (PASS); step 644 <= 791 (PASS); 1.40x host
        (PASS); ahead of layerwise 742 (PASS)

Reading it: after removing the host copies (``research.train.overlapped``'s
docstring: one-rank VGG-16 CPU time per step 0.81 s against host's 0.79-0.95 s,
was 1.2-1.7 s), overlap is no longer slower on one rank for VGG-16 (611 vs
1079 ms here is load noise in host's single step, not a real gain); for
ResNet-50 the one measured single-rank step still cost 2x host's (772 vs 372
ms; the CPU-time measurement gave 0.29 s at step 4 of a quieter run, so part
of it is load; its 18 stages, 37 programs and 18 pairs of collectives per step
cost dispatch the monolithic step does not pay). With the emulated link
overlap beats host by 1.40-1.55x at 2 and 4 ranks (the 1.3x target at 4 ranks:
PASS for both models), meets the step-time bound everywhere and leads the
25 MiB layerwise everywhere, but hides 61-70% rather than 80% except
ResNet-50 at 4 ranks (88%): on 2 shared cores the progress thread's copies
contend with the ranks' compute. On the real shared-memory link overlap is
ahead of host at 2 ranks (1.28x, 1.40x) and for ResNet-50 at 4 (1.16x), level
with it for VGG-16 at 4 (0.94x: 4 ranks on 2 cores, the copies cost compute);
fused (no overlap) is at 0.8-1.1x host. The bucket sweep shows what DDP's
tuning does: 4 MiB buckets beat the 25 MiB default by 1.2-1.6x at 2 ranks and
are about as fast as overlap (VGG-16) or faster (ResNet-50); 100 MiB (one
bucket: no overlap) is worst. Efficiencies above 1 (VGG-16) come from host's
noisy single-rank step, the denominator. The step figures move by 20-30%
between runs on this shared machine. Figures of this run: ``breakdown.png``,
``speedup.png``, ``timeline-vgg16.png`` (4 ranks, emulated link: the
reduce-scatters run under the backward pass, the allgathers under the next
forward), ``timeline-resnet50.png``.
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
