"""The layers of ``research/layers.py`` hold for the real imports, and the check
catches an import that breaks them."""

from __future__ import annotations

import shutil
from pathlib import Path

from research import layers

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
    assert "research/layers.py" in str(bad)
    # The three the issue named: comm importing the API, the launcher, above it.
    for line in (
        "from research.api import wrap",
        "from research.launch import SHM_DIR",
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
