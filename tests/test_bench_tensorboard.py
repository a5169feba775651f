"""scripts.bench_tensorboard runs (1 rank, tiny) and reports on / off ratios.

Timings are not judged here (a shared machine); the benchmark prints them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_tiny_run_reports_ratios(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    for var in ("PMI_RANK", "PMI_SIZE", "RESEARCH_UNDER_MPI"):
        env.pop(var, None)
    proc = subprocess.run(
        [
            sys.executable, "-m", "scripts.bench_tensorboard", "--np", "1",
            "--steps", "4", "--rounds", "2", "--log-every", "1",
            "--eval-every", "2", "--out", str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| log every | median step off (ms) | on / off |" in proc.stdout
    assert "% of training time |" in proc.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    assert [(r["round"], r["tensorboard"]) for r in results["runs"]] == [
        (0, False),
        (0, True),
        (1, True),
        (1, False),
    ]
    assert list(tmp_path.glob("r1-log1-on/events.out.tfevents.*"))
    assert not list(tmp_path.glob("r1-log1-off/events.out.tfevents.*"))
