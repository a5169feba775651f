"""DeepFreeze: sharded asynchronous multi-level checkpointing against the usual ways.

Paper: B. Nicolae, J. Li, J. M. Wozniak, G. Bosilca, M. Dorier, F. Cappello,
*DeepFreeze: Towards Scalable Asynchronous Checkpointing of Deep Learning
Models*, CCGrid'20 (https://doi.org/10.1109/CCGrid49817.2020.00-76). Claims:
checkpointing as data-parallel codes do it (rank 0 writes the model, the others
wait) stalls training; fine-grain snapshots, a checkpoint split evenly over all
ranks and written in the background, first to node-local storage and then to
the parallel file system, make checkpoints nearly free and scale with the
ranks. Anchors: CheckFreq (FAST'21) keeps the overhead under 3.5%; Gemini
(SOSP'23) checkpoints every iteration with no measurable overhead.

What runs: one MPI job trains one model once, its steps shared out in periods of
``--window`` steps among the arms (saver x interval) in shuffled rounds, with
periods without checkpoints as a placebo (``research.studies.checkpoint_bench``).
Savers: ``rank0-blocking`` (Horovod/Keras), ``orbax-blocking`` (every rank its
shard), ``orbax-async-rank0`` and ``deepfreeze`` (``research.checkpoint.deepfreeze``).
It prints one table (blocking time, time to commit on each tier, overhead at
``--interval`` with 90% intervals, restore time, bytes and writer CPU), the
targets with PASS/FAIL, the in-flight policies (wait, skip) and figures. On 2
shared cores no core is idle, so DeepFreeze's background work is taken from
training (the paper's accelerators leave host cores idle); blocking time is the
robust comparison, overheads move with the machine's load.

Commands::

    python -m experiments.deepfreeze        # 4 ranks, CANDLE P1B2, about 5 minutes
    python -m experiments.deepfreeze --model resnet50 --interval 20 --window 20
    python -m experiments.deepfreeze --model vgg16 --tiers persistent
    python -m experiments.deepfreeze --model candle_nt3 --np 2 --sweep-ranks 1
    python -m scripts.plot_deepfreeze runs/deepfreeze-<time>   # figures again
    # a cluster: full-size models, one job per rank count into one folder
    sbatch -N 16 --ntasks-per-node=4 scripts/slurm.sbatch experiments.deepfreeze \\
        --model resnet50 --paper-scale --run-dir runs/df --fast-dir "$TMPDIR/df"
    sbatch -N 4 --ntasks-per-node=4 scripts/slurm.sbatch experiments.deepfreeze \\
        --model resnet50 --paper-scale --run-dir runs/df --job ranks
    # on ImageNet: ArrayRecord shards once (random access without a file per
    # image on the parallel file system), then the same jobs reading them
    python -m scripts.imagenet_to_arrayrecord /data/imagenet /scratch/imagenet-ar
    sbatch -N 16 --ntasks-per-node=4 --cpus-per-task=16 scripts/slurm.sbatch \\
        experiments.deepfreeze --model resnet50 --paper-scale \\
        --dataset imagenet --data-dir /scratch/imagenet-ar --data-workers 8 \\
        --run-dir runs/df-in --fast-dir "$TMPDIR/df"

With ``--dataset imagenet`` (research/data/imagenet) the model is the
paper's (default ResNet-50, also without ``--paper-scale``), its classes the
folder's, its crops ``--data-opt image_size=S`` (224 at paper scale), and
every checkpoint holds the input pipeline's position with the parameters.

Results: ``docs/results/deepfreeze.md``; earlier runs: ``docs/journal.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from research.checkpoint.savers import list_savers
from research.entry.cli import override, parse_config, without
from research.flags import CKPT, OUTPUT, flag, nested
from research.studies.deepfreeze import (
    check_flags,
    launch_jobs,
    report,
    run_job,
)
from research.studies.presets import (
    ExperimentConfig,
    start_job,
    with_dataset,
    with_model,
)
from research.train.config import (
    ModelConfig,
    RecordsConfig,
    StrategyConfig,
    TrainConfig,
)
from research.usage import UsageError, fail_usage

PROG = "python -m experiments.deepfreeze"

#: --model shortcuts: laptop-sized variants and the synthetic task that fits them.
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "candle": {
        "model": "candle_p1b2",
        "model_options": {"features": 4096},
        "dataset": "synthetic_tabular",
        "data_options": {"features": 4096, "n_train": 2048, "n_test": 256},
    },
    "candle_nt3": {
        "model": "candle_nt3",
        "model_options": {"features": 2048},
        "dataset": "synthetic_nt3",
        "data_options": {"features": 2048, "n_train": 512, "n_test": 64},
    },
    "resnet50": {
        "model_options": {"stem": "imagenet", "image_size": 32},
        "data_options": {"image_size": 32, "n_train": 1024, "n_test": 128},
    },
    "vgg16": {
        "model_options": {"image_size": 32, "pooled_size": 1},
        "data_options": {"image_size": 32, "n_train": 1024, "n_test": 128},
    },
}

#: --paper-scale: the paper's model sizes (224x224, 1000 classes), for clusters.
PAPER_SCALE: dict[str, Any] = {
    "data.options": {
        "image_size": 224,
        "num_classes": 1000,
        "n_train": 2048,
        "n_test": 256,
    },
    "model.options": {"stem": "imagenet", "image_size": 224},
    "batch_size": 32,
    "rounds": 3,
    "np": 64,
}


def _train() -> TrainConfig:
    return TrainConfig(
        model=ModelConfig("candle"),
        strategy=StrategyConfig("sync"),
        batch_size=16,
        lr=0.01,
        warmup_steps=5,
        eval_every=0,
        records=RecordsConfig(log_every=1000, trace=True),
    )


@dataclasses.dataclass
class Config(ExperimentConfig):
    """The savers compared, the interleaved periods and DeepFreeze's knobs.

    The fast tier is ``train.checkpoint.fast_dir`` (``--fast-dir``).
    """

    train: TrainConfig = nested(_train)
    savers: list[str] = flag(
        None,
        "checkpoint savers compared (none is always the reference; see "
        "experiments.train --list); default all",
        CKPT,
        factory=list_savers,
        metavar="SAVER",
    )
    interval: int = flag(
        10, "checkpoint every N steps for the table; default %(default)s", CKPT
    )
    intervals: list[int] = flag(
        None,
        "more intervals for the overhead figure (rank0-blocking and deepfreeze); "
        "default %(default)s",
        CKPT,
        factory=lambda: [5],
        nargs="*",
    )
    rounds: int = flag(
        28,
        "rounds: periods per arm at --interval (and of the placebo); "
        "default %(default)s",
        CKPT,
    )
    minor_rounds: int = flag(
        3,
        "periods of the other arms (in-flight policies, --intervals); "
        "default %(default)s",
        CKPT,
    )
    window: int = flag(10, "steps per period; default %(default)s", CKPT)
    settle: int = flag(
        4,
        "steps after a period's last checkpoint before its work is waited for "
        "(charged); the rest of the period is the reference; default %(default)s",
        CKPT,
    )
    tiers: str = flag(
        "fast+persistent",
        "DeepFreeze tiers; default %(default)s",
        CKPT,
        choices=("fast+persistent", "persistent"),
    )
    snapshot: str = flag(
        "auto",
        "DeepFreeze snapshot mode; default %(default)s",
        CKPT,
        choices=("auto", "view", "host", "device"),
    )
    writer: str = flag(
        "process",
        "DeepFreeze writer: a niced helper process per rank, or a thread of the "
        "rank; default %(default)s",
        CKPT,
        choices=("process", "thread"),
    )
    nice: int = flag(
        10, "niceness of DeepFreeze's helper process; default %(default)s", CKPT
    )
    writer_priority: str = flag(
        "nice",
        "DeepFreeze's helper process under SCHED_IDLE (runs only on idle cores), "
        "or only niced; default %(default)s",
        CKPT,
        choices=("idle", "nice"),
    )
    bind: str = flag(
        "core",
        "laptop launches: bind each rank, with its writer and threads, to "
        "--threads cores (at least one), round robin (MPICH's -bind-to core), "
        "or let the OS move them (none). Unbound, 4 ranks on 2 cores gave "
        "2-3x wider placebo intervals and a DeepFreeze cost of 34-67 ms per "
        "checkpoint from run to run. Under your own mpiexec or srun, bind "
        "there (e.g. srun --cpu-bind=cores); default %(default)s",
        CKPT,
        choices=("core", "none"),
    )
    sweep_ranks: list[int] = flag(
        None,
        "extra jobs with these rank counts for the ranks figure (laptop only: "
        "started from here); default %(default)s",
        CKPT,
        factory=lambda: [1, 2],
        nargs="*",
    )
    job: str = flag("all", argparse.SUPPRESS, CKPT, choices=("all", "main", "ranks"))
    paper_scale: bool = flag(
        False,
        "the paper's model sizes at 224x224 (for clusters): synthetic images "
        "of 1000 classes, or with --dataset imagenet --data-dir DIR ImageNet's "
        "224x224 crops and classes",
        CKPT,
    )
    plots: bool = flag(True, "skip the figures", OUTPUT, name="--no-plots")

    def problem(self) -> str | None:
        """The first problem with the experiment's own values, or None."""
        return check_flags(self)


