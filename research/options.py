"""Declared options: a registered class's keywords, read from its source.

A strategy (``@register_averager``) or a checkpoint saver (``@register_saver``)
is declared in one module: its options are the annotated keyword arguments of
its constructor, and their ranges a class attribute next to them::

    @register_averager("solo")
    class SoloAverager(PartialAverager):
        option_ranges = {"full_every": Range(ge=1), "max_sleep": Range(ge=0)}

        def __init__(self, world, *, full_every: int | None = 32,
                     max_sleep: float = 5e-4, link: str = "real"): ...

Flags are checked before an experiment relaunches itself under ``mpiexec``,
where importing the module would start MPI, so everything is read here with
:mod:`ast`, nothing imported. Accepted annotations: ``int``, ``float`` (an
``int`` is accepted too), ``bool``, ``str``, ``None``, ``Path``, unions of
them, ``Literal[...]`` (a fixed set of values) and ``tuple[str, ...]``; a
keyword with any other annotation (a callback such as ``fault_hook``) is
for code that builds the object itself, not an option. Ranges:
:class:`Range` (``ge``/``gt``/``le``/``lt`` bounds, numbers or module-level
constants of the same module); the class's ``option_ranges`` and those of its
bases in the same module count.

What an option accepts (:class:`Option`, :class:`Range`, :class:`Declared`) and
checking values against it (:func:`check`) are :mod:`research.option_spec`'s,
re-exported here; this module reads them from the source.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

# The specification's names stay importable from here.
from research.option_spec import Declared, Option, Range, check  # noqa: F401

_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (float, int),
    "bool": (bool,),
    "str": (str,),
    "None": (type(None),),
    "Path": (PurePath,),
}


# --- reading the source -------------------------------------------------------

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
}


def _const(node: ast.expr, names: dict[str, ast.expr], depth: int = 0) -> Any:
    """A number, string, tuple or None from literals, arithmetic and names of
    module-level constants (``MAX_BYTES = 2**30``)."""
    if depth > 20:
        raise ValueError("constant too deep")
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_const(node.operand, names, depth + 1)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left = _const(node.left, names, depth + 1)
        return _OPS[type(node.op)](left, _const(node.right, names, depth + 1))
    if isinstance(node, ast.Tuple):
        return tuple(_const(e, names, depth + 1) for e in node.elts)
    if isinstance(node, ast.Name) and node.id in names:
        return _const(names[node.id], names, depth + 1)
    raise ValueError(f"not a constant: {ast.dump(node)[:60]}")


def _option(annotation: ast.expr | None, default: Any) -> Option | None:
    if annotation is None:
        return None
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
    items = None
    literal_only = True
    for part in parts:
        sub = part.value if isinstance(part, ast.Subscript) else None
        if isinstance(sub, ast.Name) and sub.id == "Literal":
            slice_ = part.slice  # type: ignore[attr-defined]
            elts = slice_.elts if isinstance(slice_, ast.Tuple) else [slice_]
            values = [ast.literal_eval(e) for e in elts]
            choices += values
            types += [type(v) for v in values]
        elif isinstance(sub, ast.Name) and sub.id == "tuple":
            slice_ = part.slice  # type: ignore[attr-defined]
            elts = slice_.elts if isinstance(slice_, ast.Tuple) else [slice_]
            if not (isinstance(elts[0], ast.Name) and elts[0].id in _TYPES):
                return None
            items = _TYPES[elts[0].id][0]
            types += [tuple, list]
            literal_only = False
        elif isinstance(part, ast.Name) and part.id in _TYPES:
            types += _TYPES[part.id]
            literal_only = False
        elif isinstance(part, ast.Constant) and part.value is None:
            types.append(type(None))
            literal_only = False
        else:
            return None  # a callback or an object: for code, not an option
    unique = tuple(dict.fromkeys(types))
    choice_set = tuple(choices) if literal_only else None
    return Option(unique, choice_set, None, default, items)


def _keywords(
    init: ast.FunctionDef, names: dict[str, ast.expr], skip: tuple[str, ...]
) -> dict[str, Option]:
    args = init.args
    defaults = [None] * (len(args.args) - len(args.defaults)) + list(args.defaults)
    positional = [
        (a, d) for a, d in zip(args.args, defaults) if a.arg not in ("self", *skip)
    ]
    pairs = [*positional, *zip(args.kwonlyargs, args.kw_defaults)]
    out = {}
    for arg, node in pairs:
        try:
            default = ... if node is None else _const(node, names)
        except ValueError:
            default = ...
        option = _option(arg.annotation, default)
        if option is not None:
            out[arg.arg] = option
    return out


def _registered_name(cls: ast.ClassDef, decorator: str) -> str | None:
    for deco in cls.decorator_list:
        if (
            isinstance(deco, ast.Call)
            and isinstance(deco.func, ast.Name)
            and deco.func.id == decorator
            and deco.args
            and isinstance(deco.args[0], ast.Constant)
        ):
            return str(deco.args[0].value)
    return None


#: The folder holding ``research/`` (where project modules are looked up).
PROJECT = Path(__file__).resolve().parent.parent


@dataclass
class _Source:
    """One parsed module: its classes, constants and where its names come from."""

    path: Path
    root: Path  # the folder its top-level package lives in
    tree: ast.Module
    classes: dict[str, ast.ClassDef]
    imports: dict[str, tuple[str, str]]  # local name -> (module, name there)
    _names: dict[str, ast.expr] | None = None

    @property
    def names(self) -> dict[str, ast.expr]:
        """Module-level constants, and those imported from project modules."""
        if self._names is None:
            out: dict[str, ast.expr] = {}
            for local, (module, attr) in self.imports.items():
                theirs = _source(module, self.root)
                if theirs is not None and attr in _assignments(theirs.tree):
                    try:
                        value = _const(_assignments(theirs.tree)[attr], theirs.names)
                    except ValueError:
                        continue
                    out[local] = ast.Constant(value)
            self._names = {**out, **_assignments(self.tree)}
        return self._names


_SOURCES: dict[tuple[Path, int], _Source] = {}


def _parse(path: Path, root: Path) -> _Source:
    path = path.resolve()
    key = (path, path.stat().st_mtime_ns)
    if key not in _SOURCES:
        tree = ast.parse(path.read_text(), filename=str(path))
        imports = {
            (a.asname or a.name): (n.module, a.name)
            for n in tree.body
            if isinstance(n, ast.ImportFrom) and not n.level and n.module
            for a in n.names
        }
        classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        _SOURCES[key] = _Source(path, root, tree, classes, imports)
    return _SOURCES[key]


def _source(module: str, root: Path) -> _Source | None:
    """A project module's source (beside ``root``'s packages, or ours)."""
    for base in dict.fromkeys((root, PROJECT)):
        stem = base.joinpath(*module.split("."))
        for path in (stem.with_suffix(".py"), stem / "__init__.py"):
            if path.is_file():
                return _parse(path, base)
    return None


def _assignments(tree: ast.Module) -> dict[str, ast.expr]:
    return {
        t.id: n.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }


def _lineage(cls: ast.ClassDef, src: _Source) -> list[tuple[ast.ClassDef, _Source]]:
    """``cls`` and its first bases, nearest first, through project modules."""
    out = [(cls, src)]
    while True:
        bases = [b.id for b in cls.bases if isinstance(b, ast.Name)]
        if not bases:
            return out
        name = bases[0]
        if name in src.classes:
            cls = src.classes[name]
        elif name in src.imports:
            module, attr = src.imports[name]
            theirs = _source(module, src.root)
            if theirs is None or attr not in theirs.classes:
                return out  # outside the project (Averager's own bases: none)
            cls, src = theirs.classes[attr], theirs
        else:
            return out
        if any(c is cls for c, _ in out):
            return out
        out.append((cls, src))


def _init(cls: ast.ClassDef) -> ast.FunctionDef | None:
    for item in cls.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            return item
    return None


def _options(
    lineage: list[tuple[ast.ClassDef, _Source]], skip: tuple[str, ...]
) -> dict[str, Option]:
    """The keywords of the nearest ``__init__``; one that passes ``**kw`` on
    to its base also has the base's (the nearest declaration wins)."""
    out: dict[str, Option] = {}
    for cls, src in lineage:
        init = _init(cls)
        if init is None:
            continue
        for key, option in _keywords(init, src.names, skip).items():
            out.setdefault(key, option)
        if init.args.kwarg is None:  # nothing passed on: the base's are not ours
            return out
    if not out:
        raise LookupError(f"{lineage[0][0].name}: no __init__ found")
    return out


