"""What may import what in this project, written down once and checked.

:data:`UNITS` lists every unit of the project (a package such as
``research.comm``, or a single module such as ``research.trace``), lowest
first, each with the units it may import besides its own modules. A unit names
only units listed before it, so the table is the layering and nothing imports
upward: ``research.comm`` (the collectives) imports nothing of ours but the
timeline and the machine's description (``research.provenance``);
``research.steps`` (the pieces of a step) and ``research.strategies`` lie
between it and training; ``research.checkpoint`` is a library below training;
``research.entry`` (command lines, launching ranks, restarts, one run) is below
the studies that use it; ``research`` never imports ``experiments``,
``scripts`` or ``tests``.

:data:`INSIDE` does the same within each package of ``research``: its members
(modules and subpackages), lowest first; a member imports only members listed
before it (a package's ``__init__`` may hand on any of its members). Together
they leave no import circle; :func:`circles` finds any, in ``research`` and
in every other checked folder (``scripts`` too), as a second check.

Every import counts, also one inside a function (a lazy import is still a
dependency), one under ``TYPE_CHECKING``, and ``importlib.import_module`` or
``__import__`` of a name written out; one of a name computed at run time is a
hidden arrow and reported as such (import the module by name instead).
``tests/test_import_rules.py`` runs :func:`violations` and :func:`circles` over
the project and over modules with a forbidden import, which they must catch.
To add a unit, add its row here, after what it imports; to add a module to a
package, put its name in the package's row, after what it imports.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

_FOUNDATION: tuple[str, ...] = ()

#: unit -> the units it may import (besides itself), lowest unit first.
UNITS: dict[str, tuple[str, ...]] = {
    # Foundations: nothing of ours.
    "research.import_rules": _FOUNDATION,
    "research.options": _FOUNDATION,  # typed options: strategies', savers'
    "research.flags": _FOUNDATION,  # configs that carry their flags
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
    # Communication: MPI start-up and the collectives, nothing of steps.
    "research.comm": ("research.provenance", "research.trace"),
    # Bad command-line input (one line, exit 2), and threads per rank.
    "research.usage": ("research.comm",),
    "research.threads": ("research.comm", "models"),
    # Checkpointing: a library below training.
    "research.checkpoint": (
        "research.comm",
        "research.flags",
        "research.options",
        "research.periodic",
        "research.privdir",
        "research.threads",
        "research.trace",
    ),
    # The pieces of a step: state, jitted pieces, the model stage by stage.
    "research.steps": ("models",),
    # The strategies: one module each, the object the Trainer and users call.
    "research.strategies": (
        "research.comm",
        "research.options",
        "research.steps",
        "research.trace",
    ),
    # Training: config, optimizer, the loop and its hooks.
    "research.train": (
        "research.checkpoint",
        "research.comm",
        "research.data",
        "research.flags",
        "research.imbalance",
        "research.localnet",
        "research.periodic",
        "research.rundir",
        "research.steps",
        "research.strategies",
        "research.threads",
        "research.trace",
        "research.usage",
        "models",
    ),
    # What users and entry points call.
    "research.api": ("research.comm", "research.strategies"),
    "research": ("research.api",),  # the package itself: research.averaging
    "research.plots": ("research.rundir", "research.trace"),
    # Command lines, launching ranks, restarts, one training run.
    "research.entry": (
        "research.checkpoint",
        "research.comm",
        "research.data",
        "research.localnet",
        "research.plots",
        "research.privdir",
        "research.rundir",
        "research.strategies",
        "research.threads",
        "research.train",
        "research.usage",
        "models",
    ),
    # The papers' experiment logic.
    "research.studies": (
        "research.checkpoint",
        "research.comm",
        "research.data",  # a preset's data options on another dataset
        "research.flags",
        "research.entry",
        "research.imbalance",
        "research.localnet",
        "research.periodic",
        "research.plots",
        "research.provenance",
        "research.rundir",
        "research.steps",
        "research.strategies",
        "research.threads",
        "research.trace",
        "research.trace_analysis",
        "research.train",
        "research.usage",
    ),
    # Entry points and users' code: anything of the library.
    "experiments": ("research.*", "models"),
    "examples": ("research.*", "models"),
    "scripts": ("research.*", "models", "experiments"),
}

#: A member of a package's row that stands for every member it does not name
#: (a new strategy: one module, no row to edit): it may import what is listed
#: before it, and nothing listed imports it but the package's face.
ANY = "*"
#: package -> its members, lowest first (see the module docstring).
INSIDE: dict[str, tuple[str, ...]] = {
    "research.comm": (
        *("process", "link", "info", "faults", "world", "asynchronous"),
        *("dense", "partial_rounds", "partial", "ps", "sparse"),
    ),
    "research.comm.process": ("env", "malloc", "devices"),
    "research.comm.faults": ("failures", "lifeline", "rollcall", "traffic", "watchdog"),
    "research.comm.asynchronous": ("progress", "inflight", "handles"),
    "research.comm.dense": (
        *("sizes", "fusion", "chain", "ring_build", "ring", "hierarchical", "xla"),
        *("choose", "mean"),
    ),
    "research.comm.sparse": (
        *("vector", "quant", "wire", "cost", "calibration", "algorithms"),
        *("select", "mean", "topk"),
    ),
    "research.checkpoint": (
        *("integrity", "leaves", "partition", "shard", "rawshard", "read"),
        *("manifest", "tiers", "restore", "agreement", "cpuclock", "snapshot"),
        *("registry", "base", "background", "baselines", "writer", "deepfreeze"),
        *("savers", "config", "offline", "overhead"),
    ),
    "research.data": (
        *("protocol", "sharding", "base", "csv_table", "candle", "cifar10"),
        *("digits", "synthetic", "imagenet"),
    ),
    "research.data.imagenet": (
        *("decode", "transforms", "layout", "records", "pipeline", "dataset"),
    ),
    "research.localnet": ("cluster", "hosts", "__main__"),
    "research.trace_analysis": ("events", "intervals", "metrics", "report"),
    "research.steps": (
        *("state", "jitted", "split", "stages", "flat", "activation_exchange"),
    ),
    "research.strategies": (
        *("base", "registry", "fused", "host", "partial", "ps", "staged"),
        *("layerwise", "overlap", "sparse", "adaptive", ANY),
    ),
    "research.strategies.adaptive": (
        *("candidates", "stamp", "exchange", "changepoint", "model", "policy"),
        *("seeding", "call", "trainer", "strategy"),
    ),
    "research.train": (
        *("optim", "profiling", "faults", "config", "callback", "checkpointing"),
        *("restart_record", "preemption", "evaluate", "tensorboard", "report"),
        "records",
        *("setup", "prefetch", "loop", "process"),
    ),
    "research.entry": ("launch", "restart", "cli", "run"),
    "research.studies": (
        *("intervals", "presets", "network", "network_page", "checkpoint_bench"),
        *("deepfreeze_page", "deepfreeze", "deepfreeze_plots"),
        *("eager_sgd_page", "eager_sgd", "eager_sweep", "eager_sgd_plots"),
        *("overlap_page", "overlap", "scalability", "scalability_plots"),
        *("scalability_report", "scalability_page"),
        *("sparcml_arms", "sparcml_bench", "sparcml_commbound", "sparcml_page"),
        *("sparcml_plots", "sparcml", "adaptive_link", "adaptive_oracle", "adaptive"),
        *("adaptive_report", "adaptive_page", "adaptive_plots"),
    ),
}
#: Imports that break :data:`INSIDE` and that another issue removes, each with
#: who does. An entry whose import is gone is reported: delete it then.
PENDING: dict[tuple[str, str], str] = {}
#: Top-level names that are ours (an import of anything else is not checked).
OURS = ("research", "models", "experiments", "scripts", "examples", "tests")
#: Folders checked by :func:`violations` (``tests`` may import anything).
CHECKED = ("research", "models", "experiments", "scripts", "examples")


@dataclass(frozen=True)
class Violation:
    """One import a unit (or a package's member) may not make."""

    path: str
    line: int
    unit: str
    imported: str
    why: str = ""  # inside a package, or a stale row: said in full

    def __str__(self) -> str:
        if self.why:
            return f"{self.path}:{self.line}: {self.why} (research/import_rules.py)"
        if self.unit not in UNITS:
            return f"{self.path}: {self.unit} is in no row of research/import_rules.py"
        allowed = ", ".join(UNITS.get(self.unit, ())) or "nothing of ours"
        return (
            f"{self.path}:{self.line}: {self.unit} imports {self.imported}; "
            f"it may import {allowed} (research/import_rules.py)"
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
        elif isinstance(node, ast.Call) and _loader(node.func):
            arg = node.args[0] if node.args else None
            named = isinstance(arg, ast.Constant) and isinstance(arg.value, str)
            out.append((node.lineno, arg.value if named else COMPUTED))
    return out


#: What :func:`_imported` returns for ``import_module(<an expression>)``.
COMPUTED = "<computed>"


def _loader(func: ast.expr) -> bool:
    """``import_module``, ``importlib.import_module`` or ``__import__``."""
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in ("import_module", "__import__")


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
        if name == COMPUTED:
            why = (
                "import_module or __import__ of a name computed at run time: "
                "a hidden arrow; import the module by its name"
            )
            out.append(Violation(path or module, line, unit, name, why))
            continue
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


def check_inside(module: str, target: str) -> str | None:
    """Why ``module`` may not import ``target`` (modules or packages of
    ``research``) by :data:`INSIDE`, or None."""
    if (module, target) in PENDING:
        return None
    a, b = module.split("."), target.split(".")
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    package = ".".join(a[:n])
    if package == module or n < 2:  # a package's face; or between units
        return None
    if package == target:
        return f"{module} imports its own package's face {package}"
    row = INSIDE.get(package)
    if row is None:
        return f"package {package} has no row in INSIDE"
    mine, theirs = a[n], b[n]
    place = {m: m if m in row else ANY for m in (mine, theirs)}
    for m in (mine, theirs):
        if place[m] not in row:
            return f"{package}.{m} is in no place of {package}'s row in INSIDE"
    if row.index(place[theirs]) > row.index(place[mine]) or (
        place[theirs] == ANY and mine != theirs
    ):
        return (
            f"{module} imports {target}: in {package}, {mine} is listed before "
            f"{theirs} (INSIDE)"
        )
    return None


def _resolve(name: str, modules: set[str]) -> str | None:
    """The module or package of ours that ``name`` (a module, or a name in
    one) is, or None."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


@dataclass
class _Tree:
    """Every module of the checked folders: its file and its imports."""

    files: dict[str, Path]
    imports: dict[str, list[tuple[int, str]]]

    @classmethod
    def read(cls, root: Path) -> _Tree:
        files: dict[str, Path] = {}
        imports: dict[str, list[tuple[int, str]]] = {}
        for top in CHECKED:
            for path in sorted((root / top).rglob("*.py")):
                module = _module_name(path, root)
                files[module] = path
                tree = ast.parse(path.read_text(), filename=str(path))
                package = path.name == "__init__.py"
                imports[module] = _imported(tree, module, package)
        return cls(files, imports)

    def edges(self, module: str) -> list[tuple[int, str]]:
        """``(line, module of the tree)`` that ``module`` imports."""
        ours = set(self.files)
        out = []
        for line, name in self.imports[module]:
            target = _resolve(name, ours)
            if target and target != module:
                out.append((line, target))
        return out


def violations(root: str | Path) -> list[Violation]:
    """Every forbidden import under ``root`` (the project's folder): between
    units (:data:`UNITS`) and inside packages (:data:`INSIDE`); plus rows of
    :data:`UNITS` that name a unit listed after them, members of
    :data:`INSIDE` that are no module, and stale :data:`PENDING` entries."""
    root = Path(root)
    tree = _Tree.read(root)
    out: list[Violation] = []
    order = list(UNITS)
    for i, (unit, deps) in enumerate(UNITS.items()):
        for dep in deps:
            if not dep.endswith(".*") and (dep not in UNITS or order.index(dep) > i):
                out.append(Violation("research/import_rules.py", 0, unit, dep))
    for module, path in tree.files.items():
        rel = str(path.relative_to(root))
        package = path.name == "__init__.py"
        out += check_source(module, path.read_text(), rel, package)
        if not module.startswith("research."):
            continue
        for line, target in tree.edges(module):
            why = check_inside(module, target)
            if why:
                out.append(Violation(rel, line, module, target, why))
    for package, row in INSIDE.items():
        for member in row:
            if member != ANY and f"{package}.{member}" not in tree.files:
                why = f"INSIDE lists {package}.{member}, which is no module"
                out.append(
                    Violation("research/import_rules.py", 0, package, member, why)
                )
    for (a, b), who in PENDING.items():
        if a not in tree.files or b not in {t for _, t in tree.edges(a)}:
            why = f"PENDING lists {a} -> {b} ({who}): no longer imported, delete it"
            out.append(Violation("research/import_rules.py", 0, a, b, why))
    return out


def circles(root: str | Path) -> list[list[str]]:
    """Every import circle among the modules of the checked folders
    (:data:`CHECKED`: ``research``, ``scripts`` ...; sorted lists of two or
    more modules that import each other, directly or not), apart from the
    imports :data:`PENDING` lists."""
    tree = _Tree.read(Path(root))
    graph = {
        m: {t for _, t in tree.edges(m) if (m, t) not in PENDING} for m in tree.files
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)
