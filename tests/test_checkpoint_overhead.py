"""The benchmark's overhead estimator (``research/checkpoint/overhead.py``) on
synthetic step times with known costs: noise, a drifting load, a bias of the
period structure that only the placebo reveals."""

from __future__ import annotations

import math
import random

import pytest

from research.checkpoint.overhead import period_costs, profile, summarize

WINDOW, SETTLE, STEP = 10, 5, 0.120


def _run(
    costs: dict[str, float],
    rounds: int,
    *,
    bias: float = 0.0,
    noise: float = 0.2,
    seed: int = 1,
):
    """``before`` times and periods of a synthetic run.

    ``costs[arm]`` is added to the first step after the arm's checkpoint;
    ``bias`` to every charged step of every arm (placebo included); steps have
    ``noise`` (relative) and the load drifts by +-15% over 400 steps.
    """
    rng = random.Random(seed)
    arms = list(costs)
    before, periods, t, k = {0: 0.0}, [], 0.0, 0
    for r in range(rounds):
        order = arms[:]
        rng.shuffle(order)
        for a in order:
            periods.append(
                {"arm": a, "round": r, "start": k, "window": WINDOW, "charged": SETTLE}
            )
            for j in range(WINDOW):
                drift = 1 + 0.15 * math.sin(2 * math.pi * k / 400)
                dt = STEP * drift * (1 + noise * rng.gauss(0, 1))
                dt += costs[a] if j == 0 else 0.0
                dt += bias if j < SETTLE else 0.0
                k += 1
                t += dt
                before[k] = t
    return before, periods


def test_recovers_a_known_cost_and_separates_arms():
    before, periods = _run({"none": 0.0, "cheap": 0.005, "dear": 0.040}, rounds=60)
    got, base = period_costs(before, periods)
    assert base == pytest.approx(STEP, rel=0.05)
    st = summarize(got, WINDOW * base, versus="cheap")
    norm = WINDOW * base
    for arm, cost in (("cheap", 0.005), ("dear", 0.040)):
        lo, hi = st[arm]["ci"]
        # Within about 2.4 standard errors (the 90% interval is 3.3 wide).
        assert abs(st[arm]["overhead"] - cost / norm) < hi - lo, (arm, st[arm])
        assert hi - lo < 0.05  # 60 periods: a few percent wide, not tens
    assert st["none"]["overhead"] == pytest.approx(0.0, abs=1e-12)  # the zero
    assert st["dear"]["diff_ci"][0] > 0  # dear costs more than cheap, shown


def test_placebo_corrects_a_bias_of_the_period_structure():
    # Charged steps run 5 ms faster than clean ones whatever the arm: the raw
    # estimate of a free checkpoint is -25 ms per period, the corrected one 0.
    before, periods = _run(
        {"none": 0.0, "free": 0.0}, rounds=60, bias=-0.005, noise=0.05
    )
    got, base = period_costs(before, periods)
    st = summarize(got, WINDOW * base)
    norm = WINDOW * base
    assert st["free"]["raw_overhead"] == pytest.approx(-0.025 / norm, abs=0.008)
    assert st["none"]["raw_ci"][1] < 0  # the placebo shows the bias
    lo, hi = st["free"]["ci"]
    assert lo < 0 < hi


def test_profile_puts_the_cost_where_it_lands():
    before, periods = _run({"none": 0.0, "a": 0.050}, rounds=40)
    got, _ = period_costs(before, periods)
    prof = profile(before, got)
    assert prof["a"][0] == pytest.approx(0.050, abs=0.015)
    assert all(abs(x) < 0.015 for x in prof["a"][1:])


def test_no_clean_steps_is_an_error():
    before = {k: 0.1 * k for k in range(21)}
    periods = [
        {"arm": "a", "round": 0, "start": 0, "window": 10, "charged": 10},
        {"arm": "none", "round": 0, "start": 10, "window": 10, "charged": 10},
    ]
    with pytest.raises(ValueError, match="no clean steps"):
        period_costs(before, periods)


def test_interleaved_run_merges_the_trace_at_the_end_only(tmp_path):
    # A mid-run merge would stall rank 0's training thread in a measured step.
    import types

    from research.comm.world import get_world
    from research.studies.checkpoint_bench import Interleaved
    from research.trace import Tracer

    tracer = Tracer(tmp_path, 0, 1, flush_every=1, merge_every_s=0.0)
    trainer = types.SimpleNamespace(world=get_world(), run_dir=tmp_path, tracer=tracer)
    Interleaved({}, {"none": ("none", 0)}, [], warm_saves_at=1).on_train_start(trainer)
    tracer.complete("step", "compute", 0.0, 1.0)  # flushed at once: no merge
    assert (tmp_path / "trace" / "rank0.json").exists()
    assert not (tmp_path / "trace.json").exists()
    tracer.close()  # merges
    assert (tmp_path / "trace.json").exists()
    assert tracer.merge_every_s == math.inf
