"""What the experiments import at their end must be installed, not only in cwd.

``experiments.deepfreeze`` run from another folder finished its runs and then
failed on ``from scripts.plot_deepfreeze import plot_all``: the package list in
pyproject.toml left ``scripts`` out.
"""

from __future__ import annotations

import os
import subprocess
import sys


def test_plot_modules_import_from_any_folder(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import scripts.plot_deepfreeze, scripts.plot_eager_sgd, scripts.results, "
            "research.studies.deepfreeze_plots, experiments, "
            "research, models",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_nothing_imports_the_entry_points():
    """scripts/ holds entry points: the library, models and experiments never
    import them (plots live next to their studies in research/studies/)."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    offenders = [
        f"{path.relative_to(root)}:{n}"
        for pkg in ("research", "models", "experiments")
        for path in sorted((root / pkg).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if line.strip().startswith(("from scripts", "import scripts"))
    ]
    assert not offenders, offenders
