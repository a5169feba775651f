"""eager-SGD: partial allreduce against synchronous SGD and a parameter server.

Paper: S. Li, T. Ben-Nun, S. Di Girolamo, D. Alistarh, T. Hoefler, *Taming Unbalanced
Training Workloads in Deep Learning with Partial Collective Operations*, PPoPP'20
(https://arxiv.org/abs/1908.04207). Claims: under load imbalance (each step 1-2
random ranks of 64 sleep 0.32 s), eager-SGD with solo/majority allreduce trains
ResNet-50 on ImageNet 1.29x faster than synchronous allreduce SGD (1.27x for an
LSTM on UCF101) and 2.64x faster than an asynchronous parameter server, without
losing accuracy.

What runs: one MPI job trains the same model for the same epochs under the same
injected imbalance with each arm in turn: ``allreduce`` (synchronous SGD,
``--allreduce-strategy``), ``solo`` and ``majority`` (eager-SGD,
``research.comm.partial``, staleness bound ``--full-every``), ``ps`` (an
asynchronous parameter server, ``research.comm.ps``) and ``balanced`` (no
imbalance: the reference step). It prints one table (throughput, step times,
time to ``--target-acc``, accuracy, contributors, gradient age; mean +- std over
``--seeds``) and the checks, and writes ``table.md``, ``results.json`` and the
figures. Laptop defaults against the paper: ``--full-every 4`` (paper 32),
momentum 0.7 (paper 0.9), a delay as long as a balanced step, spun rather than
slept (4 ranks share 2 cores: a sleeping straggler lends its core to the others,
so allreduce grows by about the delay). The server is no bottleneck for a 0.6 MB
model and 4 workers; the paper's 2.64x needs 64 workers pushing 100 MB through
one server (``--sweep`` shows where it turns).

Commands::

    python -m experiments.eager_sgd                   # 4 ranks, 2-5 minutes
    python -m experiments.eager_sgd --seeds 0 1 2     # mean +- std
    python -m experiments.eager_sgd --imbalance dist:exponential:mean=0.05
    python -m experiments.eager_sgd --dataset digits --seeds 0 1 2   # real data
    python -m experiments.eager_sgd --sweep           # where the server loses
    python -m experiments.eager_sgd --model resnet18 --epochs 2   # vgg16, candle
    python -m scripts.plot_eager_sgd runs/eager_sgd-<time>   # figures again
    sbatch -N 16 --ntasks-per-node=4 scripts/slurm.sbatch experiments.eager_sgd \\
        --paper-scale        # ResNet-50, 64 ranks, the paper's imbalance
    # the same on ImageNet: ArrayRecord shards once (random access without a
    # file per image on the parallel file system), then 224x224 crops of them
    python -m scripts.imagenet_to_arrayrecord /data/imagenet /scratch/imagenet-ar
    sbatch -N 16 --ntasks-per-node=4 --cpus-per-task=16 scripts/slurm.sbatch \\
        experiments.eager_sgd --paper-scale --dataset imagenet \\
        --data-dir /scratch/imagenet-ar --data-workers 8 --run-dir runs/eager-in

With ``--dataset imagenet`` (research/data/imagenet) every arm reads its own
pass over the same shards; the classes (1000) are the folder's, the crops
``--data-opt image_size=S`` (224 at paper scale), ``--data-opt
eval_examples=10000`` evaluates on part of val (every ``--eval-every`` steps
of every arm), and ``--data-workers`` sets each rank's decoding threads (a GPU
wants several).

Results: ``docs/results/eager_sgd.md``; earlier runs: ``docs/journal.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from research.entry.cli import override, parse_config
from research.flags import CKPT, OUTPUT, flag, nested
from research.studies.eager_sgd import (
    ARMS,
    DEFAULT_IMBALANCE,
    DEFAULT_TARGET,
    check_flags,
    run_experiment,
)
from research.studies.eager_sweep import (
    DEFAULT_FEATURES,
    DEFAULT_RANKS,
    SWEEP_DEFAULTS,
    check_sweep_flags,
    run_sweep_job,
    write_sweep,
)
from research.studies.presets import (
    ExperimentConfig,
    start_job,
    with_dataset,
    with_model,
)
from research.train.config import ModelConfig, RecordsConfig, TrainConfig
from research.usage import UsageError, fail_usage

PROG = "python -m experiments.eager_sgd"
EAGER = "eager-SGD"
SWEEP = (
    "parameter-server crossover sweep (one MPI job per rank count; defaults "
    "change to " + ", ".join(f"{k}={v}" for k, v in SWEEP_DEFAULTS.items()) + ")"
)

#: --model shortcuts: model options and the synthetic task that fits the model.
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "cnn_small": {},
    "resnet18": {
        "model_options": {"stem": "cifar", "image_size": 32},
        "data_options": {"image_size": 32},
    },
    "resnet50": {
        "model_options": {"stem": "cifar", "image_size": 32},
        "data_options": {"image_size": 32},
    },
    "vgg16": {
        "model_options": {"image_size": 32, "pooled_size": 1, "fc": (512, 512)},
        "data_options": {"image_size": 32},
    },
    "candle": {
        "model": "candle_p1b2",
        "model_options": {"features": 512},
        "dataset": "synthetic_tabular",
        "data_options": {"features": 512},
    },
}

#: --dataset digits (real data, research/data/digits.py): defaults that train
#: cnn_small on the 8x8 images to ~97% (explicit flags still win); 1437 training
#: images make 11 steps per epoch on 4 ranks of 32. Measured (4 ranks, fused,
#: 20 epochs): lr 0.05 reached 60%, lr 0.2 97.8%.
DIGITS_DEFAULTS: dict[str, Any] = {"lr": 0.2, "epochs": 20.0, "target_acc": 0.95}
#: cnn_small at 8x8: two 2x2 pools leave a 2x2 map; pooled_size 2 keeps it as it
#: is (the default 4 would repeat each value 4 times into the fc layer).
DIGITS_CNN_OPTIONS = {"image_size": 8, "channels": 1, "pooled_size": 2}

#: --paper-scale: the paper's ResNet-50 setting (flags given explicitly still win).
#: The model, rank count, imbalance and staleness bound are the paper's; the data
#: are the synthetic task at 224x224 and 1000 classes (the full model, so the
#: same 102 MB per allreduce), cycled for a fixed number of steps, because 1.28M
#: generated images would not fit in memory; accuracy on it is not ImageNet
#: accuracy. With --dataset imagenet (with_dataset) only image_size stays: the
#: classes and examples are the dataset's.
PAPER_SCALE: dict[str, Any] = {
    "model.name": "resnet50",
    "momentum": 0.9,
    "steps": 2000,
    "batch_size": 64,
    "lr": 0.1,
    "scale_lr": True,
    "schedule": "step",
    "warmup_steps": 200,
    "imbalance": "random:k=1-2:seconds=0.32",
    "full_every": 32,
    "np": 64,
    "data.options": {
        "image_size": 224,
        "num_classes": 1000,
        "n_train": 4096,
        "n_test": 1024,
    },
    "model.options": {"stem": "imagenet", "image_size": 224},
    "eval_every": 200,
    "target_acc": 0.5,
    "reference_steps": 200,
}


def _train() -> TrainConfig:
    return TrainConfig(
        model=ModelConfig("cnn_small"),
        epochs=4.0,
        batch_size=32,
        eval_every=16,
        records=RecordsConfig(log_every=1, trace=True),
        momentum=0.7,
    )


@dataclasses.dataclass
class Config(ExperimentConfig):
    """The arms, the imbalance, and the parameter-server sweep."""

    train: TrainConfig = nested(_train)
    arms: list[str] = flag(
        None,
        "arms to run, in order; default %(default)s",
        EAGER,
        factory=lambda: list(ARMS),
        choices=ARMS,
    )
    imbalance: str = flag(
        DEFAULT_IMBALANCE,
        "injected imbalance (research.imbalance grammar: none, "
        "fixed:ranks=1:seconds=0.1, random:k=1-2:seconds=0.32, "
        "dist:exponential:mean=0.05; optional :start=S and :how=sleep|spin, "
        "spin keeping the straggler's core busy); a value 'auto' is --delay-scale "
        "times the balanced reference's median step time; default %(default)s",
        EAGER,
    )
    delay_scale: float = flag(
        1.0,
        "an 'auto' delay in --imbalance is this times the no-imbalance step "
        "time; default %(default)s",
        EAGER,
    )
    seeds: list[int] = flag(
        None,
        "seeds (one run per arm and seed; table shows mean +- std)",
        EAGER,
        factory=lambda: [0],
    )
    full_every: int = flag(
        4,
        "eager arms: every K-th round is a full round, every rank's own gradient "
        "in it (bounded staleness); default %(default)s (0: never). The authors "
        "used 32 with 64 ranks, where a rank is delayed in ~2%% of steps; with 4 "
        "ranks it is 25%%, lag builds up ~10x faster, and 4 keeps staleness alike",
        EAGER,
    )
    allreduce_strategy: str = flag(
        "sync",
        "strategy of the allreduce arm; default %(default)s",
        EAGER,
        choices=("sync", "fused", "host"),
    )
    target_acc: float = flag(
        DEFAULT_TARGET,
        "test accuracy for the time-to-accuracy column; default %(default)s",
        EAGER,
    )
    reference_steps: int = flag(
        60,
        "steps of the balanced synchronous reference (0: skip); default %(default)s",
        EAGER,
    )
    paper_scale: bool = flag(
        False,
        "the paper's ResNet-50 setting for batch jobs (see above): synthetic "
        "224x224 images of 1000 classes, or with --dataset imagenet --data-dir "
        "DIR ImageNet's 224x224 crops and classes",
        EAGER,
    )
    plots: bool = flag(True, "skip the figures", OUTPUT, name="--no-plots")
    sweep: bool = flag(
        False, "run the sweep (also implied by the two flags below)", SWEEP
    )
    sweep_model_size: list[int] | None = flag(
        None,
        "CANDLE P1B2 input features per size (1024 x FEATURES + 659722 "
        f"parameters; 28204: the real 118 MB); default {list(DEFAULT_FEATURES)}",
        SWEEP,
        type=int,
        nargs="+",
        metavar="FEATURES",
    )
    sweep_ranks: list[int] | None = flag(
        None,
        f"rank counts, one MPI job each; default {list(DEFAULT_RANKS)}",
        SWEEP,
        type=int,
        nargs="+",
        metavar="P",
    )
    # Set by the sweep's driver on the jobs it launches: run, do not summarise.
    sweep_child: bool = flag(False, argparse.SUPPRESS, SWEEP)

    def problem(self) -> str | None:
        """The first problem with the experiment's own values, or None."""
        return check_flags(self) or (check_sweep_flags(self) if self.sweep else None)


