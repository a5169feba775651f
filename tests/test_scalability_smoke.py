"""End to end: ``python -m experiments.scalability``, tiny settings, 1 and 2 ranks."""

from __future__ import annotations

import json

import pytest

from tests.harness import python

pytestmark = pytest.mark.launches  # MPI jobs: not in make test-fast


def test_tiny_sweeps_write_rows_table_and_figures(tmp_path):
    run = tmp_path / "run"
    args = ["--models", "nt3", "--nt3-features", "512", "--ranks", "1", "2"]
    args += ["--sweeps", "ranks", "straggler", "checkpoint"]
    args += ["--strategies", "overlap", "--delays", "0.05"]
    args += ["--steps", "4", "--warmup", "1", "--batch-size", "4"]
    args += ["--checkpoint-every", "2", "--long-steps", "4", "--run-dir", str(run)]
    proc = python(["-m", "experiments.scalability", *args])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = proc.stdout
    assert "[1/2] 1 rank(s) x 1 thread(s)" in out
    for title in ("weak scaling", "strong scaling", "straggler", "DeepFreeze"):
        assert title in out
    rows = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    by = {r["id"]: r for r in rows}
    # host at 1 rank (the baseline); overlap at 2 ranks: weak (batch 4), strong
    # (2), on the emulated link without and with the delay, with checkpoints.
    assert set(by) == {
        "nt3-host-np1-t1-b4",
        "nt3-overlap-np2-t1-b4",
        "nt3-overlap-np2-t1-b2",
        "nt3-overlap-np2-t1-b4-L1gbps",
        "nt3-overlap-np2-t1-b4-L1gbps-d50ms",
        "nt3-overlap-np2-t1-b4-ck2",
    }
    assert all(r["step_s"] > 0 for r in rows)
    # Weak-scaling efficiency and the absorbed delay come out of the table.
    assert "absorbed" in out and by["nt3-overlap-np2-t1-b4"]["late_median_s"] >= 0
    # The delay is on the last rank's timeline, inside the measured steps.
    trace = (run / "nt3-overlap-np2-t1-b4-L1gbps-d50ms" / "trace.json").read_text()
    events = json.loads(trace)
    events = events["traceEvents"] if isinstance(events, dict) else events
    held = {(e["pid"], e["args"]["step"]) for e in events if e.get("cat") == "delay"}
    assert held == {(1, 1), (1, 2), (1, 3)}
    ck = by["nt3-overlap-np2-t1-b4-ck2"]
    # Saves after steps 2 and 4 (the last); their background work is measured.
    assert ck["ckpt_saves"] == 2 and ck["ckpt_bg_s"] > 0
    assert 0 <= ck["ckpt_bg_in_gaps"] <= 1
    assert by["nt3-overlap-np2-t1-b4"]["gap_median_s"] > 0
    assert (run / "nt3-overlap-np2-t1-b4" / "analysis.json").exists()
    # The measured steps and the timeline's shares every check reads.
    assert len(by["nt3-overlap-np2-t1-b4"]["samples"]["step_s"]) == 3
    assert all(0 <= f <= 1 for f in by["nt3-overlap-np2-t1-b4"]["free_shares"])
    assert ck["ckpt_bg_parts"] and all(0 <= a <= b for a, b in ck["ckpt_bg_parts"])
    assert "a 50 ms straggler, absorbed" in out
    # The page from the kept rows alone, and --check on it.
    from scripts.results import render
    from scripts.results.check import check

    page = render([run], tmp_path / "repo").read_text()
    assert "#### ranks, weak scaling" in page and "DeepFreeze's background" in page
    assert check(tmp_path / "repo")[0] == 0
    for name in (
        "table.md",
        "scaling.png",
        "straggler.png",
        "timeline.png",
        "gaps.png",
    ):
        assert (run / name).stat().st_size > 1000, name
    assert not (run / ck["id"] / "checkpoints").exists()
