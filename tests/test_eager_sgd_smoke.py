"""End to end: ``python -m experiments.eager_sgd`` with tiny settings on 2 ranks."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.harness import ROOT, python

ARMS = ("balanced", "allreduce", "solo", "majority", "ps")


def run(
    args: list[str], timeout: float = 400, cwd: Path = ROOT
) -> subprocess.CompletedProcess:
    return python(["-m", "experiments.eager_sgd", *args], cwd=cwd, timeout=timeout)


@pytest.mark.launches
def test_tiny_run_writes_folders_table_and_figures(tmp_path):
    # From another folder, with a relative run folder, as users type it.
    out = tmp_path / "runs" / "eager"
    proc = run(
        [
            "--np",
            "2",
            "--steps",
            "6",
            "--eval-every",
            "3",
            "--reference-steps",
            "3",
            "--imbalance",
            "random:k=1:seconds=0.02",
            "--target-acc",
            "0.05",
            "--run-dir",
            "runs/eager",
            "--no-progress",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "| arm | steps | samples/s | median step ms | without own delay" in (
        proc.stdout
    )
    assert "check: allreduce's median step grew by" in proc.stdout
    assert "check: solo's median step without its own delay" in proc.stdout
    for arm in ARMS:
        run_dir = out / f"{arm}-s0"
        for name in ("config.json", "metrics.jsonl", "summary.json", "trace.json"):
            assert (run_dir / name).exists(), f"{arm}: {name} missing"
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["world_size"] == 2
        assert summary["steps"] == (3 if arm == "balanced" else 6)
    for name in (
        "table.md",
        "results.json",
        "throughput.png",
        "accuracy.png",
        "contributors.png",
        "timeline.png",
    ):
        assert (out / name).exists(), f"{name} missing"
    results = json.loads((out / "results.json").read_text())
    arms = {row["arm"]: row for row in results["arms"]}
    assert set(arms) == set(ARMS)
    # Every eager round has at least one fresh contributor, at most 2.
    for arm in ("solo", "majority"):
        mean = arms[arm]["mean_contributors"][0]
        assert 1 <= mean <= 2
    assert arms["allreduce"]["mean_contributors"][0] == 2
    # The delayed rank's sleeps are on the timeline.
    trace = json.loads((out / "solo-s0" / "trace.json").read_text())
    assert any(e.get("cat") == "delay" for e in trace["traceEvents"])
    assert any(e.get("name") == "solo round" for e in trace["traceEvents"])
    # Provenance, and the docs page rendered from this run folder alone.
    from research.provenance import read_jobs
    from scripts.results import render

    (job,) = read_jobs(out)
    assert job["experiment"] == "eager_sgd" and job["world_size"] == 2
    assert job["command"].startswith("python -m experiments.eager_sgd --np 2")
    assert job["cores"] == os.cpu_count() and len(job["load_average"]) == 3
    (page,) = render([out], tmp_path / "docs")
    text = page.read_text()
    assert page.name == "eager_sgd.md" and text.startswith("# eager-SGD")
    assert job["command"] in text and "(2 ranks, 1 MPI job)" in text
    table = [line for line in (out / "table.md").read_text().splitlines() if line]
    assert all(line in text for line in table)
    assert "ended_utc" in job and len(job["load_average_end"]) == 3
    assert "![accuracy](eager_sgd/accuracy.png)" in text
    assert (tmp_path / "docs" / "eager_sgd" / "accuracy.png").is_file()


def test_results_refuses_a_folder_without_a_table(tmp_path):
    from scripts.results import main

    assert main([str(tmp_path), "--out", str(tmp_path / "docs")]) == 2
    assert not (tmp_path / "docs").exists()


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--imbalance", "random:k=9:seconds=1"], "--imbalance"),
        (["--strategy", "host"], "--strategy does not apply"),
        (["--arms", "bogus"], "invalid choice"),
        (["--reference-steps", "0"], "needs the balanced reference"),
    ],
)
def test_bad_flags_exit_2_before_mpi(flags, message):
    proc = run(flags, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_table_from_fake_runs():
    from research.studies.eager_sgd import aggregate, format_table

    runs = [
        {
            "arm": arm,
            "seed": s,
            "steps": 10,
            "samples_per_s": 100.0 * (i + 1),
            "median_step_s": 0.1,
            "time_to_target_s": None if arm == "ps" else 5.0,
            "final_test_acc": 0.9,
            "mean_contributors": 2.0,
            "mean_age": 0.5,
        }
        for i, arm in enumerate(("allreduce", "solo"))
        for s in (0, 1)
    ]
    rows = aggregate(runs)
    table = format_table(rows, 0.85)
    assert "solo 2.00x" in table
    assert "200 +- 0" in table


def test_checks_read_the_done_when_off_the_table():
    from research.studies.eager_sgd import aggregate, format_checks

    def row(arm, step, busy, t, acc):
        return {
            "arm": arm,
            "seed": 0,
            "steps": 10,
            "samples_per_s": 100.0,
            "median_step_s": step,
            "step_without_delay_s": busy,
            "time_to_target_s": t,
            "final_test_acc": acc,
            "mean_contributors": 2.0,
            "mean_age": 0.0,
        }

    rows = aggregate(
        [
            row("balanced", 0.030, 0.030, None, None),
            row("allreduce", 0.060, 0.060, 5.0, 0.90),
            row("solo", 0.040, 0.033, 4.0, 0.89),
            row("majority", 0.050, 0.045, 6.0, 0.85),
        ]
    )
    text = format_checks(rows, "random:k=1:seconds=0.03:how=spin", 4)
    assert "allreduce's median step grew by 30.0 ms over the no-imbalance step " in text
    assert "(30.0 ms), 100% of the 30.0 ms injected delay" in text
    assert "solo's median step without its own delay 33.0 ms, 1.10x" in text
    assert "solo reached the target in 4.0 s against allreduce's 5.0 s (sooner)" in text
    assert "majority reached the target in 6.0 s against allreduce's 5.0 s (NOT" in text
    assert "solo's final accuracy 0.8900, allreduce 0.9000: within 0.02" in text
    assert "majority's final accuracy 0.8500, allreduce 0.9000: NOT within" in text
    # No delay to compare with: no growth line.
    assert "grew" not in format_checks(rows, "none", 4)
