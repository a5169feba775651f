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

from research.comm.process.env import launched_by_mpi
from research.entry.cli import override, parse_config
from research.flags import PARALLEL, flag, nested
from research.studies.presets import ExperimentConfig, LaunchConfig
from research.threads import set_threads
from research.train.config import TrainConfig
from research.usage import UsageError, fail_usage

PROG = "python -m experiments.train"


@dataclasses.dataclass
class Config(ExperimentConfig):
    """One run: the training config (checkpoint flags included) and its ranks."""

    launch: LaunchConfig = nested(lambda: LaunchConfig(np=2))
    max_restarts: int = flag(
        0,
        "when the job fails (a lost node, a stalled collective, a rank's error), "
        "relaunch it up to N times on the nodes that still answer and resume "
        "from the newest committed checkpoint (research/entry/restart.py); "
        "default %(default)s",
        PARALLEL,
        metavar="N",
    )

    def problem(self) -> str | None:
        if self.max_restarts < 0:
            return f"--max-restarts must be >= 0, got {self.max_restarts}"
        return None


def get_config(model: str | None = None, paper_scale: bool = False) -> Config:
    """The defaults: the embedded synthetic task, 3 epochs, 2 ranks."""
    train = TrainConfig(epochs=3, eval_every=100)
    return Config(train=override(train, **{"model.name": model or train.model.name}))


def parse(argv: list[str]) -> Config:
    return parse_config(argv, get_config, prog=PROG, doc=__doc__)


def with_restarts(cfg: Config, argv: list[str]) -> int:
    """Run the job under :func:`research.entry.restart.run` (``--max-restarts``)."""
    from research.entry import restart
    from research.rundir import default_run_dir

    train = cfg.train
    job = restart.Job(
        "experiments.train",
        argv,
        np=cfg.launch.np,
        threads=train.threads,
        run_dir=train.run_dir or default_run_dir("train"),
        batch_size=train.batch_size,
        lr=train.lr,
        scale_lr=train.scale_lr,
        hosts=cfg.launch.hosts,
        max_restarts=cfg.max_restarts,
    )
    return restart.run(job)


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    cfg = parse(argv)
    if cfg.max_restarts and not launched_by_mpi() and cfg.launch.np > 0:
        raise SystemExit(with_restarts(cfg, argv))
    cfg.launch.create("experiments.train", argv, cfg.train.threads)
    set_threads(cfg.train.threads)
    from research.entry.run import run_training

    try:
        return run_training(cfg.train, "train")
    except UsageError as e:  # bad data files, batch larger than a shard, ...
        fail_usage(PROG, str(e))


if __name__ == "__main__":
    main()
