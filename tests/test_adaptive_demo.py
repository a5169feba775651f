"""End to end: ``python -m experiments.adaptive`` with tiny settings.

On this machine alone (``--no-link``: no schedule), and on a local cluster of
two nodes whose link the command changes at fixed steps (skipped with one line
where network namespaces cannot be made): the table, the checks, the figure,
each rate asked for and set, and the adaptive arm's switches recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import XLA_TEST_FLAGS

pytestmark = pytest.mark.launches  # MPI jobs: not in make test-fast

ROOT = Path(__file__).resolve().parent.parent
TINY = [
    "--model", "candle_p1b2_tiny", "--model-opt", "features=256",
    "--data-opt", "features=256", "--data-opt", "n_train=512",
    "--data-opt", "n_test=64", "--batch-size", "8", "--steps", "12",
    "--eval-every", "4", "--nps", "2", "--seeds", "0", "--target-acc", "0.05",
    "--straggler", "random:k=1:seconds=0.02:start=6:end=10",
    "--adaptive-opt", "plan=host@0,sparse:0.05@4,solo@8",
    "--no-progress",
]  # fmt: skip


def _run(args: list[str], tmp_path: Path, extra_env: dict | None = None):
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    env.update(XLA_FLAGS=XLA_TEST_FLAGS, NPROC="1")
    env.update(extra_env or {})
    for var in ("PMI_RANK", "PMI_SIZE", "RESEARCH_UNDER_MPI"):
        env.pop(var, None)  # the module must launch its own jobs
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.adaptive", *TINY, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


def _check_report(run: Path, arms: set[str]) -> dict:
    results = json.loads((run / "results.json").read_text())
    assert set(results["np"]["2"]) == arms
    for name in ("table.md", "adaptive.png", "run.json"):
        assert (run / name).exists(), name
    table = (run / "table.md").read_text()
    assert "### 2 ranks" in table and "### Checks" in table
    assert "What adaptive ran" in table and "| oracle: " in table
    assert any(line.startswith(("PASS", "FAIL", "UNDECIDED")) for line in
               table.splitlines()), table  # fmt: skip
    rows = [json.loads(x) for x in (run / "np2/adaptive-s0/metrics.jsonl").open()]
    assert any(r.get("kind") == "switch" for r in rows)
    return results


def test_tiny_demo_on_this_machine(tmp_path):
    run = tmp_path / "run"
    proc = _run(["--no-link", "--arms", "adaptive", "host", "--run-dir", str(run)],
                tmp_path)  # fmt: skip
    _check_report(run, {"adaptive", "host"})
    # A switch's line on rank 0 (the plan's, on this tiny run).
    assert "adaptive: step 4: host -> sparse:0.05 (plan)" in proc.stdout
    # --report-only: the table again from the folders, for the arms asked for
    (run / "table.md").unlink()
    proc = _run(["--no-link", "--arms", "host", "--run-dir", str(run),
                 "--report-only"], tmp_path)  # fmt: skip
    assert "| host |" in proc.stdout and "| adaptive |" not in proc.stdout
    assert (run / "table.md").read_text() in proc.stdout
    # The page from the kept files alone (every arm's start-up in its time to
    # the target), and --check on it.
    from scripts.results import render
    from scripts.results.check import check

    page = render([run], tmp_path / "repo").read_text()
    assert "| arm | start-up |" in page and "### Checks" in page
    data = tmp_path / "repo/docs/results/adaptive/run1"
    assert (data / "np2/host-s0/summary.json").is_file()
    assert not list(data.rglob("metrics.jsonl"))
    assert check(tmp_path / "repo")[0] == 0


def test_tiny_demo_changes_the_link_on_two_nodes(tmp_path):
    from research import localnet

    try:
        localnet.check_can_run()
    except localnet.LocalnetError as e:
        pytest.skip(f"no local cluster here: {e}")
    run = tmp_path / "run"
    args = ["--cluster", "adt", "--arms", "adaptive", "solo", "--run-dir", str(run)]
    args += ["--link-schedule", "0:10gbit,4:1gbit,8:10gbit"]
    try:
        _run(args, tmp_path)
    finally:
        leftovers = localnet.down("adt")  # nothing if the command removed it
    assert leftovers == [], leftovers
    results = _check_report(run, {"adaptive", "solo"})
    assert [p["rate"] for p in results["phases"]][:3] == ["10gbit", "1gbit", "1gbit"]
    asked = json.loads((run / "link-np2.json").read_text())
    # Each run: the first rate before step 0, then the two changes.
    assert [a["rate"] for a in asked] == ["10gbit", "1gbit", "10gbit"] * 2
    summary = json.loads((run / "np2/adaptive-s0/summary.json").read_text())
    assert [c["step"] for c in summary["link_changes"]] == [0, 4, 8]
    assert summary["nodes"]["nodes"] == 2
    assert summary["adaptive"]["startup"]["seconds"] > 0
