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
    assert "INFO  allreduce's median step grew by" in proc.stdout
    assert "INFO  solo's median step without its own delay" in proc.stdout
    # One seed: every check is undecided, none passes on a point estimate.
    verdicts = [ln.split()[0] for ln in proc.stdout.splitlines()
                if ln.startswith(("PASS", "FAIL", "UNDECIDED"))]  # fmt: skip
    assert verdicts == ["UNDECIDED"] * 6, proc.stdout[-3000:]
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
    from research.studies.eager_sgd_page import load

    arms = {row["arm"]: row for row in load(out)["rows"]}
    assert set(arms) == set(ARMS)
    # Every eager round has at least one fresh contributor, at most 2.
    for arm in ("solo", "majority"):
        mean = arms[arm]["mean_contributors"][0]
        assert 1 <= mean <= 2
    assert arms["allreduce"]["mean_contributors"][0] == 2
    # Every arm's time to the target counts its set-up before the first step.
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert all(r["start_s"] > 0 for r in runs)
    assert all(
        r["time_to_target_s"] >= r["start_s"] for r in runs if r["arm"] != "balanced"
    )
    # The delayed rank's sleeps are on the timeline.
    trace = json.loads((out / "solo-s0" / "trace.json").read_text())
    assert any(e.get("cat") == "delay" for e in trace["traceEvents"])
    assert any(e.get("name") == "solo round" for e in trace["traceEvents"])
    # Provenance, and the docs page rendered from the run's kept files alone.
    from research.provenance import read_jobs
    from scripts.results import render
    from scripts.results.check import check

    (job,) = read_jobs(out)
    assert job["experiment"] == "eager_sgd" and job["world_size"] == 2
    assert job["command"].startswith("python -m experiments.eager_sgd --np 2")
    assert job["cores"] == os.cpu_count() and len(job["load_average"]) == 3
    assert "ended_utc" in job and len(job["load_average_end"]) == 3
    repo = tmp_path / "repo"
    page = render([out], repo)
    text = page.read_text()
    assert page.name == "eager_sgd.md" and text.startswith("# eager-SGD")
    assert job["command"] in text and "(2 ranks, 1 MPI job)" in text
    table = [line for line in (out / "table.md").read_text().splitlines() if line]
    assert all(line in text for line in table)
    assert "![accuracy](eager_sgd/run1/accuracy.png)" in text
    data = repo / "docs/results/eager_sgd/run1"
    assert (data / "accuracy.png").is_file() and (data / "results.json").is_file()
    assert (data / "solo-s0" / "summary.json").is_file()
    assert not list(data.rglob("trace.json")) and not list(data.rglob("metrics.jsonl"))
    assert check(repo)[0] == 0


def test_results_refuses_a_folder_without_a_run_record(tmp_path):
    from scripts.results.cli import main

    assert main([str(tmp_path), "--root", str(tmp_path / "repo")]) == 2
    assert not (tmp_path / "repo" / "docs").exists()


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


def _row(arm, seed, sps, step=0.05, busy=None, t=5.0, acc=0.9):
    return {
        "arm": arm,
        "seed": seed,
        "steps": 10,
        "samples_per_s": sps,
        "median_step_s": step,
        "step_without_delay_s": busy if busy is not None else step,
        "time_to_target_s": t,
        "final_test_acc": acc,
        "mean_contributors": 2.0,
        "mean_age": 0.5,
    }


def test_table_from_constructed_runs():
    from research.studies.eager_sgd_page import aggregate, format_table, speedups

    runs = [
        _row(arm, s, 100.0 * (i + 1) + s, t=None if arm == "ps" else 5.0)
        for i, arm in enumerate(("allreduce", "solo"))
        for s in (0, 1)
    ]
    rows = aggregate(runs)
    table = format_table(rows, 0.85)
    assert "| solo | 10 | 200 +- 1 |" in table
    fast = speedups(rows)["solo"]
    assert fast.n == 2 and fast.value == pytest.approx((200 / 100 + 201 / 101) / 2)
    assert fast.show(".2f", "x").startswith("2.00x [")


def test_checks_are_decided_on_the_seeds_intervals():
    from research.studies.eager_sgd_page import aggregate, checks

    seeds = (0, 1, 2, 3)
    rows = aggregate(
        [_row("balanced", s, 200.0, 0.030, 0.030, None, None) for s in seeds]
        + [_row("allreduce", s, 100.0 + s, 0.060, 0.060, 5.0 + 0.1 * s,
                0.90 + 0.004 * (s % 2)) for s in seeds]
        # solo: about 1.5x, sooner by about 1 s, the same accuracy per seed.
        + [_row("solo", s, 150.0 + s, 0.040, 0.033, 4.0 + 0.1 * s,
                0.90 + 0.004 * (s % 2)) for s in seeds]
        # majority: no faster (the seeds' noise around 1x), later, a clear loss.
        + [_row("majority", s, 100.0 + 3 * (-1) ** s, 0.050, 0.045, 6.0 + 0.1 * s,
                0.85) for s in seeds]
    )  # fmt: skip
    text = "\n".join(checks(rows, 0.03, 0.85))
    assert (
        "INFO  allreduce's median step grew by 30.0 ms over the no-imbalance " in text
    )
    assert "(30.0 ms), 100% of the 30.0 ms injected delay (means over 4 seeds)" in text
    assert "INFO  solo's median step without its own delay 33.0 ms, 1.10x" in text
    assert "PASS  solo trains faster than allreduce" in text
    assert "PASS  solo reaches 85% sooner than allreduce: by 1.0 s [" in text
    assert "PASS  solo does not lose accuracy" in text
    assert "UNDECIDED  majority trains faster than allreduce" in text
    assert "FAIL  majority reaches 85% sooner" in text
    assert "FAIL  majority does not lose accuracy" in text
    # The tolerance is the seeds' own spread: 2 sd of allreduce's accuracy.
    assert "asked at most the seeds' spread, 0.0046 (2 sd" in text
    # No delay to compare with: no growth line; one seed: nothing decided.
    assert "grew" not in "\n".join(checks(rows, None, 0.85))
    one = aggregate(
        [_row(a, 0, 100.0 * (a == "solo") + 100.0) for a in ("allreduce", "solo")]
    )
    assert [ln.split()[0] for ln in checks(one, None, 0.85)] == ["UNDECIDED"] * 3
