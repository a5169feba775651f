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

import dataclasses
import sys

from research.cli import parse_config
from research.launch import UsageError, fail_usage, maybe_relaunch, set_threads
from research.studies.presets import NP_HELP, ExperimentConfig
from research.train.config import PARALLEL, TrainConfig, flag

PROG = "python -m experiments.train"


@dataclasses.dataclass
class Config(ExperimentConfig):
    """One run: the training config (checkpoint flags included) and its ranks."""

    np: int = flag(2, NP_HELP, PARALLEL)


def get_config(model: str | None = None, paper_scale: bool = False) -> Config:
    """The defaults: the embedded synthetic task, 3 epochs, 2 ranks."""
    train = TrainConfig(epochs=3, eval_every=100)
    return Config(train=dataclasses.replace(train, model=model or train.model))


def parse(argv: list[str]) -> Config:
    return parse_config(argv, get_config, prog=PROG, doc=__doc__)


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    cfg = parse(argv)
    maybe_relaunch("experiments.train", argv, cfg.np, cfg.train.threads, cfg.hosts)
    set_threads(cfg.train.threads)
    from research.runner import run_training

    try:
        return run_training(cfg.train, "train")
    except UsageError as e:  # bad data files, batch larger than a shard, ...
        fail_usage(PROG, str(e))


if __name__ == "__main__":
    main()