def select(given: dict[str, Any]) -> dict[str, Any]:
    """The preset the flags given choose: model, paper scale, dataset."""
    return {
        "model": given.get("train.model.name"),
        "paper_scale": bool(given.get("paper_scale", False)),
        "dataset": given.get("train.data.name"),
    }


def get_config(
    model: str | None = None, paper_scale: bool = False, dataset: str | None = None
) -> Config:
    """The experiment's config for a preset (explicit flags are applied over it).

    At paper scale ``--model`` names the full-size model, not a laptop preset
    (default ResNet-50: the paper's options are an image model's). On
    ImageNet the default model is ResNet-50 at any scale (the laptop default,
    CANDLE P1B2, reads tables); ``dataset`` keeps the data options it takes
    (:func:`~research.studies.presets.with_dataset`).
    """
    cfg = Config()
    if dataset == "imagenet":
        model = model or "resnet50"
    if paper_scale:
        cfg = override(cfg, **PAPER_SCALE, paper_scale=True)
        name = model or "resnet50"
        name = MODEL_PRESETS.get(name, {}).get("model", name)
        options = cfg.train.model.options
        if not name.startswith("resnet"):  # the stem is a ResNet's; VGG has none
            options = {k: v for k, v in options.items() if k != "stem"}
        cfg = override(cfg, **{"model.name": name, "model.options": options})
        return with_dataset(cfg, dataset)
    return with_dataset(with_model(cfg, model, MODEL_PRESETS), dataset)


