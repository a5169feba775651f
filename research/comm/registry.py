"""Averaging strategies by name: ``get_averager("fused", world, bucket_bytes=...)``.

A strategy lives in one module: its class, registered with a decorator, and its
options as the constructor's annotated keyword arguments (e.g. ``solo`` in
``research/comm/partial.py``)::

    from research.comm.base import Averager, renamed
    from research.comm.registry import register_averager

    @register_averager("solo")
    class SoloAllreduce(Averager):
        def __init__(self, world, *, staleness_bound: int = 32): ...

Nothing else names it. A module under ``research/comm`` is found by its source
(:mod:`research.comm.declared` reads the names and options without importing
it, so a flag is checked before an experiment starts MPI); it is imported on
the first ``get_averager`` or ``list_averagers`` call, so import order never
matters. A module elsewhere (an experiment's own strategy) is named with
:func:`add_strategy_module`; its names and options are read from its source the
same way (or it is simply imported before its name is asked for).

A factory is any callable ``factory(world, **options) -> Averager``; a class is
the usual one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar

from research.comm import declared as declared_mod
from research.comm.base import Averager, renamed
from research.options import Range, check
from research.registry import Registry

__all__ = [
    "Range",
    "add_strategy_module",
    "check_options",
    "get_averager",
    "list_averagers",
    "register_averager",
]

#: Modules outside ``research/comm`` whose import registers strategies
#: (:func:`add_strategy_module`); the built-in ones are found by their source.
STRATEGY_MODULES: list[str] = []


def builtin_modules() -> list[str]:
    """The modules under research/comm that register strategies."""
    return sorted({s.module for s in declared_mod.strategies().values()})


def declared(name: str) -> declared_mod.Strategy | None:
    """A strategy's declaration: a built-in one, or one in a module added with
    :func:`add_strategy_module` (read from its source, not imported)."""
    strategy = declared_mod.strategies().get(name)
    for module in STRATEGY_MODULES:
        if strategy is None:
            strategy = declared_mod.strategies_in(module).get(name)
    return strategy


def declared_options(name: str) -> dict[str, declared_mod.Option] | None:
    """A strategy's options as its constructor declares them (see
    :func:`declared`), or None for a name not declared."""
    strategy = declared(name)
    return None if strategy is None else strategy.options


def current_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with old option names (a strategy's ``renamed_options``)
    replaced by the current ones, each noted once on stderr."""
    strategy = declared(name)
    renames = strategy.renamed if strategy else {}
    out = {}
    for key, value in options.items():
        if key in renames:
            renamed(f"strategy option {key}", renames[key])
        out[renames.get(key, key)] = value
    return out


def check_options(name: str, options: dict[str, Any]) -> str | None:
    """A one-line problem with ``options`` for strategy ``name``, or None.

    Checked against the declaration (:mod:`research.comm.declared`): every
    key an option (or an old name of one), every value of its type, one of
    its ``Literal`` values and within its ``option_ranges``. A strategy
    registered from a module that was not added (only imported) is checked
    against its constructor's keywords and its ``option_ranges``.
    """
    strategy = declared(name)
    if strategy is not None:
        problem = check("strategy", name, options, strategy.options, strategy.renamed)
        if problem is None and strategy.check is not None:  # free-text options
            module, _, func = strategy.check.partition(":")
            problem = getattr(importlib.import_module(module), func)(options)
        return problem
    if name not in _REGISTRY:
        return None  # unknown strategy: reported by the name check
    found = _REGISTRY.declared(name, ("world",))
    return check("strategy", name, options, found.options, found.renamed)


def check_link(name: str, spec: str) -> str | None:
    """A one-line problem with running strategy ``name`` on link ``spec``, or None."""
    from research.comm.link import Link

    try:
        link = Link.parse(spec)
    except ValueError as e:
        return f"--link: {e}"
    options = declared_options(name)
    if link.emulated and options is not None and "link" not in options:
        linked = [
            n for n, s in declared_mod.strategies().items() if "link" in s.options
        ]
        return (
            f"--link: strategy {name!r} cannot run on an emulated link (its "
            "communication is not host-side collectives); use "
            + ", ".join(sorted(linked))
        )
    return None


_REGISTRY = Registry("averager")

F = TypeVar("F", bound=Callable[..., Averager])


def register_averager(name: str) -> Callable[[F], F]:
    """Class (or factory) decorator that makes ``name`` available to get_averager.

    Re-registering the same object under the same name is allowed (a reloaded
    module); a different object under a taken name is an error.
    """
    return _REGISTRY.register(name)


def add_strategy_module(module: str) -> None:
    """Register a module to import before names are looked up (idempotent)."""
    if module not in STRATEGY_MODULES:
        STRATEGY_MODULES.append(module)


def _load_strategy_modules() -> None:
    for module in [*builtin_modules(), *STRATEGY_MODULES]:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            # A name listed before its module landed is skipped; a missing
            # dependency *inside* an existing module is a real error.
            if exc.name != module:
                raise


def list_averagers() -> list[str]:
    """Names accepted by :func:`get_averager`, sorted."""
    _load_strategy_modules()
    return _REGISTRY.names()


def known_averagers() -> list[str]:
    """Like :func:`list_averagers` without importing any strategy module.

    The built-in names, those declared in modules added with
    :func:`add_strategy_module` (read from their source), and any registered
    so far.
    """
    added = {n for m in STRATEGY_MODULES for n in declared_mod.strategies_in(m)}
    return sorted(set(declared_mod.strategies()) | added | set(_REGISTRY.names()))


def averager_factory(name: str) -> Callable[..., Averager]:
    """The class (or factory) registered as ``name``, e.g. to read its attributes."""
    _load_strategy_modules()
    if name not in _REGISTRY:
        valid = ", ".join(_REGISTRY.names())
        raise ValueError(f"unknown averager {name!r}; valid averagers: {valid}")
    return _REGISTRY[name]


def get_averager(name: str, world: Any, **options: Any) -> Averager:
    """Build the strategy registered as ``name``.

    Args:
      name: one of :func:`list_averagers`.
      world: the :class:`research.comm.world.World` it communicates in, or an
        mpi4py intracommunicator (:func:`research.comm.world.as_world`).
      **options: keyword arguments of the strategy's constructor.

    Raises:
      ValueError: ``name`` is unknown; the message lists the valid names.
    """
    _load_strategy_modules()
    if name not in _REGISTRY:
        valid = ", ".join(_REGISTRY.names())
        raise ValueError(f"unknown averager {name!r}; valid averagers: {valid}")
    return _REGISTRY[name](world, **options)


def strategy_options(name: str, options: dict[str, Any], link: str) -> dict[str, Any]:
    """The strategy's constructor options with ``--link`` applied to it.

    Raises:
      ValueError: the strategy cannot run on that link (the same on every rank).
    """
    options = dict(options)
    if link != "real":  # one flag for every host-side collective
        problem = check_link(name, link)
        if problem:
            raise ValueError(problem)
        options.setdefault("link", link)
    return options
