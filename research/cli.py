"""Command-line plumbing shared by the experiments: flags, validation, start-up.

Every experiment parses its flags *before* relaunching under mpiexec, so a bad
flag costs no MPI start-up and is reported once, with exit code 2.
"""

from __future__ import annotations

import argparse
import ast
import os
from collections.abc import Sequence
from typing import Any

from research.launch import fail_usage
from research.train.config import TrainConfig


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are printed by one rank only (exit code 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        fail_usage(self.prog, message)


def parse_options(pairs: Sequence[str] | None, flag: str) -> dict[str, Any]:
    """``["width=16", "stem=cifar"]`` -> ``{"width": 16, "stem": "cifar"}``."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} expects KEY=VALUE, got {pair!r}")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def add_train_flags(p: argparse.ArgumentParser, defaults: TrainConfig) -> None:
    """The flags of one training run; ``defaults`` supplies the shown defaults."""
    g = p.add_argument_group("model and data")
    g.add_argument(
        "--model",
        default=defaults.model,
        help="model name (see --list); default %(default)s",
    )
    g.add_argument(
        "--model-opt",
        action="append",
        metavar="KEY=VALUE",
        help="model option, repeatable (e.g. width=16, stem=cifar)",
    )
    g.add_argument(
        "--dataset",
        default=defaults.dataset,
        help="dataset name (see --list); default %(default)s",
    )
    g.add_argument(
        "--data-dir",
        default=defaults.data_dir,
        help="folder of an on-disk dataset (cifar10, candle_nt3, candle_p1b2)",
    )
    g.add_argument(
        "--data-opt",
        action="append",
        metavar="KEY=VALUE",
        help="dataset option, repeatable (e.g. n_train=4096, features=512)",
    )
    g = p.add_argument_group("optimisation")
    g.add_argument(
        "--batch-size",
        type=int,
        default=defaults.batch_size,
        help="examples per rank per step; default %(default)s",
    )
    g.add_argument(
        "--steps",
        type=int,
        default=defaults.steps,
        help="training steps (overrides --epochs when > 0); default %(default)s",
    )
    g.add_argument(
        "--epochs",
        type=float,
        default=defaults.epochs,
        help="epochs over the training split; default %(default)s",
    )
    g.add_argument(
        "--lr",
        type=float,
        default=defaults.lr,
        help="peak learning rate; default %(default)s",
    )
    g.add_argument(
        "--scale-lr",
        action="store_true",
        default=defaults.scale_lr,
        help="multiply --lr by global batch / 256 (Goyal et al.)",
    )
    g.add_argument(
        "--schedule",
        default=defaults.schedule,
        choices=("constant", "step", "cosine"),
        help="learning-rate schedule after warm-up; default %(default)s",
    )
    g.add_argument(
        "--warmup-steps",
        type=int,
        default=defaults.warmup_steps,
        help="linear warm-up steps; default %(default)s",
    )
    g.add_argument("--momentum", type=float, default=defaults.momentum)
    g.add_argument("--weight-decay", type=float, default=defaults.weight_decay)
    g.add_argument(
        "--seed",
        type=int,
        default=defaults.seed,
        help="seed of data, initialisation and sharding; default %(default)s",
    )
    g = p.add_argument_group("parallelism")
    g.add_argument(
        "--np",
        type=int,
        default=2,
        dest="np_",
        help="ranks to launch when started without mpiexec (0: run in this "
        "process alone); ignored under mpiexec/srun; default %(default)s",
    )
    g.add_argument(
        "--threads",
        type=int,
        default=defaults.threads,
        help="XLA intra-op threads per rank (0: XLA default); default %(default)s",
    )
    g.add_argument(
        "--strategy",
        default=defaults.strategy,
        help="gradient averaging: fused (mpi4jax in jit), host (mpi4py, "
        "staged), or a paper's strategy (see --list); default %(default)s",
    )
    g.add_argument(
        "--strategy-opt",
        action="append",
        metavar="KEY=VALUE",
        help="strategy option, repeatable (e.g. bucket_bytes=67108864)",
    )
    g = p.add_argument_group("output")
    g.add_argument(
        "--run-dir",
        default=defaults.run_dir or None,
        help="run folder (default runs/<experiment>-<timestamp>)",
    )
    g.add_argument(
        "--eval-every",
        type=int,
        default=defaults.eval_every,
        help="evaluate on the test split every N steps; default %(default)s",
    )
    g.add_argument(
        "--log-every",
        type=int,
        default=defaults.log_every,
        help="write a metrics.jsonl row every N steps; default %(default)s",
    )
    g.add_argument(
        "--trace",
        action=argparse.BooleanOptionalAction,
        default=defaults.trace,
        help="write the timeline trace.json",
    )
    g.add_argument(
        "--no-progress", action="store_true", help="no progress bar on rank 0"
    )
    p.add_argument(
        "--list",
        action="store_true",
        help="list models, datasets and strategies, then exit",
    )


def add_checkpoint_flags(p: argparse.ArgumentParser, defaults: TrainConfig) -> None:
    """Checkpoint and resume flags (``research.checkpoint``) of a training run."""
    from research.checkpoint.config import STRATEGIES

    g = p.add_argument_group("checkpointing")
    g.add_argument(
        "--checkpoint",
        default=defaults.checkpoint,
        choices=STRATEGIES,
        help="checkpoint strategy (into RUN_DIR/checkpoints); default %(default)s",
    )
    g.add_argument(
        "--checkpoint-every",
        type=int,
        default=defaults.checkpoint_every,
        metavar="N",
        help="checkpoint every N steps and after the last; default %(default)s",
    )
    g.add_argument(
        "--no-resume",
        dest="resume",
        action="store_false",
        default=defaults.resume,
        help="start over even when --run-dir holds a committed checkpoint "
        "(default: resume from the newest one)",
    )


def config_from_args(args: argparse.Namespace, prog: str) -> TrainConfig:
    """Build and validate the config; bad input ends with one line and exit 2."""
    try:
        cfg = TrainConfig(
            model=args.model,
            model_options=parse_options(args.model_opt, "--model-opt"),
            dataset=args.dataset,
            data_dir=args.data_dir,
            data_options=parse_options(args.data_opt, "--data-opt"),
            batch_size=args.batch_size,
            steps=args.steps,
            epochs=args.epochs,
            lr=args.lr,
            scale_lr=args.scale_lr,
            schedule=args.schedule,
            warmup_steps=args.warmup_steps,
            momentum=args.momentum,
            weight_decay=args.weight_decay,
            seed=args.seed,
            strategy=args.strategy,
            strategy_options=parse_options(args.strategy_opt, "--strategy-opt"),
            eval_every=args.eval_every,
            log_every=args.log_every,
            trace=args.trace,
            threads=args.threads,
            # Absolute once, where the run folder is named: every rank resolves
            # it alike (mpiexec starts them in the same folder), and libraries
            # handed paths below it (Orbax) refuse relative ones.
            run_dir=os.path.abspath(args.run_dir) if args.run_dir else "",
            progress=not args.no_progress,
            checkpoint=getattr(args, "checkpoint", "none"),
            checkpoint_every=getattr(args, "checkpoint_every", 100),
            resume=getattr(args, "resume", True),
        )
    except ValueError as e:
        fail_usage(prog, str(e))
    problem = validate(cfg)
    if problem:
        fail_usage(prog, problem)
    return cfg


def check_writable_dir(path: str | os.PathLike, flag: str) -> str | None:
    """None when ``path`` is (or can be made) a folder this process can write in.

    Creates the folder (the run would) and a probe file in it, so a tier on a
    read-only or pseudo file system is one line before any rank starts.
    """
    import tempfile

    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
            pass
    except OSError as e:
        return f"{flag} {os.fspath(path)!r} cannot be written: {e.strerror or e}"
    return None


def validate(cfg: TrainConfig) -> str | None:
    """The first problem with ``cfg`` as one line, or None."""
    import models
    from research.comm.registry import known_averagers
    from research.data import list_datasets

    if cfg.model not in models.list_models():
        names = ", ".join(models.list_models())
        return f"unknown model {cfg.model!r}; choose one of {names}"
    if cfg.dataset not in list_datasets():
        return (
            f"unknown dataset {cfg.dataset!r}; choose one of "
            f"{', '.join(list_datasets())}"
        )
    if cfg.strategy not in known_averagers():
        return (
            f"unknown strategy {cfg.strategy!r}; choose one of "
            f"{', '.join(known_averagers())}"
        )
    if cfg.batch_size <= 0:
        return f"--batch-size must be positive, got {cfg.batch_size}"
    if cfg.steps < 0 or cfg.epochs <= 0:
        return "--steps must be >= 0 and --epochs > 0"
    if cfg.lr <= 0:
        return f"--lr must be positive, got {cfg.lr}"
    if cfg.data_dir is not None and not os.path.isdir(cfg.data_dir):
        return f"--data-dir {cfg.data_dir!r} is not a folder"
    if cfg.threads < 0:
        return f"--threads must be >= 0 (0: XLA's default), got {cfg.threads}"
    if cfg.checkpoint != "none" and cfg.checkpoint_every < 1:
        return f"--checkpoint-every must be >= 1, got {cfg.checkpoint_every}"
    from research.launch import check_xla_flags, xla_thread_flags

    problem = check_xla_flags(xla_thread_flags(cfg.threads))
    if problem:
        return problem
    if cfg.run_dir:
        return check_writable_dir(cfg.run_dir, "--run-dir")
    return None


def listing() -> str:
    import models
    from research.comm.registry import known_averagers
    from research.data import list_datasets

    return (
        f"models:     {', '.join(models.list_models())}\n"
        f"datasets:   {', '.join(list_datasets())}\n"
        f"strategies: {', '.join(known_averagers())}"
    )