def _class_dict(
    lineage: list[tuple[ast.ClassDef, _Source]], attr: str
) -> dict[str, tuple[ast.expr, _Source]]:
    """``attr = {...}`` of the classes of ``lineage`` merged, the nearest winning."""
    out: dict[str, tuple[ast.expr, _Source]] = {}
    for cls, src in reversed(lineage):
        for item in cls.body:
            if isinstance(item, ast.Assign):
                target = item.targets[0]
            elif isinstance(item, ast.AnnAssign):
                target = item.target
            else:
                continue
            if not (isinstance(target, ast.Name) and target.id == attr):
                continue
            if not isinstance(item.value, ast.Dict) or None in item.value.keys:
                raise ValueError(f"{cls.name}.{attr} must be a dict literal")
            for key, value in zip(item.value.keys, item.value.values):
                out[ast.literal_eval(key)] = (value, src)
    return out


def _ranges(lineage: list[tuple[ast.ClassDef, _Source]]) -> dict[str, Range]:
    out: dict[str, Range] = {}
    for key, (call, src) in _class_dict(lineage, "option_ranges").items():
        if not (isinstance(call, ast.Call) and getattr(call.func, "id", "") == "Range"):
            raise ValueError(
                f"{lineage[0][0].name}.option_ranges[{key!r}]: use Range()"
            )
        bounds = {kw.arg: _const(kw.value, src.names) for kw in call.keywords}
        out[key] = Range(**bounds)
    return out


