"""Command-line plumbing shared by the experiments: flags, validation, start-up.

Every experiment parses its flags *before* relaunching under mpiexec, so a bad
flag costs no MPI start-up and is reported once, with exit code 2.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from research.launch import fail_usage
from research.train.config import CKPT, PARALLEL, TrainConfig


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are printed by one rank only (exit code 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        fail_usage(self.prog, message)


def parse_options(pairs: Sequence[str] | None, flag: str) -> dict[str, Any]:
    """``["width=16", "stem=cifar"]`` -> ``{"width": 16, "stem": "cifar"}``.

    Values are Python literals (``16``, ``None``, ``True``); ``true``/``false``
    (any case) are booleans too, anything else a string.
    """
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} expects KEY=VALUE, got {pair!r}")
        if value.lower() in ("true", "false"):
            out[key] = value.lower() == "true"
            continue
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def add_train_flags(
    p: argparse.ArgumentParser, defaults: TrainConfig, *, checkpointing: bool = False
) -> None:
    """The flags of one training run, built from :class:`TrainConfig`'s fields.

    ``defaults`` supplies the shown defaults; the checkpointing group is added
    only with ``checkpointing`` (experiments whose runs checkpoint).
    """
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in dataclasses.fields(TrainConfig):
        meta = f.metadata
        if not meta or (meta["group"] == CKPT and not checkpointing):
            continue
        if meta["group"] not in groups:
            groups[meta["group"]] = p.add_argument_group(meta["group"])
        g = groups[meta["group"]]
        default = getattr(defaults, f.name)
        kw: dict[str, Any] = {"dest": f.name, "help": meta["help"]}
        if isinstance(default, dict):
            g.add_argument(
                meta["name"], action="append", metavar="KEY=VALUE", default=None, **kw
            )
        elif isinstance(default, bool):
            name = meta["name"] or ("--no-" if default else "--") + f.name.replace(
                "_", "-"
            )
            if f.name == "trace":
                g.add_argument(
                    "--trace",
                    action=argparse.BooleanOptionalAction,
                    default=default,
                    **kw,
                )
            else:
                action = "store_false" if default else "store_true"
                g.add_argument(name, action=action, default=default, **kw)
        else:
            typ = type(default) if default not in (None, "") else str
            g.add_argument(
                meta["name"] or "--" + f.name.replace("_", "-"),
                type=typ,
                default=default if default != "" else None,
                choices=meta["choices"],
                metavar=meta["metavar"],
                **kw,
            )
    g = groups[PARALLEL]
    g.add_argument(
        "--np",
        type=int,
        default=2,
        dest="np_",
        help="ranks to launch when started without mpiexec (0: run in this "
        "process alone); ignored under mpiexec/srun; default %(default)s",
    )
    p.add_argument(
        "--list",
        action="store_true",
        help="list models, datasets and strategies (with their options), then exit",
    )


def config_from_args(args: argparse.Namespace, prog: str) -> TrainConfig:
    """Build and validate the config; bad input ends with one line and exit 2."""
    values: dict[str, Any] = {}
    try:
        for f in dataclasses.fields(TrainConfig):
            if not f.metadata or not hasattr(args, f.name):
                continue
            value = getattr(args, f.name)
            if f.metadata["name"] and f.metadata["name"].endswith("-opt"):
                value = parse_options(value, f.metadata["name"])
            values[f.name] = value
        # Absolute once, where the run folder is named: every rank resolves it
        # alike (mpiexec starts them in the same folder), and libraries handed
        # paths below it (Orbax) refuse relative ones.
        values["run_dir"] = os.path.abspath(args.run_dir) if args.run_dir else ""
        cfg = TrainConfig(**values)
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
    from research.comm.registry import check_link, check_options, known_averagers
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
    problem = check_options(cfg.strategy, cfg.strategy_options)
    if problem:
        return f"--strategy-opt: {problem}"
    problem = check_link(cfg.strategy, cfg.link)
    if problem:
        return problem
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
    if cfg.checkpoint == "deepfreeze" and cfg.fast_dir not in ("auto", "none"):
        problem = check_private_dir(cfg.fast_dir, "--fast-dir")
        if problem:
            return problem
    from research.launch import check_xla_flags, xla_thread_flags

    problem = check_xla_flags(xla_thread_flags(cfg.threads))
    if problem:
        return problem
    if cfg.run_dir:
        return check_writable_dir(cfg.run_dir, "--run-dir")
    return None


def check_private_dir(path: str | os.PathLike, flag: str) -> str | None:
    """None when ``path`` is a private folder of ours or can be made one.

    For node-local folders (``--fast-dir``): one that exists must belong to
    this user and be writable by nobody else (``research/privdir.py``); it is
    examined before anything is written into it. Else as
    :func:`check_writable_dir` (created 0700).
    """
    from research import privdir

    if os.path.lexists(path):
        why = privdir.problem(path)
        if why is not None:
            return f"{flag} {os.fspath(path)!r} refused: {why}"
    else:
        try:
            privdir.make(path)
        except OSError as e:
            return f"{flag} {os.fspath(path)!r} cannot be written: {e.strerror or e}"
    return check_writable_dir(path, flag)


def listing() -> str:
    import models
    from research.comm.registry import declared_options, known_averagers
    from research.data import list_datasets

    lines = [
        f"models:     {', '.join(models.list_models())}",
        f"datasets:   {', '.join(list_datasets())}",
        "strategies (--strategy-opt KEY=VALUE):",
    ]
    for name in known_averagers():
        opts = ", ".join(declared_options(name) or {}) or "-"
        lines.append(f"  {name:<10} {opts}")
    return "\n".join(lines)
