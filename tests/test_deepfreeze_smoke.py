"""End-to-end smoke test of ``python -m experiments.deepfreeze`` at toy size.

Two ranks, a small MLP, one round of short windows: the experiment must start
its MPI job itself, print the table with every strategy and the targets, and
leave the job's results and all three figures in the run folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_default_pipeline_at_toy_size(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    cmd = [
        sys.executable,
        "-m",
        "experiments.deepfreeze",
        "--np",
        "2",
        "--sweep-ranks",
        "--rounds",
        "1",
        "--window",
        "4",
        "--gap",
        "2",
        "--interval",
        "4",
        "--intervals",
        "2",
        "--batch-size",
        "8",
        "--model-opt",
        "features=256",
        "--data-opt",
        "features=256",
        "--data-opt",
        "n_train=256",
        "--run-dir",
        str(tmp_path),
    ]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("rank0-sync", "orbax-sync", "orbax-async-rank0", "deepfreeze"):
        assert f"| {name} |" in proc.stdout
    assert "target: DeepFreeze blocking" in proc.stdout
    assert "in flight (checkpoint every step, policy skip)" in proc.stdout
    main = json.loads((tmp_path / "main-np2.json").read_text())
    assert main["ranks"] == 2 and main["strategies"]["deepfreeze"]["restore_s"] > 0
    for fig in (
        "overhead_vs_interval.png",
        "blocking_vs_ranks.png",
        "timeline.png",
        "timeline_excerpt.json",
        "table.md",
    ):
        assert (tmp_path / fig).exists(), fig
