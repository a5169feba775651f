"""End to end: ``python -m experiments.sparcml`` with tiny settings on 2 ranks."""

from __future__ import annotations

import json

import pytest

from tests.harness import python, run_env

pytestmark = pytest.mark.launches  # MPI jobs: not in make test-fast


def test_tiny_run_prints_both_tables_and_checks(tmp_path):
    # A calibration of this run's own, not the user's cached one.
    env = run_env(RESEARCH_SPARSE_COST=str(tmp_path / "cost.json"))
    args = ["--np", "2", "--dim", "50000", "--densities", "0.01", "0.5"]
    args += ["--reps", "1", "--steps", "4", "--eval-every", "2", "--no-progress"]
    args += ["--arms", "dense", "topk_ef", "--seeds", "0", "1"]
    args += ["--run-dir", str(tmp_path / "run")]
    proc = python(["-m", "experiments.sparcml", *args], env=env, timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = proc.stdout
    assert "Micro-benchmark, dim 50000, 1 timed calls per point" in out
    assert "training: cnn_small, 2 ranks" in out
    assert "PASS  measured bytes / model within 1.05x" in out
    assert "top-k 1% + error feedback within 0.5 points" in out
    assert "| arm | final acc (2 seeds: mean +- sd) |" in out and "2 seeds" in out
    # One timed call per point: no interval, so no benchmark check is decided.
    bench = [ln for ln in out.splitlines() if "auto / best fixed" in ln]
    assert bench and all(ln.startswith("UNDECIDED") for ln in bench)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    # 2 densities x (4 algorithms + auto) at P = 2.
    assert len(results["bench"]) == 10
    arms = {r["arm"]: r for r in results["train"]}
    assert set(arms) == {"dense", "topk_ef"}
    assert all(
        a["seeds"] == [0, 1] and len(a["final_accs"]) == 2 for a in arms.values()
    )
    assert (tmp_path / "run" / "topk_ef-s1" / "summary.json").exists()
    # Top-k 1% sends far fewer bytes per step than the dense gradient.
    assert arms["topk_ef"]["bytes_per_step"] < 0.2 * arms["dense"]["bytes_per_step"]
    for name in ("time_vs_density.png", "accuracy.png", "table.md"):
        assert (tmp_path / "run" / name).exists()
    # auto's own calls on the emulated link, with what it chose for that link.
    auto = [r for r in results["bench"] if r["algorithm"] == "auto"]
    assert all(len(r["emulated_reps"]) == 1 and r["chosen_emulated"] for r in auto)
    # The page from the kept files alone, and --check on it.
    from scripts.results import render
    from scripts.results.check import check

    page = render([tmp_path / "run"], tmp_path / "repo").read_text()
    assert "| dense |" in page and "auto / best fixed" in page
    assert check(tmp_path / "repo")[0] == 0


def test_tiny_communication_bound_comparison(tmp_path):
    """``--comm-bound`` alone, tiny models: the table, the check, the rows.

    The sparse cost model is its documented defaults here, not a calibration
    of this run's own (the test above calibrates one): on the real link top-k's
    ``auto`` chooses with that model, and a calibration on the loaded machine
    twice measured a latency at which the dense algorithm wins, so top-k sent
    as many bytes as dense (181 us under the suite's heavy yield; again with
    MPICH's default yield in a fresh-clone run, 76,944 bytes against 76,904)."""
    env = run_env(RESEARCH_SPARSE_COST="defaults")
    args = ["--np", "2", "--skip-bench", "--arms", "--comm-bound"]
    args += ["--cb-models", "candle_p1b2_tiny", "--cb-links", "10gbps", "real"]
    args += ["--cb-steps", "3", "--cb-eval-every", "3", "--cb-target", "0.05"]
    args += ["--no-progress", "--no-plots", "--run-dir", str(tmp_path / "run")]
    proc = python(["-m", "experiments.sparcml", *args], env=env, timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "communication-bound training, 2 ranks" in proc.stdout
    assert "candle_p1b2_tiny, 10gbps: top-k + EF faster to 0.05" in proc.stdout
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    rows = results["comm_bound"]
    assert all(r["seed"] == 0 for r in rows)
    assert {(r["link"], r["arm"]) for r in rows} == {
        (link, arm)
        for link in ("10gbps", "real")
        for arm in ("dense", "topk_ef", "topk_4bit")
    }
    by = {(r["link"], r["arm"]): r for r in rows}
    assert (
        by["real", "topk_ef"]["bytes_per_step"] < by["real", "dense"]["bytes_per_step"]
    )
