"""The README stays true: short, its quick commands run as written, and every
module, file and results page it names exists."""

from __future__ import annotations

import importlib.util
import re
import shlex

import pytest

from tests.harness import ROOT, python

README = (ROOT / "README.md").read_text()
MAX_LINES = 250


def bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README, flags=re.S)


def commands() -> list[str]:
    lines = []
    for block in bash_blocks():
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            if line:
                lines.append(line)
    return lines


def test_readme_is_short():
    assert len(README.splitlines()) <= MAX_LINES


def test_set_up_commands_are_the_makefiles():
    assert {"make run", "make test"} <= set(commands())
    makefile = (ROOT / "Makefile").read_text()
    assert "\nrun:" in makefile and "\ntest:" in makefile


QUICK = [c for c in commands() if c.endswith(("--help", "--list"))]


@pytest.mark.parametrize("command", QUICK)
def test_quick_commands_run_as_written(command):
    # `.venv/bin/python` is this interpreter here (CI runs in the same .venv).
    argv = shlex.split(command)
    assert argv[0] == ".venv/bin/python", command
    proc = python(argv[1:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip()


def test_named_modules_exist():
    names = set(re.findall(r"python -m ((?:experiments|scripts)\.\w+)", README))
    assert "experiments.eager_sgd" in names
    names.discard("experiments.NAME")  # the pattern, as written in prose
    missing = [n for n in sorted(names) if importlib.util.find_spec(n) is None]
    assert not missing, missing


def test_named_paths_exist():
    paths = set(
        re.findall(
            r"`((?:research|scripts|models|experiments|examples|docs|tests)/[\w./-]+)`",
            README,
        )
    )
    paths |= set(re.findall(r"\]\((docs/[\w./-]+)\)", README))
    assert "docs/journal.md" in paths
    missing = [p for p in sorted(paths) if not (ROOT / p).exists()]
    assert not missing, missing
