"""The import rules of ``research/import_rules.py`` hold for the real imports,
between units and inside every package, no import circle is left in the checked
folders (``scripts`` too), and the checks catch an import that breaks them,
also one made with ``import_module``."""

from __future__ import annotations

import shutil
from pathlib import Path

from research import import_rules as layers

ROOT = Path(__file__).resolve().parent.parent


def test_the_project_keeps_its_layers():
    found = layers.violations(ROOT)
    assert not found, "\n".join(map(str, found))


def test_every_unit_names_only_units_below_it():
    order = list(layers.UNITS)
    for i, (unit, deps) in enumerate(layers.UNITS.items()):
        for dep in deps:
            if not dep.endswith(".*"):
                assert order.index(dep) < i, f"{unit} may import {dep}, listed later"


def test_a_forbidden_import_is_caught_even_inside_a_function():
    source = (
        "import numpy\n\ndef hook():\n    from research.train.loop import Trainer\n"
    )
    (bad,) = layers.check_source("research.checkpoint.hook", source)
    assert (bad.unit, bad.imported, bad.line) == (
        "research.checkpoint",
        "research.train",
        4,
    )
    assert "research/import_rules.py" in str(bad)
    # The three the issue named: comm importing the API, the launcher, above it.
    for line in (
        "from research.api import wrap",
        "from research.entry.launch import SHM_DIR",
        "from research import cli",
        "from ..api import wrap",  # relative, from research/comm/base.py
    ):
        (v,) = layers.check_source("research.comm.base", line + "\n")
        assert v.unit == "research.comm", line
    assert (
        layers.check_source("research.comm.base", "from research import trace\n") == []
    )
    (v,) = layers.check_source("research.studies.x", "import tests.checkpoint_state\n")
    assert v.imported == "tests"


def test_a_forbidden_import_added_to_a_copy_of_the_project_fails_it(tmp_path):
    for top in layers.CHECKED:
        shutil.copytree(ROOT / top, tmp_path / top)
    assert layers.violations(tmp_path) == []
    config = tmp_path / "research" / "checkpoint" / "config.py"
    config.write_text(config.read_text() + "\nfrom research.studies import presets\n")
    (new,) = layers.violations(tmp_path)
    assert new.path == "research/checkpoint/config.py"
    assert (new.unit, new.imported) == ("research.checkpoint", "research.studies")
    # A module in no row of the table is reported too.
    (tmp_path / "research" / "newthing.py").write_text("import os\n")
    assert any("in no row" in str(v) for v in layers.violations(tmp_path))


def test_no_import_circle_anywhere_in_research():
    assert layers.circles(ROOT) == []


def test_every_package_has_its_members_in_order():
    """Each package of research/ (but research itself, whose units UNITS
    orders) has a row in INSIDE naming exactly its modules and subpackages."""
    folders = {p.parent for p in (ROOT / "research").rglob("*.py")}
    for folder in sorted(folders - {ROOT / "research"}):
        assert (folder / "__init__.py").exists(), f"{folder}: no __init__.py"
        package = ".".join(folder.relative_to(ROOT).parts)
        members = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
        members |= {d.name for d in folder.iterdir() if (d / "__init__.py").exists()}
        row = set(layers.INSIDE.get(package, ()))
        if layers.ANY in row:  # the strategies: a new one needs no row
            assert row - {layers.ANY} <= members, package
        else:
            assert row == members, package


def test_an_import_back_inside_a_package_is_caught():
    inside = layers.check_inside
    # The circle this project opened: the watchdog taking abort from the world.
    why = inside("research.comm.faults.watchdog", "research.comm.world")
    assert "faults is listed before world" in why
    assert inside("research.comm.world", "research.comm.faults.watchdog") is None
    # Within a subpackage, and a package's face handing on its members.
    assert inside("research.comm.dense.ring_build", "research.comm.dense.ring")
    assert inside("research.comm.dense", "research.comm.dense.mean") is None
    why = inside("research.comm.dense.ring", "research.comm.dense")
    assert "own package's face" in why
    # Between units the table of units decides, not this check.
    assert inside("research.comm.world", "research.train.loop") is None


def test_a_circle_added_to_a_copy_of_the_project_is_caught(tmp_path):
    for top in layers.CHECKED:
        shutil.copytree(ROOT / top, tmp_path / top)
    watchdog = tmp_path / "research" / "comm" / "faults" / "watchdog.py"
    watchdog.write_text(
        watchdog.read_text()
        + "\n\ndef _abort():\n    from research.comm.world import abort\n"
    )
    assert layers.circles(tmp_path) == [
        ["research.comm.faults.watchdog", "research.comm.world"]
    ]
    (back,) = layers.violations(tmp_path)
    assert back.path == "research/comm/faults/watchdog.py"
    assert "research.comm.world" in str(back) and "INSIDE" in str(back)


def test_a_pending_import_that_is_gone_is_reported(monkeypatch):
    pending = {("research.comm.world", "research.comm.sparse"): "a fake entry"}
    monkeypatch.setattr(layers, "PENDING", {**layers.PENDING, **pending})
    (stale,) = layers.violations(ROOT)
    assert "no longer imported, delete it" in str(stale)


def test_an_import_module_of_ours_is_an_import_and_a_computed_one_a_violation():
    """``import_module`` with a name written out is judged as an import; with a
    name computed at run time it is a hidden arrow, reported as one."""
    named = (
        "import importlib\n\ndef f():\n"
        "    importlib.import_module('research.train.loop')\n"
    )
    (bad,) = layers.check_source("research.comm.base", named)
    assert (bad.unit, bad.imported, bad.line) == ("research.comm", "research.train", 4)
    computed = "from importlib import import_module\n\nm = import_module(NAME)\n"
    (hidden,) = layers.check_source("research.entry.restart", computed)
    assert "computed at run time" in str(hidden) and hidden.line == 3
    assert layers.check_source("research.data.x", "__import__('codecs')\n") == []


def test_a_circle_among_the_scripts_is_caught(tmp_path):
    for top in layers.CHECKED:
        shutil.copytree(ROOT / top, tmp_path / top)
    report = tmp_path / "scripts" / "gpu_report.py"
    report.write_text(report.read_text() + "\nfrom scripts.gpu_check import STAGES\n")
    assert ["scripts.gpu_check", "scripts.gpu_report"] in layers.circles(tmp_path)


def test_a_new_strategy_needs_no_row():
    """A strategy module the row does not name takes the row's ``*`` place: it
    may import what the strategies build on, nothing listed may import it."""
    inside = layers.check_inside
    new = "research.strategies.new_one"
    assert "new_one" not in layers.INSIDE["research.strategies"]
    assert inside(new, "research.strategies.base") is None
    assert inside(new, "research.strategies.registry") is None
    assert "listed before" in inside("research.strategies.base", new)
    assert inside("research.strategies", new) is None  # the package's face