def select(given: dict[str, Any]) -> dict[str, Any]:
    """The preset the flags given choose: model, paper scale, digits, sweep."""
    sweep = any(k in given for k in ("sweep", "sweep_model_size", "sweep_ranks"))
    return {
        "model": given.get("train.model.name"),
        "paper_scale": bool(given.get("paper_scale", False)),
        "dataset": given.get("train.data.name"),
        "sweep": sweep,
    }


def get_config(
    model: str | None = None,
    paper_scale: bool = False,
    dataset: str | None = None,
    sweep: bool = False,
) -> Config:
    """The experiment's config for a preset (explicit flags are applied over it).

    ``sweep``: the parameter-server sweep's defaults; ``dataset="digits"``: the
    real-data defaults; ``paper_scale``: the paper's ResNet-50 setting; then the
    ``--model`` preset (:data:`MODEL_PRESETS`) and ``--dataset``
    (:func:`~research.studies.presets.with_dataset`).
    """
    cfg = Config()
    if sweep:
        cfg = override(cfg, **SWEEP_DEFAULTS, sweep=True)
        cfg = override(cfg, sweep_model_size=list(DEFAULT_FEATURES))
        cfg = override(cfg, sweep_ranks=list(DEFAULT_RANKS))
    elif dataset == "digits":
        cfg = override(cfg, **DIGITS_DEFAULTS)
    if paper_scale:
        cfg = override(cfg, **PAPER_SCALE, paper_scale=True)
    cfg = with_dataset(with_model(cfg, model, MODEL_PRESETS), dataset)
    if paper_scale and not cfg.train.model.name.startswith("resnet"):
        # The paper's stem is a ResNet's option; VGG and the others have none.
        options = {k: v for k, v in cfg.train.model.options.items() if k != "stem"}
        cfg = override(cfg, **{"model.options": options})
    if dataset == "digits" and cfg.train.model.name == "cnn_small":
        options = {**DIGITS_CNN_OPTIONS, **cfg.train.model.options}
        cfg = override(cfg, **{"model.options": options})
    return cfg


