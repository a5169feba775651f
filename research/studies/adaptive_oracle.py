"""The adaptive study's oracle: the best fixed method per phase, known in advance.

Computed offline from the fixed arms' own runs, per rank count:

* its schedule: for each phase, the fixed arm whose steps in that phase took
  the least time (mean over the seeds), so one schedule per rank count, as a
  researcher who knew the phases would write it;
* per seed, its run stitched from that seed's fixed arms: each phase's steps
  as the chosen arm ran them (their step times), and at each evaluation the
  test accuracy of the arm that ran the phase the evaluation ends, so its time
  to the target is read from that stitched curve as every arm's is
  (:func:`time_to`).

It pays nothing for a switch and assumes that each phase's arm, had it run
from the state the previous phase left, would have reached the accuracy it
reached from its own: what a schedule can win at best, not a run that was
made.
"""

from __future__ import annotations

import math
import statistics
from typing import Any


def time_to(evals: list[dict], target: float) -> float:
    """Training seconds until the test accuracy first reaches ``target``,
    interpolated linearly between that evaluation and the one before it (inf:
    never reached). Interpolating takes most of the evaluations' spacing out
    of the figure."""
    prev = None
    for e in evals:
        if e["test_acc"] >= target:
            if prev is None or e["test_acc"] <= prev["test_acc"]:
                return float(e["train_time"])
            f = (target - prev["test_acc"]) / (e["test_acc"] - prev["test_acc"])
            return float(
                prev["train_time"] + f * (e["train_time"] - prev["train_time"])
            )
        prev = e
    return math.inf


def schedule(phase_s: dict[str, list[list[float]]]) -> list[str]:
    """The fixed arm of least mean seconds in each phase.

    Args:
      phase_s: arm -> per seed, the seconds of each phase.
    """
    arms = list(phase_s)
    n = len(next(iter(phase_s.values()))[0])
    return [
        min(arms, key=lambda a: statistics.fmean(s[i] for s in phase_s[a]))
        for i in range(n)
    ]


def stitch(
    runs: dict[str, dict[str, Any]], plan: list[str], phases: list[dict], target: float
) -> dict[str, Any]:
    """One seed's oracle run from that seed's fixed arms.

    Args:
      runs: arm -> its run (``steps``: the step rows, ``evals``).
      plan: the arm of each phase (:func:`schedule`).
      phases: the phases (``start``, ``end``: 0-based steps ``[start, end)``).
      target: the test accuracy to reach.

    Returns:
      ``phase_s``, ``total_s``, ``to_target_s`` and ``final_acc``.
    """
    times: dict[int, float] = {}
    for arm, p in zip(plan, phases):
        for r in runs[arm]["steps"]:
            if p["start"] < r["step"] <= p["end"]:
                times[r["step"]] = r["step_time"]
    phase_s = [
        sum(t for s, t in times.items() if p["start"] < s <= p["end"]) for p in phases
    ]
    clock, t = {}, 0.0
    for s in sorted(times):
        t += times[s]
        clock[s] = t
    evals = []
    for arm, p in zip(plan, phases):
        for e in runs[arm]["evals"]:
            if p["start"] < e["step"] <= p["end"] and e["step"] in clock:
                evals.append({**e, "train_time": clock[e["step"]], "arm": arm})
    evals.sort(key=lambda e: e["step"])
    return {
        "phase_s": phase_s,
        "total_s": sum(phase_s),
        "to_target_s": time_to(evals, target),
        "final_acc": evals[-1]["test_acc"] if evals else None,
        "evals": evals,
    }
