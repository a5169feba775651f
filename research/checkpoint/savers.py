"""Every checkpoint saver, by name: listed, checked and looked up.

The built-in savers are imported here, one line each (each registers itself:
``research.checkpoint.registry``); a saver of your own is known once its
module is imported. Nothing here starts MPI: the saver modules import it when
a saver is made.
"""

from __future__ import annotations

from typing import Any

from research.checkpoint import (  # noqa: F401  (each registers its savers)
    baselines,
    deepfreeze,
)
from research.checkpoint.registry import NONE, SaverOptions, registered


def list_savers() -> list[str]:
    """Every saver's name, sorted ("none", no checkpoints, is no saver)."""
    return sorted(registered())


def options_class(name: str) -> type[SaverOptions]:
    """Saver ``name``'s options class; a ValueError names the valid ones."""
    found = registered().get(name)
    if found is None:
        valid = ", ".join([NONE, *list_savers()])
        raise ValueError(f"unknown checkpoint saver {name!r}; valid: {valid}")
    return found


def check_saver_options(name: str, options: dict[str, Any]) -> str | None:
    """A one-line problem with saver ``name`` or its ``options``, or None."""
    if name == NONE:
        return None
    try:
        return options_class(name).problem(options)
    except ValueError as e:
        return str(e)


def beside_xla_runtime(name: str) -> bool:
    """Whether saver ``name`` ("none" too) may run beside JAX's distributed
    runtime (``SaverOptions.beside_xla_runtime``)."""
    return name == NONE or options_class(name).beside_xla_runtime


def saver_class(name: str) -> type:
    """The class registered as ``name`` (a ValueError for an unknown one)."""
    return options_class(name).saver


def listing() -> list[str]:
    """``--list``'s lines: every saver and its options with their ranges."""
    out = ["checkpoint savers (--checkpoint NAME --checkpoint-opt KEY=VALUE):"]
    out.append("  none  (no checkpoints)")
    for name in list_savers():
        out += [f"  {name}", *(f"      {x}" for x in options_class(name).describe())]
    return out
