"""A declared option's specification, and checking values against it.

:class:`Option` says what one option of a registered strategy or saver accepts
(types, fixed values, a :class:`Range`, its default); :class:`Declared` is a
registered name with its options; :func:`check` names the first bad value of a
set of flags in one line. :mod:`research.options` reads these from a module's
source without importing it (and re-exports them); a strategy's module imports
:class:`Range` from there for its ``option_ranges``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Range:
    """Bounds of a numeric option: ``ge``/``gt`` below, ``le``/``lt`` above."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies within every bound."""
        return not (
            (self.ge is not None and value < self.ge)
            or (self.gt is not None and value <= self.gt)
            or (self.le is not None and value > self.le)
            or (self.lt is not None and value >= self.lt)
        )

    def __str__(self) -> str:
        bounds = (">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt)
        parts = [f"{op} {_num(v)}" for op, v in bounds if v is not None]
        return " and ".join(parts) or "any"

    def outside(self, integer: bool) -> list[float]:
        """Values just outside each bound (for tests that must see them refused)."""
        out: list[float] = []
        if self.ge is not None:
            out.append(self.ge - 1 if integer else math.nextafter(self.ge, -math.inf))
        if self.gt is not None:
            out.append(math.floor(self.gt) if integer else self.gt)
        if self.le is not None:
            out.append(self.le + 1 if integer else math.nextafter(self.le, math.inf))
        if self.lt is not None:
            out.append(math.ceil(self.lt) if integer else self.lt)
        return out


def _num(v: float) -> str:
    if isinstance(v, int) and v >= 2**20 and (v & (v - 1)) == 0:
        return f"2**{v.bit_length() - 1}"
    return repr(v)


@dataclass(frozen=True)
class Option:
    """One option: the types it accepts, fixed values, a range, its default."""

    types: tuple[type, ...]
    choices: tuple[Any, ...] | None = None
    range: Range | None = None
    default: Any = ...  # ``...``: not a constant of the declaring module
    items: type | None = None  # tuple[str, ...]: the items' type

    def problem(self, key: str, value: Any) -> str | None:
        """Why ``value`` is not acceptable for option ``key`` (one line), or None."""
        types = self.types
        if not isinstance(value, types) or (
            isinstance(value, bool) and bool not in types and object not in types
        ):
            want = " or ".join("None" if t is type(None) else t.__name__ for t in types)
            return f"option {key}={value!r} must be {want}"
        items = self.items
        seq = isinstance(value, (tuple, list)) and items is not None
        if seq and any(not isinstance(v, items) for v in value):
            return f"option {key}={value!r} must hold {self.items.__name__}s"
        if self.choices is not None and not any(
            value == c and type(value) is type(c) for c in self.choices
        ):
            valid = ", ".join(map(repr, self.choices))
            return f"option {key}={value!r} must be one of {valid}"
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if self.range is not None and numeric and not self.range.contains(value):
            return f"option {key}={value!r} must be {self.range}"
        return None

    def describe(self) -> str:
        """``int >= 1 (default 32)`` and the like, for ``--list``."""
        if self.choices is not None:
            kind = "|".join(map(repr, self.choices))
        else:
            names = [
                "None" if t is type(None) else t.__name__
                for t in self.types
                if not (t is int and float in self.types)
            ]
            kind = "|".join(
                "Path"
                if n == "PurePath"
                else f"tuple[{self.items.__name__}]"
                if n == "tuple" and self.items
                else n
                for n in names
                if n != "list"
            )
            if self.range is not None:
                kind += f" {self.range}"
        return kind if self.default is ... else f"{kind} (default {self.default!r})"


@dataclass(frozen=True)
class Declared:
    """A registered name: its module and its options, as declared."""

    name: str
    module: str
    options: dict[str, Option] = field(default_factory=dict)
    #: Old option names still accepted (``renamed_options``): old -> current.
    renamed: dict[str, str] = field(default_factory=dict)
    #: ``"module:function"`` that parses free-text options before launch
    #: (``options_check``; it must not start MPI): ``f(options) -> problem``.
    check: str | None = None


def check(
    kind: str,
    name: str,
    values: dict[str, Any],
    known: dict[str, Option],
    renamed: dict[str, str] | None = None,
) -> str | None:
    """One line naming the first bad option of ``kind`` ``name``, or None
    (an old name in ``renamed`` is checked as the option it now is)."""
    for key, value in values.items():
        key = (renamed or {}).get(key, key)
        if key not in known:
            valid = ", ".join(sorted(known)) or "none"
            return f"{kind} {name!r} has no option {key!r}; its options: {valid}"
        problem = known[key].problem(key, value)
        if problem:
            return f"{kind} {problem}"
    return None
