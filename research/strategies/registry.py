"""Strategies by name: ``create("solo", world, full_every=8)``, checked and listed.

A strategy registers its options class in its own module with
:func:`register`; importing the module registers it. The built-in ones are
imported by ``research/strategies/__init__.py`` (one line each), so every
lookup here knows them; a strategy of your own is known once your module is
imported. Nothing here imports MPI: flags are checked and listed before an
experiment relaunches itself under ``mpiexec``; MPI starts when a strategy is
made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from research.strategies.base import Strategy, StrategyOptions

_OPTIONS: dict[str, type[StrategyOptions]] = {}

T = TypeVar("T", bound=type[StrategyOptions])


def register(name: str) -> Callable[[T], T]:
    """Class decorator: ``name`` is the strategy these options make.

    Registering the same class again (a reloaded module) is allowed; another
    class under a taken name is an error.
    """

    def deco(cls: T) -> T:
        old = _OPTIONS.get(name)
        if old is not None and old.__qualname__ != cls.__qualname__:
            raise ValueError(f"strategy {name!r} is already registered by {old}")
        cls.name = name
        _OPTIONS[name] = cls
        return cls

    return deco


def forget(name: str) -> None:
    """Take ``name`` out again (a test's own strategy)."""
    _OPTIONS.pop(name, None)


def names() -> list[str]:
    """Every registered strategy, sorted."""
    return sorted(_OPTIONS)


def options_class(name: str) -> type[StrategyOptions]:
    """The options class of strategy ``name``; a ValueError lists the valid ones."""
    if name not in _OPTIONS:
        raise ValueError(
            f"unknown strategy {name!r}; choose one of {', '.join(names())}"
        )
    return _OPTIONS[name]


def problem(name: str, values: dict[str, Any], link: str = "real") -> str | None:
    """A one-line problem with strategy ``name``, its option ``values`` or an
    emulated ``link`` (``--link``), or None."""
    try:
        return options_class(name).problem(values) or _link_problem(name, link)
    except ValueError as e:
        return str(e)


def _link_problem(name: str, spec: str) -> str | None:
    from research.comm.link import Link

    try:
        link = Link.parse(spec)
    except ValueError as e:
        return f"--link: {e}"
    if link.emulated and "link" not in options_class(name).spec():
        linked = [n for n in names() if "link" in _OPTIONS[n].spec()]
        return (
            f"--link: strategy {name!r} cannot run on an emulated link (its "
            "communication is not host-side collectives); use " + ", ".join(linked)
        )
    return None


def make_options(
    name: str, values: dict[str, Any], link: str = "real"
) -> StrategyOptions:
    """Strategy ``name``'s options from flags, ``--link`` applied to a strategy
    that has a ``link`` option (it was checked with :func:`problem`)."""
    why = problem(name, values, link)
    if why:
        raise ValueError(why)
    values = dict(values)
    if link != "real":  # one flag for every host-side collective
        values.setdefault("link", link)
    return options_class(name).make(values)


def create(name: str, world: Any, **values: Any) -> Strategy:
    """The strategy ``name`` with its options ``values`` (collective over
    ``world``: every rank makes it alike). A ValueError names a bad option."""
    return make_options(name, values).create(world)


def listing() -> list[str]:
    """``--list``'s lines: every strategy and its options with their ranges."""
    out = ["strategies (--strategy NAME --strategy-opt KEY=VALUE):"]
    for name in names():
        out += [f"  {name}", *(f"      {line}" for line in _OPTIONS[name].describe())]
    return out
