"""What the strategy modules declare, read from their source without importing them.

A strategy is declared in one place, its own module::

    @register_averager("solo")
    class SoloAverager(Averager):
        option_ranges = {"full_every": Range(ge=1)}

        def __init__(self, world, *, seed: int = 0, full_every: int = 32): ...

Checking ``--strategy solo --strategy-opt seed=3`` happens before an experiment
relaunches itself under ``mpiexec``, where importing the strategy module would
import mpi4py and so initialise MPI in the launching process. So the names and
their options are read here from the source of the modules under the strategy
roots (:mod:`research.options` reads them): ``research/comm``, and the folders
a higher layer adds with :func:`add_root` (``research/train`` adds itself when
it is imported: this module knows nothing above it). Every class decorated
``@register_averager("NAME")``, the annotated keyword arguments of its
``__init__`` (or of the nearest base class in the same module that defines
one) and the class's ``option_ranges``.
"""

from __future__ import annotations

import functools
from pathlib import Path

from research.options import Declared, Option, Range, module_name, read

__all__ = ["Option", "Range", "Strategy", "add_root", "modules_with", "strategies"]

#: A strategy as declared (the same record as a saver's).
Strategy = Declared

PACKAGE = Path(__file__).resolve().parent.parent  # research/
#: Where strategy modules live: communication-only ones under research/comm;
#: folders of higher layers (``research/train``: strategies that bring their own
#: executor, ``layerwise``) are added by those layers with :func:`add_root`.
ROOTS: list[Path] = [PACKAGE / "comm"]
DECORATOR = "register_averager"


def add_root(folder: str | Path) -> None:
    """Also read the strategy modules under ``folder``, a package folder below
    the project root (idempotent). A layer above ``research.comm`` calls this
    for itself when it is imported."""
    folder = Path(folder).resolve()
    folder.relative_to(PACKAGE.parent)  # a ValueError outside the project
    if folder not in ROOTS:
        ROOTS.append(folder)
        strategies.cache_clear()


def modules_with(marker: str) -> list[str]:
    """Modules under :data:`ROOTS` whose source contains ``marker`` (e.g. a
    decorator), found without importing anything."""
    return [
        module_name(path, PACKAGE.parent)
        for root in ROOTS
        for path in sorted(root.rglob("*.py"))
        if marker in path.read_text()
    ]


@functools.lru_cache(maxsize=1)
def strategies() -> dict[str, Strategy]:
    """Every built-in strategy, by name, from the sources under :data:`ROOTS`."""
    out: dict[str, Strategy] = {}
    for path in (p for root in ROOTS for p in sorted(root.rglob("*.py"))):
        for name, found in read(
            path, module_name(path, PACKAGE.parent), DECORATOR
        ).items():
            if name in out:
                raise ValueError(f"strategy {name!r} registered twice: {path}")
            out[name] = found
    return out


def strategies_in(module: str) -> dict[str, Strategy]:
    """The strategies a module outside research/ declares, from its source
    (found with ``importlib.util.find_spec``: the module is not imported)."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return {}
    return read(Path(spec.origin), module, DECORATOR)