def parse(argv: list[str]) -> Config:
    return parse_config(
        argv, get_config, prog=PROG, doc=__doc__, hide=(CKPT,), select=select
    )


def sweep_driver(argv: list[str], cfg: Config) -> None:
    """Outside MPI: one job per rank count, then the sweep's table and figure."""
    from research.entry.launch import relaunch
    from research.rundir import default_run_dir

    root = Path(cfg.train.run_dir or default_run_dir("eager_sweep")).absolute()
    for size in cfg.sweep_ranks:
        job = [*argv, "--sweep-ranks", str(size), "--run-dir", str(root)]
        code = relaunch("experiments.eager_sgd", [*job, "--sweep-child"], size,
                        cfg.train.threads, cfg.launch.hosts)  # fmt: skip
        if code != 0:
            raise SystemExit(code)
    summarise_sweep(root, cfg)


def summarise_sweep(root: Path, cfg: Config) -> None:
    """Table, crossover lines and figure of the sweep under ``root``."""
    from research.studies.eager_sweep import format_sweep

    link = cfg.train.strategy.link
    rows = write_sweep(root, cfg.target_acc, link)
    print(format_sweep(rows, cfg.target_acc, link), flush=True)
    if cfg.plots:
        from research.studies.eager_sgd_plots import plot_sweep

        print(f"figure {plot_sweep(root, cfg.target_acc)}", flush=True)
    print(f"sweep results in {root} (sweep.md, sweep.json)", flush=True)


def _plot(root: Path, target_acc: float) -> list[Path]:
    from research.studies.eager_sgd_plots import plot_all

    return plot_all(root, target_acc)


def main(argv: list[str] | None = None) -> list[dict[str, Any]] | None:
    argv = sys.argv[1:] if argv is None else argv
    cfg = parse(argv)  # bad flags end here, before paying for MPI start-up
    from research.comm.process.env import launched_by_mpi

    if cfg.sweep and not launched_by_mpi():
        sweep_driver(argv, cfg)
        return None
    cfg.launch.create("experiments.eager_sgd", argv, cfg.train.threads)
    world, root = start_job(cfg.train.threads, cfg.train.run_dir, "eager_sgd")
    plot = _plot if cfg.plots else None
    try:
        if cfg.sweep:
            run_sweep_job(cfg, root, world)
            if world.rank == 0 and not cfg.sweep_child:  # started under mpiexec
                summarise_sweep(root, cfg)
            return None
        return run_experiment(cfg, root, world, plot=plot)
    except UsageError as e:  # data or model settings: raised alike on every rank
        fail_usage(PROG, str(e))


if __name__ == "__main__":
    main()