def read(
    path: Path, module: str, decorator: str, skip: tuple[str, ...] = ("world",)
) -> dict[str, Declared]:
    """The classes in ``path`` decorated ``@decorator("NAME")``, by name.

    A class's options are its ``__init__``'s keywords; where that passes
    ``**kw`` on, its base's too (followed into project modules: a subclass of
    ``Rank0Blocking`` in a module of yours has its options as well).

    Args:
      path: the module's source file.
      module: its dotted name.
      decorator: the registering decorator's name.
      skip: leading positional parameters that are not options.

    Raises:
      ValueError: a name registered twice in the module, or a range on an
        option the constructor does not have.
    """
    out: dict[str, Declared] = {}
    if f"@{decorator}(" not in path.read_text():
        return out
    root = path.resolve().parents[module.count(".")]
    src = _parse(path, root)
    for cls in src.classes.values():
        name = _registered_name(cls, decorator)
        if name is None:
            continue
        if name in out:
            raise ValueError(f"{name!r} registered twice: {path}")
        lineage = _lineage(cls, src)
        options = _options(lineage, skip)
        own = _class_dict(lineage[:1], "option_ranges")
        for key, rng in _ranges(lineage).items():
            if key not in options:
                if key in own:  # a base's range of an option this class drops is moot
                    raise ValueError(f"{path}: {cls.name}.option_ranges names {key!r}")
                continue
            o = options[key]
            options[key] = Option(o.types, o.choices, rng, o.default, o.items)
        renamed = {
            k: ast.literal_eval(v)
            for k, (v, _) in _class_dict(lineage, "renamed_options").items()
        }
        out[name] = Declared(name, module, options, renamed, _options_check(cls))
    return out


def _options_check(cls: ast.ClassDef) -> str | None:
    """The class's ``options_check = "module:function"``, if it has one."""
    for item in cls.body:
        target = item.targets[0] if isinstance(item, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id == "options_check":
            value = ast.literal_eval(item.value)
            if not (isinstance(value, str) and ":" in value):
                raise ValueError(f'{cls.name}.options_check must be "module:function"')
            return value
    return None


def module_name(path: Path, project: Path) -> str:
    """``research.comm.dense.averagers`` for
    ``<project>/research/comm/dense/averagers.py``."""
    return ".".join(path.relative_to(project).with_suffix("").parts)
