"""Command-line plumbing shared by the experiments: flags, validation, start-up.

Every experiment parses its flags *before* relaunching under mpiexec, so a bad
flag costs no MPI start-up and is reported once, with exit code 2.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

from research.train.config import TrainConfig
from research.usage import fail_usage


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are printed by one rank only (exit code 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        fail_usage(self.prog, message)


def doc_parser(
    prog: str,
    doc: str,
    cls: type[argparse.ArgumentParser] = argparse.ArgumentParser,
    **kw: Any,
) -> argparse.ArgumentParser:
    """A parser (``cls``, with ``kw``) whose help is the module docstring
    ``doc``: its first paragraph the description, the rest the epilog, as
    written."""
    first, _, rest = doc.partition("\n\n")
    return cls(
        prog=prog,
        description=first,
        epilog=rest or None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        **kw,
    )


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


def without(argv: list[str], flag: str) -> list[str]:
    """``argv`` minus ``flag VALUE`` and ``flag=VALUE``."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        elif not a.startswith(flag + "="):
            out.append(a)
    return out


def add_flags(
    p: argparse.ArgumentParser,
    defaults: Any,
    *,
    hide: Sequence[str] = (),
    given_only: bool = False,
    _prefix: str = "",
    _groups: dict[str, Any] | None = None,
) -> None:
    """Add a flag for every :func:`~research.train.config.flag` field of the
    dataclass instance ``defaults`` (recursing into :func:`nested` fields).

    ``defaults`` supplies the shown defaults (a preset's config); ``hide``
    names ``--help`` groups or fields left out (by name, or by path for a
    nested one: ``train.checkpoint.saver``; they keep their defaults). The
    value of field ``x`` of a nested field ``train`` lands at ``train.x`` in the
    namespace; :func:`config_from` builds the config back from it. With
    ``given_only`` the namespace holds only the flags given.
    """
    groups = {} if _groups is None else _groups
    for f in dataclasses.fields(defaults):
        meta = f.metadata
        if meta.get("nested"):
            if f.name in hide or _prefix + f.name in hide:  # all its flags
                continue
            add_flags(
                p,
                getattr(defaults, f.name),
                hide=hide,
                given_only=given_only,
                _prefix=f"{_prefix}{f.name}.",
                _groups=groups,
            )
            continue
        if not meta or meta["group"] in hide or f.name in hide:
            continue
        if _prefix + f.name in hide:  # by its path: train.checkpoint.saver
            continue
        if meta["group"] not in groups:
            groups[meta["group"]] = p.add_argument_group(meta["group"])
        g = groups[meta["group"]]
        default = getattr(defaults, f.name)
        kw: dict[str, Any] = {"dest": _prefix + f.name, "help": meta["help"]}
        auto = "--" + f.name.replace("_", "-")
        if isinstance(default, dict):
            kw.update(action="append", metavar="KEY=VALUE", default=None)
        elif isinstance(default, bool) and meta["negatable"]:
            kw.update(action=argparse.BooleanOptionalAction, default=default)
        elif isinstance(default, bool):
            # Named by the class's default, whatever a preset sets: --no-X
            # turns off what is on unless said, --X turns on what is off.
            on = f.default is True
            auto = ("--no-" if on else "--") + f.name.replace("_", "-")
            kw.update(action="store_false" if on else "store_true", default=default)
        else:
            many = isinstance(default, (list, tuple)) or meta["nargs"]
            typ = meta["type"]
            if typ is None and many:
                typ = type(default[0]) if default else str
            elif typ is None:
                typ = type(default) if default not in (None, "") else str
            metavar = meta["metavar"] or (None if meta["choices"] else f.name.upper())
            kw.update(type=typ, choices=meta["choices"], metavar=metavar)
            kw["default"] = list(default) if many and default is not None else default
            if default == "":
                kw["default"] = None
            if many:
                kw["nargs"] = meta["nargs"] or "+"
        if given_only:
            kw["default"] = argparse.SUPPRESS
        g.add_argument(meta["name"] or auto, **kw)


