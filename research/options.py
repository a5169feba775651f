"""Typed options: one frozen dataclass per strategy and per checkpoint saver.

A field is an option; its annotation says what it accepts (``int``, ``float``,
``bool``, ``str``, ``None``, ``Literal[...]``, ``tuple[str, ...]``, unions),
:func:`option` its range. :meth:`Options.problem` names the first bad flag in
one line (before launch), :meth:`Options.make` builds the options from flags,
an instance checks itself, :meth:`Options.describe` is ``--list``'s text.
"""

from __future__ import annotations

import dataclasses
import operator
import types
import typing
from typing import Any, ClassVar, Literal

_BOUNDS = {"ge": (operator.ge, ">="), "gt": (operator.gt, ">")}
_BOUNDS |= {"le": (operator.le, "<="), "lt": (operator.lt, "<")}


@dataclasses.dataclass(frozen=True)
class Range:
    """Bounds of a numeric option: ``ge``/``gt`` below, ``le``/``lt`` above."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def _set(self) -> list[tuple[str, float]]:
        return [(k, getattr(self, k)) for k in _BOUNDS if getattr(self, k) is not None]

    def contains(self, v: float) -> bool:
        """Whether ``v`` lies within every bound."""
        return all(_BOUNDS[k][0](v, bound) for k, bound in self._set())

    def __str__(self) -> str:
        return " and ".join(f"{_BOUNDS[k][1]} {_num(b)}" for k, b in self._set())


def _num(v: float) -> str:
    big = isinstance(v, int) and v >= 2**20 and v & (v - 1) == 0
    return f"2**{v.bit_length() - 1}" if big else repr(v)


def option(default: Any, range: Range | None = None) -> Any:  # noqa: A002
    """A dataclass field that is an option, with its ``range`` (numbers)."""
    return dataclasses.field(default=default, metadata={"range": range})


@dataclasses.dataclass(frozen=True)
class Option:
    """What one option accepts: types, fixed values, a range, its default."""

    types: tuple[type, ...]
    choices: tuple[Any, ...] | None = None
    range: Range | None = None
    default: Any = None

    def problem(self, key: str, value: Any) -> str | None:
        """Why ``value`` is not acceptable for option ``key`` (one line), or None."""
        t, bad = self.types, f"option {key}={value!r} must be"
        if not isinstance(value, t) or (isinstance(value, bool) and bool not in t):
            return f"{bad} {' or '.join(_name(x) for x in t if x is not list)}"
        if tuple in t and not all(isinstance(v, str) for v in value or ()):
            return f"option {key}={value!r} must hold strs"
        typed = [(c, type(c)) for c in self.choices or ()]
        if self.choices is not None and (value, type(value)) not in typed:
            return f"{bad} one of {', '.join(map(repr, self.choices))}"
        if self.range and value is not None and not self.range.contains(value):
            return f"{bad} {self.range}"
        return None

    def describe(self) -> str:
        """``int >= 1 (default 32)`` and the like, for ``--list``."""
        kind = "|".join(map(repr, self.choices or ()))
        if self.choices is None:
            names = [_name(t) for t in self.types if t is not list]
            kind = "|".join(n for n in names if n != "int" or "float" not in names)
            kind += f" {self.range}" if self.range else ""
        return f"{kind} (default {self.default!r})"


def _name(t: type) -> str:
    return {type(None): "None", tuple: "tuple[str]"}.get(t, t.__name__)


def _spec(hint: Any, field: dataclasses.Field) -> Option:
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kinds: list[type] = []
    choices: list[Any] | None = []
    for part in typing.get_args(hint) if union else (hint,):
        if typing.get_origin(part) is Literal:
            choices += typing.get_args(part)  # type: ignore[operator]
            kinds += [type(c) for c in typing.get_args(part)]
        elif part is type(None):
            kinds.append(part)
            choices = None if choices is None else [*choices, None]
        else:  # tuple[str, ...]: a command line's list is taken too
            part = typing.get_origin(part) or part
            kinds += {float: [float, int], tuple: [tuple, list]}.get(part, [part])
            choices = None
    fixed = tuple(choices) if choices else None
    rng = field.metadata.get("range")
    return Option(tuple(dict.fromkeys(kinds)), fixed, rng, field.default)


@dataclasses.dataclass(frozen=True)
class Options:
    """The base of every strategy's and saver's options (module docstring)."""

    name: ClassVar[str] = ""  # the registered name they belong to
    kind: ClassVar[str] = "strategy"  # of what, in messages (checkpoint saver)

    @classmethod
    def spec(cls) -> dict[str, Option]:
        """Every option and what it accepts."""
        hints = typing.get_type_hints(cls)
        return {f.name: _spec(hints[f.name], f) for f in dataclasses.fields(cls)}

    @classmethod
    def problem(cls, values: dict[str, Any]) -> str | None:
        """One line naming the first bad option in ``values``, or None."""
        spec, head = cls.spec(), f"{cls.kind} {cls.name!r} has no option"
        for key, value in values.items():
            if key not in spec:
                return f"{head} {key!r}; its options: {', '.join(sorted(spec))}"
            if why := spec[key].problem(key, value):
                return f"{cls.kind} {why}"
        return None

    @classmethod
    def make(cls, values: dict[str, Any]) -> Options:
        """The options from ``values`` (flags); a ValueError names a bad one."""
        if problem := cls.problem(values):
            raise ValueError(problem)
        given = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
        return cls(**given)

    def __post_init__(self) -> None:
        if problem := type(self).problem(dataclasses.asdict(self)):
            raise ValueError(problem)

    @classmethod
    def describe(cls) -> list[str]:
        """``--list``'s lines of these options, one an option."""
        width = max(map(len, spec := cls.spec()), default=0)
        lines = [f"{k:<{width}}  {o.describe()}" for k, o in spec.items()]
        return lines or ["(no options)"]
