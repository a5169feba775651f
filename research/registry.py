"""Names for classes, made by a class decorator: the strategies' and the savers'.

``SAVERS = Registry("saver")``, then ``@SAVERS.register("deepfreeze")`` on a
class (or a factory) gives it the name. Registering the same class again (a
reloaded module) is allowed; another class under a taken name is an error. A
class without a ``name`` of its own (or with ``"base"``) is given the name.

Both registries read their names and options from the modules' source first
(:mod:`research.options`); :meth:`Registry.declared` describes a class that
was registered by an import alone, from its constructor.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from research.option_spec import Declared, Option

F = TypeVar("F", bound=Callable[..., Any])


class Registry:
    """Registered names of one kind (``"averager"``, ``"saver"``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Callable[..., Any]] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Class (or factory) decorator that registers it as ``name``."""

        def deco(obj: F) -> F:
            old = self._entries.get(name)
            if old is not None and qualname(old) != qualname(obj):
                raise ValueError(
                    f"{self.kind} {name!r} is already registered by {qualname(old)}"
                )
            self._entries[name] = obj
            if isinstance(obj, type) and obj.__dict__.get("name") in (None, "base"):
                obj.name = name  # type: ignore[attr-defined]
            return obj

        return deco

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __getitem__(self, name: str) -> Callable[..., Any]:
        return self._entries[name]

    def names(self) -> list[str]:
        """The names registered so far, sorted."""
        return sorted(self._entries)

    def forget(self, name: str) -> None:
        """Take ``name`` out again (a test's own registration)."""
        self._entries.pop(name, None)

    def declared(self, name: str, positional: tuple[str, ...]) -> Declared:
        """What registered ``name`` accepts, from its constructor: each keyword
        argument after ``positional`` (any type), its ``option_ranges`` and its
        ``renamed_options``."""
        obj = self._entries[name]
        ranges = getattr(obj, "option_ranges", {})
        params = inspect.signature(obj).parameters.values()
        options = {
            p.name: Option((object,), range=ranges.get(p.name))
            for p in params
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
            and p.name not in positional
        }
        renamed = getattr(obj, "renamed_options", {})
        return Declared(name, obj.__module__, options, renamed)


def qualname(obj: Any) -> str:
    """``module.Qualified.name`` of a class or function."""
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', obj)}"
