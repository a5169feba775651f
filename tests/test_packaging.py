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
            "import scripts.plot_deepfreeze, scripts.plot_eager_sgd, experiments, "
            "research, models",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
