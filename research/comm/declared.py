"""What the strategy modules declare, read from their source without importing them.

A strategy is declared in one place, its own module::

    @register_averager("solo")
    class SoloAverager(Averager):
        def __init__(self, world, *, seed: int = 0, link: str = "real"): ...

Checking ``--strategy solo --strategy-opt seed=3`` happens before an experiment
relaunches itself under ``mpiexec``, where importing the strategy module would
import mpi4py and so initialise MPI in the launching process. So the names and
their options are read here from the source of the modules under the strategy
roots with :mod:`ast`: ``research/comm``, and the folders a higher layer adds
with :func:`add_root` (``research/train`` adds itself when it is imported: this
module knows nothing above it). Every class decorated
``@register_averager("NAME")``, and the keyword arguments of its ``__init__``
(or of the nearest base class in the same module that defines one) with their
annotations. ``int``, ``float`` (an ``int`` is accepted too), ``bool``, ``str``,
``None`` and unions of them become the accepted types; ``Literal[...]`` a fixed
set of values; anything else accepts any value (the constructor checks it).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parent.parent  # research/
#: Where strategy modules live: communication-only ones under research/comm;
#: folders of higher layers (``research/train``: strategies that bring their own
#: executor, ``layerwise``) are added by those layers with :func:`add_root`.
ROOTS: list[Path] = [PACKAGE / "comm"]


def add_root(folder: str | Path) -> None:
    """Also read the strategy modules under ``folder``, a package folder below
    the project root (idempotent). A layer above ``research.comm`` calls this
    for itself when it is imported."""
    folder = Path(folder).resolve()
    folder.relative_to(PACKAGE.parent)  # a ValueError outside the project
    if folder not in ROOTS:
        ROOTS.append(folder)
        strategies.cache_clear()


_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (float, int),
    "bool": (bool,),
    "str": (str,),
    "None": (type(None),),
}


@dataclass(frozen=True)
class Option:
    """One constructor keyword: the types it accepts and, if fixed, its values."""

    types: tuple[type, ...]
    choices: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class Strategy:
    """A registered name: its module and its options, as declared."""

    name: str
    module: str
    options: dict[str, Option] = field(default_factory=dict)


def _option(annotation: ast.expr | None) -> Option:
    if annotation is None:
        return Option((object,))
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body  # "int | None"
    parts: list[ast.expr] = []

    def split(node: ast.expr) -> None:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            split(node.left)
            split(node.right)
        else:
            parts.append(node)

    split(annotation)
    types: list[type] = []
    choices: list[Any] = []
    literal_only = True
    for part in parts:
        if (
            isinstance(part, ast.Subscript)
            and isinstance(part.value, ast.Name)
            and part.value.id == "Literal"
        ):
            elts = (
                part.slice.elts if isinstance(part.slice, ast.Tuple) else [part.slice]
            )
            values = [ast.literal_eval(e) for e in elts]
            choices += values
            types += [type(v) for v in values]
        elif isinstance(part, ast.Name) and part.id in _TYPES:
            types += _TYPES[part.id]
            literal_only = False
        elif isinstance(part, ast.Constant) and part.value is None:
            types.append(type(None))
            literal_only = False
        else:
            return Option((object,))  # not declared precisely: the constructor checks
    unique = tuple(dict.fromkeys(types))
    return Option(unique, tuple(choices) if literal_only else None)


def _keywords(init: ast.FunctionDef) -> dict[str, Option]:
    args = init.args
    positional = [a for a in args.args if a.arg not in ("self", "world")]
    return {a.arg: _option(a.annotation) for a in [*positional, *args.kwonlyargs]}


def _registered_name(cls: ast.ClassDef) -> str | None:
    for deco in cls.decorator_list:
        if (
            isinstance(deco, ast.Call)
            and isinstance(deco.func, ast.Name)
            and deco.func.id == "register_averager"
            and deco.args
            and isinstance(deco.args[0], ast.Constant)
        ):
            return str(deco.args[0].value)
    return None


def _init_of(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> ast.FunctionDef:
    seen = set()
    while True:
        for item in cls.body:
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                return item
        bases = [b.id for b in cls.bases if isinstance(b, ast.Name) and b.id in classes]
        if not bases or bases[0] in seen:
            raise LookupError(f"{cls.name}: no __init__ in the class or its bases here")
        seen.add(bases[0])
        cls = classes[bases[0]]


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts)


def modules_with(marker: str) -> list[str]:
    """Modules under :data:`ROOTS` whose source contains ``marker`` (e.g. a
    decorator), found without importing anything."""
    return [
        _module_name(path)
        for root in ROOTS
        for path in sorted(root.rglob("*.py"))
        if marker in path.read_text()
    ]


def _declared_in(path: Path, module: str, out: dict[str, Strategy]) -> None:
    text = path.read_text()
    if "@register_averager(" not in text:
        return
    tree = ast.parse(text, filename=str(path))
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for cls in classes.values():
        name = _registered_name(cls)
        if name is None:
            continue
        if name in out:
            raise ValueError(f"strategy {name!r} registered twice: {path}")
        out[name] = Strategy(name, module, _keywords(_init_of(cls, classes)))


@functools.lru_cache(maxsize=1)
def strategies() -> dict[str, Strategy]:
    """Every built-in strategy, by name, from the sources under :data:`ROOTS`."""
    out: dict[str, Strategy] = {}
    for path in (p for root in ROOTS for p in sorted(root.rglob("*.py"))):
        _declared_in(path, _module_name(path), out)
    return out


def strategies_in(module: str) -> dict[str, Strategy]:
    """The strategies a module outside research/ declares, from its source
    (found with ``importlib.util.find_spec``: the module is not imported)."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    out: dict[str, Strategy] = {}
    if spec is not None and spec.origin and spec.origin.endswith(".py"):
        _declared_in(Path(spec.origin), module, out)
    return out
