"""One synchronous data-parallel training run of any model and dataset.

    python -m experiments.train                      # 2 ranks, embedded synthetic task
    python -m experiments.train --np 4 --strategy host --trace
    mpiexec -n 8 python -m experiments.train --model resnet18 --dataset cifar10 \\
        --data-dir ~/data/cifar-10-batches-py --model-opt stem=cifar
    sbatch scripts/slurm.sbatch experiments.train --model resnet50 ...   # a cluster

    # checkpoint every 50 steps; the same command again (after a crash, a time
    # limit, or with a larger --steps) resumes from the newest committed step
    python -m experiments.train --run-dir runs/r50 --steps 2000 \\
        --checkpoint deepfreeze --checkpoint-every 50

Started without mpiexec it relaunches itself under the environment's mpiexec with
``--np`` ranks. The run folder gets config.json, metrics.jsonl, summary.json
(with ``resumed_from`` and a fingerprint of the final parameters), trace.json
(with --trace), curves.png and, with --checkpoint, checkpoints/. ``--threads N``
sets each rank's compute threads (XLA:CPU's intra-op pool, through PJRT_NPROC).
"""

from __future__ import annotations

import sys

from research.cli import (
    ArgumentParser,
    add_train_flags,
    config_from_args,
    listing,
)
from research.launch import UsageError, fail_usage, maybe_relaunch, set_threads
from research.train.config import TrainConfig

PROG = "python -m experiments.train"


def parse(argv: list[str]):
    p = ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=__import__("argparse").RawDescriptionHelpFormatter,
    )
    defaults = TrainConfig(epochs=3, eval_every=100)
    add_train_flags(p, defaults, checkpointing=True)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.list:
        print(listing())
        return None
    cfg = config_from_args(args, PROG)
    maybe_relaunch("experiments.train", argv, args.np_, cfg.threads)
    set_threads(cfg.threads)
    from research.runner import run_training

    try:
        return run_training(cfg, "train")
    except UsageError as e:  # bad data files, batch larger than a shard, ...
        fail_usage(PROG, str(e))


if __name__ == "__main__":
    main()
