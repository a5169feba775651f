"""scripts.bench_tensorboard runs (1 rank, tiny) and reports on / off ratios.

Timings are not judged here (a shared machine); the benchmark prints them.
"""

from __future__ import annotations

import json

from tests.harness import python


def test_tiny_run_reports_ratios(tmp_path):
    proc = python(
        [
            "-m", "scripts.bench_tensorboard", "--np", "1",
            "--steps", "4", "--rounds", "2", "--log-every", "1",
            "--eval-every", "2", "--out", str(tmp_path),
        ]
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
