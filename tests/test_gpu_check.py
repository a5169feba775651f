"""The GPU check rehearsed on the CPU: what a lent GPU machine will run.

A GPU is lent for minutes at a time, so ``scripts/gpu_check.py`` must work the
first time it runs there. Its ``--quick`` mode runs the same stages on the CPU
with a tiny model and two strategies: the training runs, the stop on SIGTERM,
the report (``table.md``, ``checks.json``) and the results page made from it.
"""

from __future__ import annotations

import json

import pytest

from tests.harness import python


@pytest.mark.launches
def test_the_quick_gpu_check_runs_and_renders_its_page(tmp_path):
    root = tmp_path / "gpu"
    proc = python(
        [
            "-m",
            "scripts.gpu_check",
            "--quick",
            "--stages",
            "strategies,stop,staging,stall",
        ]
        + ["--jobs", "2", "--out", str(root)],
        timeout=420,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    checks = json.loads((root / "checks.json").read_text())
    assert [c["met"] for c in checks] == [True, True, True], checks
    table = (root / "table.md").read_text()
    assert "| fused | 1 |" in table and "| solo | 2 |" in table
    assert "| fused | 143 |" in table  # SIGTERM: exit 143
    # A stopped rank: the watchdog ends the job (exit 124), naming the collective.
    assert "## A stalled rank" in table and "| fused-mpi | cpu | 124 |" in table
    # What staging through host costs, each way (here host and device are one).
    staging = json.loads((root / "staging.json").read_text())
    assert staging["platform"] == "cpu" and len(staging["sizes"]) == 1
    ways = staging["sizes"][0]["variants"]
    assert ways["pjrt-round-trip"]["ratio"] == 1.0
    assert all(v["median_ms"] > 0 for v in ways.values()), ways
    assert "## Staging through host memory" in table and "| ring-staged-self |" in table
    results = json.loads((root / "results.json").read_text())
    assert {r["platforms"][0] for r in results["strategies"]} == {"cpu"}
    repo = tmp_path / "repo"
    repo.mkdir()
    proc = python(["-m", "scripts.results", str(root), "--root", str(repo)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (repo / "docs/results/gpu.md").read_text()
    assert page.startswith("# GPUs") and "python -m scripts.gpu_check" in page
    # The page is the run's own table, rendered again from the kept files.
    assert all(line in page for line in table.splitlines() if line and line[0] == "|")
    proc = python(["-m", "scripts.results", "--check", "--root", str(repo)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_step_benchmark_times_the_projects_step():
    from scripts import bench_gpu

    out = bench_gpu.main(
        ["--framework", "jax", "--model", "cnn_small", "--image-size", "32"]
        + ["--batch", "4", "--steps", "2", "--warmup", "1"]
    )
    assert out["platform"] == "cpu" and out["ms"] > 0
    assert out["images_per_s"] == pytest.approx(4 / (out["ms"] / 1e3))


def test_strategies_can_be_named_to_run_one_again(tmp_path, capsys):
    """A lent machine's minutes are few: ``--strategies adaptive`` reruns only
    what failed (adaptive at 1 rank, 2026-11-28)."""
    from scripts.gpu_check import Check, _strategy_runs, parse_args

    args = parse_args(["--strategies", "adaptive", "--stages", "strategies"])
    assert args.strategies == ["adaptive"]
    c = Check(tmp_path, args)
    c.results["machine"] = {"gpus": ["NVIDIA H200"]}
    assert _strategy_runs(c) == [
        ("gpu", "adaptive", 1),
        ("cpu", "adaptive", 1),
        ("gpu", "adaptive", 2),
        ("cpu", "adaptive", 2),
    ]
    with pytest.raises(SystemExit) as e:
        parse_args(["--strategies", "adaptive,nope"])
    assert e.value.code == 2 and "unknown nope" in capsys.readouterr().err
