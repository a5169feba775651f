"""Typed configs that carry their command-line flags.

A config field made with :func:`flag` holds its flag's help, group and name in
its metadata, so ``research.entry.cli`` builds a parser and the config back
from the dataclass alone; :func:`nested` holds a config inside another (its
flags join the parent's). Pure Python: a config module that uses these imports
nothing that starts MPI, so parsing flags before a relaunch costs nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


def flag(
    default: Any,
    help: str,  # noqa: A002 - argparse's own name
    group: str,
    *,
    name: str | None = None,
    choices: tuple[str, ...] | None = None,
    metavar: str | None = None,
    factory: Any = None,
    nargs: str | None = None,
    type: Any = None,  # noqa: A002 - argparse's own name
    negatable: bool = False,
) -> Any:
    """A dataclass field with its command-line flag.

    Args:
      default: the field's default (shown in ``--help`` as ``%(default)s``).
      help: the flag's help text (``argparse.SUPPRESS`` hides the flag).
      group: the ``--help`` section it appears in.
      name: the flag (default ``--field-name``); ``--no-X`` for a boolean that
        defaults to True, ``--X-opt`` (repeatable ``KEY=VALUE``) for a dict.
      choices, metavar, nargs: as in argparse (``nargs`` for list fields).
      factory: a default factory instead of ``default`` (dicts, lists).
      type: the value's type where the default does not say (``None``
        defaults); for a list, its items' type.
      negatable: a boolean with both ``--X`` and ``--no-X``.
    """
    meta = {"help": help, "group": group, "name": name, "choices": choices}
    meta.update(metavar=metavar, nargs=nargs, type=type, negatable=negatable)
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def flag_of(cls: type, name: str, **changes: Any) -> Any:
    """A field with the flag of ``cls``'s field ``name`` (its default, help,
    group and name), ``changes`` (:func:`flag`'s metadata: ``help``, ``group``,
    ``choices``, ...) over it: one definition of a flag for a config that
    does not nest ``cls`` (``experiments/overlap.py`` takes the data flags)."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    meta = {**f.metadata, **changes}
    if f.default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=f.default_factory, metadata=meta)
    return dataclasses.field(default=f.default, metadata=meta)


MODEL, OPTIM, PARALLEL, OUTPUT, CKPT = (
    "model and data",
    "optimisation",
    "parallelism",
    "output",
    "checkpointing",
)


def nested(factory: Callable[[], Any]) -> Any:
    """A field holding a nested config (``train: TrainConfig``, a run's
    ``data: DataConfig``): its flags join the parent's, in the nested class's
    own ``--help`` groups, and its values land at ``parent.field.x``."""
    return dataclasses.field(default_factory=factory, metadata={"nested": True})