def config_from(defaults: Any, ns: argparse.Namespace, _prefix: str = "") -> Any:
    """The config ``defaults`` with every value the namespace holds for it.

    Dict fields (``--model-opt`` and the like) are the defaults' pairs updated
    with the parsed ``KEY=VALUE`` ones, so a preset's options stay unless the
    user names them. Raises ``ValueError`` (from the config's own checks or a
    malformed pair).
    """
    values: dict[str, Any] = {}
    for f in dataclasses.fields(defaults):
        meta, default = f.metadata, getattr(defaults, f.name)
        if meta.get("nested"):
            values[f.name] = config_from(default, ns, f"{_prefix}{f.name}.")
            continue
        key = _prefix + f.name
        if not meta or not hasattr(ns, key):
            continue
        value = getattr(ns, key)
        if isinstance(default, dict):
            value = {**default, **parse_options(value, meta["name"] or key)}
        elif value is None and default == "":
            value = ""  # an empty text default is shown as none, kept as ""
        values[f.name] = value
    return dataclasses.replace(defaults, **values)


def parse_config(
    argv: Sequence[str],
    get_config: Callable[..., Any],
    *,
    prog: str,
    doc: str,
    hide: Sequence[str] = (),
    select: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Any:
    """An experiment's typed config from its command line.

    ``get_config(**select(given))`` returns the experiment's config with the
    defaults of a preset (big_vision's ``get_config``), chosen by the flags
    given (``given``: ``{dest: value}`` of the flags on the command line only;
    by default ``model`` from ``--model`` or None, and ``paper_scale``). The
    flags are then parsed over that config, so an explicit flag always wins
    over a preset. ``get_config(model=X)`` says what ``--model X`` means: its
    ``train.model.name`` is a preset's model (``candle`` -> ``candle_p1b2``) or
    ``X``; with ``model=None``, the preset's default model.
    ``doc``'s first paragraph is the description, the rest the epilog.

    CLI level: a bad flag or value ends the process with one line and exit 2
    (before any MPI start-up); ``--list`` prints the listing and exits 0.
    """
    argv = list(argv)

    def parser(defaults: Any, given_only: bool = False) -> argparse.ArgumentParser:
        # --help is the full parser's
        p = doc_parser(prog, doc, ArgumentParser, add_help=not given_only)
        add_flags(p, defaults, hide=hide, given_only=given_only)
        if hasattr(defaults, "train"):
            p.add_argument(
                "--list",
                action="store_true",
                help="list models, datasets and strategies (with their options), "
                "then exit",
            )
        return p

    given = vars(parser(get_config(), given_only=True).parse_known_args(argv)[0])
    if select is None:
        chosen = {"model": given.get("train.model.name")}
        chosen["paper_scale"] = bool(given.get("paper_scale", False))
    else:
        chosen = select(given)
    preset = get_config(**chosen)
    ns = parser(preset).parse_args(argv)
    if getattr(ns, "list", False):
        print(listing())
        raise SystemExit(0)
    try:
        cfg = config_from(preset, ns)
        if hasattr(cfg, "train"):
            model = dataclasses.replace(cfg.train.model, name=preset.train.model.name)
            train = dataclasses.replace(cfg.train, model=model)
            cfg = dataclasses.replace(cfg, train=train_config(train))
        problem = cfg.problem() if hasattr(cfg, "problem") else None
        problem = problem or hosts_problem(cfg)
    except ValueError as e:
        fail_usage(prog, str(e))
    if problem:
        fail_usage(prog, problem)
    np_ = getattr(getattr(cfg, "launch", cfg), "np", 1)
    if np_ < 1:  # before any launch: 0 once meant "alone"
        fail_usage(prog, f"--np must be >= 1 (1: this process alone), got {np_}")
    return cfg


def hosts_problem(cfg: Any) -> str | None:
    """A one-line problem with ``--hosts`` for the rank counts ``cfg`` launches
    (``launch.np``, or each of ``ranks``), or None."""
    launch = getattr(cfg, "launch", cfg)  # overlap and scalability: flat
    hosts = getattr(launch, "hosts", "")
    if not hosts:
        return None
    from research.entry.launch import placement
    from research.usage import UsageError

    counts = getattr(cfg, "ranks", None) or [getattr(launch, "np", 1)]
    for n in counts:
        if n < 1:
            return f"--hosts needs at least one rank, got {n}"
        try:
            placement(hosts, n)
        except UsageError as e:
            return str(e)
    return None


def override(cfg: Any, **values: Any) -> Any:
    """``cfg`` with ``values`` set, each on ``cfg`` or, where ``cfg`` has no such
    field, on the nested config that has it (``lr`` on ``cfg.train``): how
    presets say what they change. A dotted name sets a field of a nested
    config (``**{"data.options": {...}}``: ``cfg.train.data.options``). An
    unknown name is a ``TypeError``."""
    head = lambda k: k.partition(".")[0]  # noqa: E731
    mine = {f.name for f in dataclasses.fields(cfg)}
    top = {k: v for k, v in values.items() if k in mine}
    for k, v in values.items():
        if "." in k and head(k) in mine:
            inner = top.get(head(k), getattr(cfg, head(k)))
            top[head(k)] = override(inner, **{k.partition(".")[2]: v})
    rest = {k: v for k, v in values.items() if head(k) not in mine}
    for f in dataclasses.fields(cfg):
        if rest and f.metadata.get("nested"):
            inner = top.get(f.name, getattr(cfg, f.name))
            names = {g.name for g in dataclasses.fields(inner)}
            here = {k: v for k, v in rest.items() if head(k) in names}
            if here:
                top[f.name] = override(inner, **here)
                rest = {k: v for k, v in rest.items() if head(k) not in names}
    if rest:
        raise TypeError(f"{type(cfg).__name__} has no field {sorted(rest)[0]!r}")
    return dataclasses.replace(cfg, **top)


def train_config(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with its run folder absolute; ``ValueError`` names its problem.

    Absolute once, where the run folder is named: every rank resolves it alike
    (mpiexec starts them in the same folder), and libraries handed paths below
    it (Orbax) refuse relative ones.
    """
    run_dir = os.path.abspath(cfg.run_dir) if cfg.run_dir else ""
    cfg = dataclasses.replace(cfg, run_dir=run_dir)
    problem = validate(cfg)
    if problem:
        raise ValueError(problem)
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

    problem = cfg.model.problem()
    if problem:
        return problem
    problem = cfg.strategy.problem()
    if problem:
        return problem
    if cfg.batch_size <= 0:
        return f"--batch-size must be positive, got {cfg.batch_size}"
    if cfg.steps < 0 or cfg.epochs <= 0:
        return "--steps must be >= 0 and --epochs > 0"
    if cfg.lr <= 0:
        return f"--lr must be positive, got {cfg.lr}"
    problem = cfg.data.problem()
    if problem:  # before any rank starts: one line naming the file
        return problem
    problem = cfg.faults.problem()
    if problem:
        return problem
    if cfg.threads < 0:
        return f"--threads must be >= 0 (0: XLA's default), got {cfg.threads}"
    from research.checkpoint.savers import check_saver_options, options_class

    ck = cfg.checkpoint
    if ck.saver == "none" and ck.options:
        return "--checkpoint-opt needs a saver: --checkpoint NAME (see --list)"
    problem = check_saver_options(ck.saver, ck.options)
    if problem:
        return f"--checkpoint: {problem}"
    if ck.saver != "none" and ck.every < 1:
        return f"--checkpoint-every must be >= 1, got {ck.every}"
    needs = cfg.strategy.typed().xla_runtime
    saver = None if ck.saver == "none" else options_class(ck.saver)
    if saver and not saver.beside_xla_runtime and needs("cpu") == "needed":
        return (
            f"--checkpoint {ck.saver} cannot go with allreduce=xla: under "
            "JAX's distributed runtime orbax-checkpoint writes numpy arrays from "
            "process 0 only; use --checkpoint deepfreeze or rank0-blocking"
        )
    if ck.saver == "deepfreeze" and ck.fast_dir not in ("auto", None):
        problem = check_private_dir(ck.fast_dir, "--fast-dir")
        if problem:
            return problem
    from research.train.profiling import ProfileWindow

    try:  # the steps against the run's length: on the ranks, once data are known
        ProfileWindow.parse(cfg.records.profile, cfg.records.profile_ranks)
    except ValueError as e:
        return str(e)
    from research.threads import check_xla_flags, xla_thread_flags

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
    """What ``--list`` prints: models, datasets, and every strategy and saver
    with its options (type, range or values, default), from their options
    dataclasses (importing them starts no MPI)."""
    import models
    from research.checkpoint import savers
    from research.data import list_datasets
    from research.strategies import registry

    lines = [
        f"models:     {', '.join(models.list_models())}",
        f"datasets:   {', '.join(list_datasets())}",
    ]
    return "\n".join([*lines, *registry.listing(), *savers.listing()])
