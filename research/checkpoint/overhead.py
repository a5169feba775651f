"""The overhead estimator of the interleaved benchmark: pure arithmetic.

The benchmark itself is ``research/studies/checkpoint_bench.py``.

One training run is cut into *periods* of ``window`` steps (10: a checkpoint
every 10 steps). Each period belongs to one arm: the arm checkpoints at the
period's first step (and every ``interval`` steps after it), and ``settle``
steps after its last checkpoint every rank waits for all of the arm's work to
finish and meets the others (a sleeping barrier). Everything the checkpoint
costs is therefore inside the period's *charged* part, from its first step to
that wait, waits included; the rest of the period, the *clean* steps, runs
with no checkpoint work at all. ``none`` periods do the same without a
checkpoint: a placebo arm, measured exactly like the others. Its cost is what
the rule measures where there is nothing to measure (slightly negative here:
the clean steps right after the wait and barrier run a little slower), and
every arm's cost is taken relative to it, per charged step.

The cost of one period is its charged time minus as many reference steps,

    cost = T(charged steps, checkpoint calls, final wait) - n_charged * r,

where ``r`` is the *mean* duration of the clean steps nearest in time (within
about two periods on either side). Means, not medians, on both sides: the
wall-clock cost is a sum, and a checkpoint that stalls one allreduce for 40 ms
leaves every step's median unchanged. The reference is local because the
machine's load drifts over seconds to minutes; the charged part is short
because every extra step in it adds one step's noise and no signal.

An arm's overhead is its mean cost per period, less the placebo's, over the
reference time of a period (``window`` times the mean clean step). Confidence
intervals come from a bootstrap over rounds (every round holds one period of
each arm, in shuffled order), so correlations within a round (shared
reference steps, a burst of load) are resampled together, and the interval of
a *difference* between two arms comes from the same resampled rounds: a
saver is shown to cost less than another when that interval lies above zero.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Sequence
from typing import Any


def period_costs(
    before: dict[int, float],
    periods: Sequence[dict[str, Any]],
    *,
    nearest: int = 20,
) -> tuple[list[dict[str, Any]], float]:
    """Cost of every period, and the mean clean step over the run.

    Args:
      before: ``{step: time}`` when the training thread finished step ``step``
        and any wait due then, before that step's checkpoint call (one rank's
        clock; with synchronous training every rank sees the same steps).
      periods: dicts with ``start`` (the period's first checkpoint step),
        ``charged`` (steps up to and including the final wait) and ``window``.
      nearest: clean steps averaged into each period's reference.

    Returns:
      The periods, each with ``charged_s``, ``reference_step_s``, ``cost_s``
      added, and the mean clean step (seconds).
    """
    clean: dict[int, float] = {}
    for p in periods:
        end = p["start"] + p["window"]
        for k in range(p["start"] + p["charged"] + 1, end + 1):
            if k in before and k - 1 in before:
                clean[k] = before[k] - before[k - 1]
    if not clean:
        raise ValueError("no clean steps: settle must leave steps after the wait")
    steps = sorted(clean)
    out = []
    for p in periods:
        a, d = p["start"], p["start"] + p["charged"]
        mid = (a + d) / 2
        near = sorted(steps, key=lambda k: abs(k - mid))[:nearest]
        ref = statistics.fmean(clean[k] for k in near)
        charged = before[d] - before[a]
        out.append(
            {
                **p,
                "charged_s": charged,
                "reference_step_s": ref,
                "cost_s": charged - p["charged"] * ref,
            }
        )
    return out, statistics.fmean(clean.values())


def _mean(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return statistics.fmean(xs) if xs else None


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    i = min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))
    return xs[i]


def _widening(n: int, level: float) -> float:
    """Small-sample factor for a percentile interval over ``n`` resampled units.

    The bootstrap variance of a mean is (n - 1)/n of the unbiased one, and the
    normal quantile stands in for Student's t with n - 1 degrees of freedom
    (Cornish-Fisher expansion). On 300 synthetic runs of 30 rounds
    (``tests/test_checkpoint_overhead.py``'s generator) the plain percentile
    interval covered 86-89% at a nominal 90%, the widened one 87-91%.
    """
    if n < 3:
        return 1.0
    z = statistics.NormalDist().inv_cdf(1 - (1 - level) / 2)
    v = n - 1
    t = z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
    return (n / (n - 1)) ** 0.5 * t / z


def _interval(xs: list[float], point: float, level: float, widen: float) -> list:
    lo = _percentile(xs, (1 - level) / 2)
    hi = _percentile(xs, 1 - (1 - level) / 2)
    return [point - widen * (point - lo), point + widen * (hi - point)]


def summarize(
    periods: Sequence[dict[str, Any]],
    norm: float,
    *,
    placebo: str | None = "none",
    versus: str | None = None,
    level: float = 0.90,
    draws: int = 2000,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """Per arm: mean cost per period, its overhead and a bootstrap interval.

    Args:
      periods: output of :func:`period_costs` (``arm``, ``round``, ``charged``,
        ``cost_s``).
      norm: reference time of one period (``window`` x mean clean step).
      placebo: the arm without checkpoints. Its mean cost per charged step is
        what the rule itself measures where there is nothing to measure (it
        was -0.8% and -2.0% of a period in two runs: the clean steps that
        follow the wait and barrier run a little slower than the charged ones);
        every arm's overhead is corrected by it (``overhead``; uncorrected:
        ``raw_overhead``), in every bootstrap replicate too.
      versus: an arm whose difference from every other arm is also estimated
        (``diff_ci``: interval of other minus ``versus``, as overhead).
      level: two-sided level of the intervals (percentile bootstrap, widened
        for the number of rounds: :func:`_widening`).
      draws: bootstrap replicates (resampling whole rounds).
      seed: resampling seed.
    """
    arms = sorted({p["arm"] for p in periods})
    rounds = sorted({p["round"] for p in periods})
    charged = {p["arm"]: p["charged"] for p in periods}
    by: dict[tuple[int, str], list[float]] = {}
    for p in periods:
        by.setdefault((p["round"], p["arm"]), []).append(p["cost_s"])

    def overheads(pick: Sequence[int]) -> dict[str, float | None]:
        means = {a: _mean(c for r in pick for c in by.get((r, a), ())) for a in arms}
        bias = 0.0
        if placebo in means and means[placebo] is not None:
            bias = means[placebo] / charged[placebo]
        return {
            a: None if m is None else (m - bias * charged[a]) / norm
            for a, m in means.items()
        }

    point = overheads(rounds)
    out: dict[str, dict[str, Any]] = {}
    for a in arms:
        costs = [p["cost_s"] for p in periods if p["arm"] == a]
        out[a] = {
            "periods": len(costs),
            "cost_s": point[a] * norm,
            "raw_cost_s": statistics.fmean(costs),
            "median_cost_s": statistics.median(costs),
            "overhead": point[a],
            "raw_overhead": statistics.fmean(costs) / norm,
        }
    rng = random.Random(seed)
    boot: dict[str, list[float]] = {a: [] for a in arms}
    diff: dict[str, list[float]] = {a: [] for a in arms if a != versus}
    raw: list[float] = []  # the placebo's own, uncorrected
    for _ in range(draws):
        pick = rng.choices(rounds, k=len(rounds))
        ov = overheads(pick)
        for a, v in ov.items():
            if v is not None:
                boot[a].append(v)
        if placebo in arms:
            m = _mean(c for r in pick for c in by.get((r, placebo), ()))
            if m is not None:
                raw.append(m / norm)
        if versus is not None and ov.get(versus) is not None:
            for a in diff:
                if ov[a] is not None:
                    diff[a].append(ov[a] - ov[versus])
    w = _widening(len(rounds), level)
    for a in arms:
        if len(boot[a]) > 1:
            out[a]["ci"] = _interval(boot[a], point[a], level, w)
        if a in diff and len(diff[a]) > 1 and point.get(versus) is not None:
            out[a]["diff_ci"] = _interval(diff[a], point[a] - point[versus], level, w)
    if placebo in out and len(raw) > 1:
        out[placebo]["raw_ci"] = _interval(raw, out[placebo]["raw_overhead"], level, w)
    return out


def profile(
    before: dict[int, float], periods: Sequence[dict[str, Any]]
) -> dict[str, list[float | None]]:
    """Mean excess duration (seconds) of each step of a period, per arm.

    Position 0 is the checkpoint call plus the first step after it; the excess
    is against the period's own reference step. Shows where a cost lands (and
    that clean steps carry none).
    """
    acc: dict[str, list[list[float]]] = {}
    for p in periods:
        rows = acc.setdefault(p["arm"], [[] for _ in range(p["window"])])
        for j in range(p["window"]):
            k = p["start"] + j
            if k in before and k + 1 in before:
                rows[j].append(before[k + 1] - before[k] - p["reference_step_s"])
    return {a: [_mean(r) for r in rows] for a, rows in acc.items()}
