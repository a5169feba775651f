"""The adaptive study's reading of run folders (no MPI): phases, the oracle,
tables, checks.

Run folders are written here the way the Trainer writes them (``metrics.jsonl``
step and switch rows, ``summary.json`` with its evaluations), with made-up
times: ``host`` slow on the 1 Gb/s steps and under the straggler, ``sparse``
slow under the straggler and a little everywhere else, ``solo`` slow on the
1 Gb/s steps, ``adaptive`` like the best of them with two slow steps after
each change.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from experiments.adaptive import parse
from research.studies.adaptive import analyze, phases
from research.studies.adaptive_link import parse_schedule
from research.studies.adaptive_oracle import schedule, stitch, time_to
from research.studies.adaptive_report import checks, format_table

ARGS = [
    "--steps", "40", "--link-schedule", "0:10gbit,10:1gbit,20:10gbit",
    "--straggler", "random:k=1:seconds=0.3:start=20:end=30", "--seeds", "0", "1",
    "--arms", "adaptive", "host", "sparse", "solo", "--target-acc", "0.5",
]  # fmt: skip
COST = {  # seconds per step in each phase: 10 Gb/s, 1 Gb/s, straggler, 10 Gb/s
    "host": (0.05, 0.2, 0.35, 0.05),
    "sparse": (0.07, 0.07, 0.37, 0.07),
    "solo": (0.06, 0.21, 0.15, 0.06),
}
ADAPTIVE = ("host", "sparse:0.05", "solo", "host")
STARTUP = 0.1  # adaptive's start-up, seconds


def _step_time(arm: str, step: int) -> tuple[float, str]:
    phase = step // 10
    if arm != "adaptive":
        return COST[arm][phase], arm
    method = ADAPTIVE[phase]
    fixed = method.split(":")[0]
    if phase and step % 10 < 2:  # two steps to see a change, on the old method
        return COST[ADAPTIVE[phase - 1].split(":")[0]][phase], ADAPTIVE[phase - 1]
    return COST[fixed][phase], method


def _write_run(folder: Path, arm: str, seed: int) -> None:
    folder.mkdir(parents=True)
    rows, t = [], 0.0
    for i in range(40):
        dt, method = _step_time(arm, i)
        dt += 0.001 * seed
        t += dt
        rows.append(
            {"step": i + 1, "step_time": dt, "train_time": t, "comm_method": method}
        )
    if arm == "adaptive":
        for s, to in ((12, "sparse:0.05"), (22, "solo"), (32, "host")):
            rows.append({"kind": "switch", "step": s, "from": "x", "to": to,
                         "reason": "model"})  # fmt: skip
        rows.append({"kind": "change", "step": 11, "what": "link"})
    acc = {"host": 0.9, "sparse": 0.88, "solo": 0.89, "adaptive": 0.9}[arm]
    evals = [
        {"step": s, "train_time": sum(r["step_time"] for r in rows[:s]),
         "test_acc": (acc - 0.01 * seed) * s / 40}
        for s in (10, 20, 30, 40)
    ]  # fmt: skip
    with (folder / "metrics.jsonl").open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    # Every run's seconds before its first step; adaptive's hold its start-up.
    summary = {"final_test_acc": evals[-1]["test_acc"], "evals": evals,
               "start_s": 0.05 + (STARTUP if arm == "adaptive" else 0.0)}  # fmt: skip
    if arm == "adaptive":
        summary["adaptive"] = {"probes": 1, "probe_s": 0.2, "mispredicted": 0,
                               "startup": {"seconds": STARTUP}}  # fmt: skip
    (folder / "summary.json").write_text(json.dumps(summary))


def test_phases_follow_the_schedule_and_the_straggler():
    cfg = parse(ARGS)
    got = [(p["start"], p["end"], p["rate"], p["straggler"]) for p in phases(cfg)]
    assert got == [
        (0, 10, "10gbit", False), (10, 20, "1gbit", False),
        (20, 30, "10gbit", True), (30, 40, "10gbit", False),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="start at 0"):
        parse_schedule("5:1gbit")


def test_time_to_target_interpolates_between_evaluations():
    evals = [{"train_time": 1.0, "test_acc": 0.4}, {"train_time": 3.0, "test_acc": 0.6}]
    assert time_to(evals, 0.5) == pytest.approx(2.0)
    assert time_to(evals, 0.3) == 1.0  # the first evaluation already
    assert time_to(evals, 0.7) == math.inf


def test_the_oracle_takes_the_fastest_arm_per_phase():
    plan = schedule({"host": [[1, 5, 9]], "sparse": [[2, 2, 9]], "solo": [[2, 5, 3]]})
    assert plan == ["host", "sparse", "solo"]
    runs = {}
    for arm, per in (("host", 0.1), ("sparse", 0.2)):
        steps = [{"step": s, "step_time": per} for s in range(1, 5)]
        evals = [{"step": s, "train_time": per * s, "test_acc": 0.2 * s}
                 for s in (2, 4)]  # fmt: skip
        runs[arm] = {"steps": steps, "evals": evals}
    ph = [{"start": 0, "end": 2}, {"start": 2, "end": 4}]
    out = stitch(runs, ["host", "sparse"], ph, target=0.7)
    assert out["phase_s"] == pytest.approx([0.2, 0.4])
    # Its clock: 0.2 s at step 2 (acc 0.4), 0.6 s at step 4 (acc 0.8).
    assert out["to_target_s"] == pytest.approx(0.2 + 0.4 * 0.75)


def test_tables_and_checks_from_run_folders(tmp_path):
    cfg = parse(ARGS)
    for arm in ("adaptive", "host", "sparse", "solo"):
        for seed in (0, 1):
            _write_run(tmp_path / "np2" / f"{arm}-s{seed}", arm, seed)
    data = analyze(tmp_path, cfg)
    assert data["scenario"] == "mixed"
    ad = data["np"][2]["adaptive"]
    assert ad[0]["methods"][1] == {"sparse:0.05": 8, "host": 2}
    assert [s["to"] for s in ad[0]["switch_steps"]] == ["sparse:0.05", "solo", "host"]
    assert data["oracle"][2]["schedule"] == ["host", "sparse", "solo", "host"]
    # Every arm's time to the target counts its start-up.
    assert ad[0]["start_s"] == pytest.approx(0.05 + STARTUP)
    assert ad[0]["to_target_s"] == pytest.approx(
        ad[0]["start_s"] + time_to(json.loads(
            (tmp_path / "np2" / "adaptive-s0" / "summary.json").read_text())["evals"],
            0.5)
    )  # fmt: skip
    host = data["np"][2]["host"][0]
    assert host["start_s"] == pytest.approx(0.05)
    data["checks"] = lines = checks(data)
    text = format_table(data)
    assert (
        "The model was tuned on seeds 0, 1, 2; these runs judge it on seeds 0, 1"
        in (text)
    )
    assert "| oracle: host, sparse, solo, host |" in text
    assert "steps 10-20 (1 Gb/s): sparse:0.05 16, host 4" in text
    assert "- changes the model saw (seed 0): link at step 11" in text

    def line(part: str) -> str:
        (found,) = [x for x in lines if part in x]
        return found

    assert line("the oracle (host, sparse, solo, host)").startswith("PASS")
    assert line("sooner than").startswith("PASS")
    # Two slow steps after each of three changes, and its 0.1 s start-up: 24%
    # over the oracle here (18% without the start-up, as this test once read).
    assert line("the oracle's time").startswith("FAIL")
    assert "adaptive takes 1.24x [1.23, 1.25] (2 seeds) the oracle's time" in (
        line("oracle's")
    )
    assert line("final test accuracy").startswith("PASS")
    assert line("probes per run 1, 1").startswith("PASS")
    # The switch steps are the new methods' ordinary steps (made up alike).
    assert line("a switch's step over").startswith("PASS")
    assert "median 1.00x [1.00, 1.00] (6 switches)" in line("a switch's step over")
    assert line("the switches themselves").startswith("PASS")
    # Judged on seeds the model was tuned on (as these made-up runs are): said.
    assert line("judged on seeds 0, 1").startswith("FAIL")
    # ... and the steps the new method takes after it in the same run.
    assert line("next steps").endswith(
        "host 1.00x (2, worst 1.00x); solo 1.00x (2, worst 1.00x); "
        "sparse:0.05 1.00x (2, worst 1.00x)"
    )
    # ... and its fixed arm's step at the same step and seed.
    assert line("at the same step and seed").endswith(
        "host 1.00x (2, worst 1.00x); solo 1.00x (2, worst 1.00x); "
        "sparse:0.05 1.00x (2, worst 1.00x)"
    )
    # Each phase adaptive starts on the old method for two steps: beyond the
    # made-up spread (0.001 s a step between the seeds).
    assert line("steps 10-20").startswith("FAIL")
    from research.studies.adaptive_plots import plot

    assert plot(tmp_path, data, {2: 64}).stat().st_size > 10_000


def test_a_slow_switch_step_shows_beside_its_fixed_arm(tmp_path):
    """A switch whose step took twice its fixed arm's at that step and seed."""
    cfg = parse(ARGS)
    for arm in ("adaptive", "host", "sparse", "solo"):
        for seed in (0, 1):
            _write_run(tmp_path / "np2" / f"{arm}-s{seed}", arm, seed)
    path = tmp_path / "np2" / "adaptive-s0" / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    for r in rows:
        if r.get("step") == 23 and "kind" not in r:  # the first solo step
            r["step_time"] *= 2
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "np2" / "host-s1" / "metrics.jsonl").write_text("")  # no step rows
    data = analyze(tmp_path, cfg)
    switches = data["np"][2]["adaptive"][0]["switch_steps"]
    assert [s["fixed_s"] for s in switches] == pytest.approx([0.07, 0.15, 0.05])
    assert data["np"][2]["adaptive"][1]["switch_steps"][2]["fixed_s"] is None
    (found,) = [x for x in checks(data) if "at the same step and seed" in x]
    assert found.endswith(
        "host 1.00x (1, worst 1.00x); solo 1.50x (2, worst 2.00x); "
        "sparse:0.05 1.00x (2, worst 1.00x)"
    )