def parse(argv: list[str]) -> Config:
    return parse_config(
        argv,
        get_config,
        prog=PROG,
        doc=__doc__,
        # Of the checkpointing fields only the fast tier applies here.
        hide=tuple(f"train.checkpoint.{k}" for k in ("saver", "every", "resume")),
        select=select,
    )


def _plot(root: Path) -> list[Path]:
    from research.studies.deepfreeze_plots import plot_all

    return plot_all(root)


def main(argv: list[str] | None = None) -> str | None:
    argv = sys.argv[1:] if argv is None else argv
    cfg = parse(argv)  # bad flags end here, before paying for MPI start-up
    plot = _plot if cfg.plots else None
    from research.comm.process.env import launched_by_mpi

    if not launched_by_mpi():
        from research.rundir import default_run_dir

        root = Path(cfg.train.run_dir or default_run_dir("deepfreeze")).absolute()
        root.mkdir(parents=True, exist_ok=True)
        argv = without(argv, "--run-dir")
        code = launch_jobs(cfg, argv, root, "experiments.deepfreeze")
        if code != 0:
            raise SystemExit(code)
        return report(root, plot)
    world, root = start_job(
        cfg.train.threads, cfg.train.run_dir, "deepfreeze", compile_cache=False
    )
    root.mkdir(parents=True, exist_ok=True)
    try:
        run_job(cfg, root)
    except UsageError as e:  # data or model settings: raised alike on every rank
        fail_usage(PROG, str(e))
    if cfg.job == "all" and world.rank == 0:  # started by the user's own mpiexec
        return report(root, plot)
    return None


if __name__ == "__main__":
    main()
