"""The project's layers, written down once and checked against the real imports.

:data:`UNITS` lists every unit of the project (a package such as
``research.comm``, or a single module such as ``research.trace``), lowest
first, each with the units it may import besides its own modules. A unit names
only units listed before it, so the table is the layering and nothing imports
upward: ``research.comm`` imports nothing of ours but the timeline, the
declared-options reader (``research.options``), the registry and the
machine's description (``research.provenance``);
``research.checkpoint`` is a library below training (the Trainer's checkpoint
hook lives in ``research.train.checkpointing``, the interleaved saver
benchmark in ``research.studies.checkpoint_bench``); ``research`` never imports
``experiments``, ``scripts`` or ``tests``.

Every import counts, also one inside a function (a lazy import is still a
dependency) or under ``TYPE_CHECKING``. ``tests/test_layers.py`` runs
:func:`violations` over the project and over a module with a forbidden import,
which it must catch. To add a unit, add its row here, after what it imports.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

_FOUNDATION: tuple[str, ...] = ()

#: unit -> the units it may import (besides itself), lowest unit first.
UNITS: dict[str, tuple[str, ...]] = {
    # Foundations: nothing of ours.
    "research.layers": _FOUNDATION,
    "research.option_spec": _FOUNDATION,  # what a declared option accepts
    "research.options": ("research.option_spec",),  # read from the source
    "research.registry": ("research.option_spec",),  # names by class decorator
    "research.trace": _FOUNDATION,
    "research.privdir": _FOUNDATION,
    "research.periodic": _FOUNDATION,
    "research.provenance": _FOUNDATION,
    "research.rundir": _FOUNDATION,
    "research.imbalance": _FOUNDATION,
    "research.trace_analysis": _FOUNDATION,
    "research.data": _FOUNDATION,
    "research.localnet": _FOUNDATION,  # nodes as network namespaces, one machine
    "models": _FOUNDATION,
    # Communication: MPI start-up, collectives, the strategies' communication.
    "research.comm": (
        "research.options",
        "research.provenance",
        "research.registry",
        "research.trace",
    ),
    # Starting ranks: mpiexec, threads and heap settings of the processes.
    "research.launch": (
        "research.comm",
        "research.localnet",
        "research.privdir",
        "models",
    ),
    # Relaunching a failed job on the nodes that still answer (--max-restarts).
    "research.restart": ("research.comm", "research.launch"),
    # Checkpointing: a library below training.
    "research.checkpoint": (
        "research.comm",
        "research.launch",
        "research.options",
        "research.periodic",
        "research.privdir",
        "research.registry",
        "research.trace",
    ),
    # Training: state, steps, executors, the loop and its hooks.
    "research.train": (
        "research.checkpoint",
        "research.comm",
        "research.data",
        "research.imbalance",
        "research.launch",
        "research.localnet",
        "research.periodic",
        "research.restart",
        "research.rundir",
        "research.trace",
        "models",
    ),
    # What users and entry points call.
    "research.api": ("research.comm", "research.train"),
    "research": ("research.api",),  # the package itself: research.averaging
    "research.plots": ("research.rundir", "research.trace"),
    "research.runner": (
        "research.comm",
        "research.plots",
        "research.rundir",
        "research.train",
    ),
    "research.cli": (
        "research.checkpoint",
        "research.comm",
        "research.data",
        "research.launch",
        "research.privdir",
        "research.train",
        "models",
    ),
    # The papers' experiment logic.
    "research.studies": (
        "research.checkpoint",
        "research.cli",
        "research.comm",
        "research.imbalance",
        "research.launch",
        "research.localnet",
        "research.periodic",
        "research.plots",
        "research.provenance",
        "research.rundir",
        "research.trace",
        "research.trace_analysis",
        "research.train",
    ),
    # Entry points and users' code: anything of the library.
    "experiments": ("research.*", "models"),
    "examples": ("research.*", "models"),
    "scripts": ("research.*", "models", "experiments"),
}
#: Top-level names that are ours (an import of anything else is not checked).
OURS = ("research", "models", "experiments", "scripts", "examples", "tests")
#: Folders checked by :func:`violations` (``tests`` may import anything).
CHECKED = ("research", "models", "experiments", "scripts", "examples")


@dataclass(frozen=True)
class Violation:
    """One import a unit may not make."""

    path: str
    line: int
    unit: str
    imported: str

    def __str__(self) -> str:
        if self.unit not in UNITS:
            return f"{self.path}: {self.unit} is in no row of research/layers.py"
        allowed = ", ".join(UNITS.get(self.unit, ())) or "nothing of ours"
        return (
            f"{self.path}:{self.line}: {self.unit} imports {self.imported}; "
            f"it may import {allowed} (research/layers.py)"
        )


def unit_of(module: str) -> str | None:
    """The unit ``module`` belongs to (the longest entry of :data:`UNITS` that
    is it or a package above it); None when it is not ours."""
    parts = module.split(".")
    if parts[0] not in OURS:
        return None
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in UNITS:
            return name
    return parts[0]  # ours but in no row (tests): allowed to nobody


def allowed(unit: str, target: str) -> bool:
    """Whether ``unit`` may import a module of unit ``target``."""
    if target == unit:
        return True
    for rule in UNITS.get(unit, ()):
        wild = rule.endswith(".*") and (
            target == rule[:-2] or target.startswith(rule[:-1])
        )
        if rule == target or (wild and target in UNITS):
            return True
    return False


def _imported(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """``(line, module or module.name)`` of every import in ``tree``."""
    package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package up
                parts = package.split(".")
                up = parts[: len(parts) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            # ``from research import privdir`` imports research.privdir: each
            # name is judged as ``base.name`` (the longest row that matches).
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def check_source(
    module: str, source: str, path: str = "", is_package: bool = False
) -> list[Violation]:
    """The forbidden imports in the source of ``module`` (a dotted name)."""
    unit = unit_of(module)
    if unit is None:
        return []
    if unit == "research" and module != "research":
        return [Violation(path or module, 0, module, "")]
    tree = ast.parse(source, filename=path or module)
    out: list[Violation] = []
    seen: set[tuple[int, str]] = set()
    for line, name in _imported(tree, module, is_package):
        target = unit_of(name)
        if target is None or allowed(unit, target) or (line, target) in seen:
            continue
        seen.add((line, target))
        out.append(Violation(path or module, line, unit, target))
    return out


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def violations(root: str | Path) -> list[Violation]:
    """Every forbidden import under ``root`` (the project's folder), plus rows
    of :data:`UNITS` that name a unit listed after them."""
    root = Path(root)
    out: list[Violation] = []
    order = list(UNITS)
    for i, (unit, deps) in enumerate(UNITS.items()):
        for dep in deps:
            if not dep.endswith(".*") and (dep not in UNITS or order.index(dep) > i):
                out.append(Violation("research/layers.py", 0, unit, dep))
    for top in CHECKED:
        for path in sorted((root / top).rglob("*.py")):
            module = _module_name(path, root)
            rel = str(path.relative_to(root))
            package = path.name == "__init__.py"
            out += check_source(module, path.read_text(), rel, package)
    return out
