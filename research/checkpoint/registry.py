"""Checkpoint savers by name, registered as strategies are.

A saver lives in one module: its class, registered with a decorator, its
options the constructor's annotated keywords (after ``world`` and
``directory``) and their ranges a class attribute beside them::

    from research.checkpoint.base import Checkpointer
    from research.checkpoint.registry import Range, register_saver

    @register_saver("deepfreeze")
    class DeepFreeze(Checkpointer):
        option_ranges = {"keep": Range(ge=1)}

        def __init__(self, world, directory, *, keep: int = 3, ...): ...

Nothing else names it: ``CheckpointConfig(saver=NAME).create(world, run_dir)``
builds it, ``--checkpoint NAME --checkpoint-opt KEY=VALUE`` is checked before
launch, ``--list`` shows it with its options, the DeepFreeze study measures it
and ``tests/test_saver_contract.py`` runs it through save, restore, a crash in
the middle of a save and a resume at another world size. Savers under
``research/checkpoint`` are found by their source (:mod:`research.options`
reads names and options without importing them, so flags are checked before
MPI starts); a module elsewhere is named with :func:`add_saver_module`.

"none" is not a saver: it means no checkpoints.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from research.options import Declared, Range, check, module_name, read
from research.registry import Registry

__all__ = [
    "NONE",
    "Range",
    "add_saver_module",
    "check_saver_options",
    "declared_saver",
    "list_savers",
    "register_saver",
    "saver_class",
    "saver_name",
]

#: The name that means "no checkpoints".
NONE = "none"
#: Names before the savers' rename, accepted for one release with a one-line note.
RENAMED_SAVERS = {"rank0-sync": "rank0-blocking", "orbax-sync": "orbax-blocking"}
DECORATOR = "register_saver"
_HERE = Path(__file__).resolve().parent
_PROJECT = _HERE.parent.parent
#: Leading constructor parameters that are not options.
_POSITIONAL = ("world", "directory")
#: Modules outside research/checkpoint that register savers.
SAVER_MODULES: list[str] = []
_REGISTRY = Registry("saver")

F = TypeVar("F", bound=Callable[..., Any])


@functools.lru_cache(maxsize=1)
def _builtin() -> dict[str, Declared]:
    out: dict[str, Declared] = {}
    for path in sorted(_HERE.rglob("*.py")):
        found = read(path, module_name(path, _PROJECT), DECORATOR, _POSITIONAL)
        for name in found:
            if name in out or name == NONE:
                raise ValueError(f"saver {name!r} registered twice: {path}")
        out.update(found)
    return out


def _added(module: str) -> dict[str, Declared]:
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return {}
    return read(Path(spec.origin), module, DECORATOR, _POSITIONAL)


def declared_saver(name: str) -> Declared | None:
    """A saver's declaration (built-in, or in a module added with
    :func:`add_saver_module`), read from its source; None if unknown."""
    found = _builtin().get(name)
    for module in SAVER_MODULES:
        if found is None:
            found = _added(module).get(name)
    return found


def list_savers() -> list[str]:
    """Every saver's name, sorted, without importing any saver module."""
    added = {n for m in SAVER_MODULES for n in _added(m)}
    return sorted(set(_builtin()) | added | set(_REGISTRY.names()))


def add_saver_module(module: str) -> None:
    """Register a module outside research/checkpoint whose import registers
    savers (idempotent); its names and options are read from its source."""
    if module not in SAVER_MODULES:
        SAVER_MODULES.append(module)


def saver_name(name: str) -> str:
    """``name``, or the current name of an old one (with a one-line note)."""
    new = RENAMED_SAVERS.get(name)
    if new is None:
        return name
    from research.comm.base import renamed

    renamed(f"checkpoint saver {name!r}", repr(new))
    return new


def check_saver_options(name: str, options: dict[str, Any]) -> str | None:
    """A one-line problem with saver ``name`` or its ``options``, or None."""
    if name == NONE:
        return None
    found = declared_saver(name)
    if found is None and name in _REGISTRY:  # registered by an import only
        found = _REGISTRY.declared(name, _POSITIONAL)
    if found is None:
        valid = ", ".join([NONE, *list_savers()])
        return f"unknown checkpoint saver {name!r}; valid: {valid}"
    return check("checkpoint saver", name, options, found.options, found.renamed)


def register_saver(name: str) -> Callable[[F], F]:
    """Class decorator that makes ``name`` a saver (see the module docstring).

    Re-registering the same class under the same name is allowed (a reloaded
    module); another class under a taken name is an error.
    """
    if name == NONE:
        raise ValueError(f"{NONE!r} means no checkpoints; choose another name")
    return _REGISTRY.register(name)


def saver_class(name: str) -> Callable[..., Any]:
    """The class registered as ``name``, importing its module (which may import
    mpi4py, Orbax and JAX: call it inside the job).

    Raises:
      ValueError: an unknown name, with the valid ones.
    """
    if name not in _REGISTRY:
        found = declared_saver(name)
        if found is not None:
            importlib.import_module(found.module)
        for module in SAVER_MODULES:
            if name not in _REGISTRY:
                importlib.import_module(module)
    if name not in _REGISTRY:
        valid = ", ".join(list_savers())
        raise ValueError(f"unknown checkpoint saver {name!r}; valid: {valid}")
    return _REGISTRY[name]
