"""The adaptive study's reading of run folders (no MPI): phases, tables, checks.

Run folders are written here the way the Trainer writes them (``metrics.jsonl``
step and switch rows, ``summary.json`` with its evaluations), with made-up
times: ``host`` slow on the 1 Gb/s steps, ``sparse`` slow nowhere but less
accurate, ``adaptive`` like host, then like sparse, then like host.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from experiments.adaptive import parse
from research.studies.adaptive import analyze, format_table, phases
from research.studies.adaptive_link import parse_schedule

ARGS = [
    "--steps", "30", "--link-schedule", "0:10gbit,10:1gbit,20:10gbit",
    "--straggler", "random:k=1:seconds=0.1:start=24:end=28", "--seeds", "0", "1",
    "--arms", "adaptive", "host", "sparse", "--target-acc", "0.5",
]  # fmt: skip


def _step_time(arm: str, step: int) -> float:
    slow = 10 <= step < 20
    if arm == "host":
        return 0.3 if slow else 0.1
    if arm == "sparse":
        return 0.1
    return 0.3 if step in (10, 11) else 0.1  # adaptive: 2 slow steps, then sparse


def _write_run(folder: Path, arm: str, seed: int) -> None:
    folder.mkdir(parents=True)
    rows, t = [], 0.0
    for i in range(30):
        dt = _step_time(arm, i) + 0.001 * seed
        t += dt
        method = (
            arm if arm != "adaptive" else ("sparse:0.01" if 12 <= i < 20 else "host")
        )
        rows.append(
            {"step": i + 1, "step_time": dt, "train_time": t, "comm_method": method}
        )
    rows.append({"kind": "switch", "step": 12, "from": "host", "to": "sparse:0.01"})
    acc = {"host": 0.9, "sparse": 0.8, "adaptive": 0.9}[arm] - 0.01 * seed
    evals = [
        {"step": s, "train_time": sum(r["step_time"] for r in rows[:s]),
         "test_acc": acc * s / 30}
        for s in (10, 20, 30)
    ]  # fmt: skip
    with (folder / "metrics.jsonl").open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    summary = {"final_test_acc": evals[-1]["test_acc"], "evals": evals}
    (folder / "summary.json").write_text(json.dumps(summary))


def test_phases_follow_the_schedule_and_the_straggler():
    cfg = parse(ARGS)
    got = [(p["start"], p["end"], p["rate"], p["straggler"]) for p in phases(cfg)]
    assert got == [
        (0, 10, "10gbit", False), (10, 20, "1gbit", False),
        (20, 24, "10gbit", False), (24, 28, "10gbit", True),
        (28, 30, "10gbit", False),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="start at 0"):
        parse_schedule("5:1gbit")


def test_tables_and_checks_from_run_folders(tmp_path):
    cfg = parse(ARGS)
    for arm in ("adaptive", "host", "sparse"):
        for seed in (0, 1):
            _write_run(tmp_path / "np2" / f"{arm}-s{seed}", arm, seed)
    data = analyze(tmp_path, cfg)
    host, ad = data["np"][2]["host"], data["np"][2]["adaptive"]
    assert host[0]["phase_s"][1] == pytest.approx(3.0)
    assert ad[0]["methods"][1] == {"host": 2, "sparse:0.01": 8}
    assert all(math.isfinite(r["to_target_s"]) for r in ad)
    text = format_table(data)
    assert (
        "| adaptive |" in text
        and "steps 10-20 (1 Gb/s): sparse:0.01 16, host 4" in text
    )
    checks = data["checks"]
    # 1 Gb/s: adaptive pays two slow steps over sparse, beyond the tiny spread.
    assert any(c.startswith("FAIL  2 ranks, steps 10-20") for c in checks), checks
    assert any(c.startswith("PASS  2 ranks, steps 0-10") for c in checks), checks
    # Final accuracy: adaptive's equals host's.
    assert any(c.startswith("PASS  2 ranks: final test accuracy") for c in checks)
    # Sooner than host to 0.5; not sooner than sparse (equal steps after 12).
    first = [c for c in checks if "reaches test accuracy" in c][0]
    assert first.startswith("FAIL") and "not sooner than sparse" in first, first
    from research.studies.adaptive_plots import plot

    assert plot(tmp_path, data, {2: 64}).stat().st_size > 10_000
