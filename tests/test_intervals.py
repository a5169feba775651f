"""Checks decided on intervals: PASS, FAIL or UNDECIDED on constructed data."""

from __future__ import annotations

import math

import pytest

from research.studies.intervals import (
    FAIL,
    PASS,
    UNDECIDED,
    Estimate,
    difference,
    mean,
    median,
    ratio,
    t95,
    verdict,
)


def test_the_t_interval_of_a_mean():
    est = mean([1.0, 2.0, 3.0])
    # mean 2, sd 1, n 3: half-width t(2) x 1 / sqrt(3).
    half = 2.920 / math.sqrt(3)
    assert est.value == 2.0 and est.n == 3 and est.of == "seeds"
    assert est.lo == pytest.approx(2 - half) and est.hi == pytest.approx(2 + half)
    assert t95(2.5) == 2.920 and t95(1e6) == 1.645 and math.isinf(t95(0.5))
    assert mean([None, 4.0, math.inf]).show() == "4.00 (1 seeds: no interval)"


@pytest.mark.parametrize(
    "xs,limit,above,word",
    [
        ([1.30, 1.31, 1.32, 1.31], 1.1, True, PASS),  # well above
        ([1.00, 1.01, 1.02, 1.01], 1.1, True, FAIL),  # well below
        ([0.9, 1.3, 1.1, 1.2], 1.1, True, UNDECIDED),  # the interval holds 1.1
        ([0.02, 0.03, 0.025], 0.05, False, PASS),  # at most 5%: below
        ([0.06, 0.07, 0.065], 0.05, False, FAIL),
        ([0.01, 0.09, 0.05], 0.05, False, UNDECIDED),
        ([1.5], 1.1, True, UNDECIDED),  # one seed: the noise unknown
    ],
)
def test_verdicts_on_the_interval_not_the_point(xs, limit, above, word):
    assert verdict(mean(xs), limit, above=above) == word


def test_a_point_past_the_limit_with_a_wide_interval_is_undecided():
    # Mean 0.045 is under 5%, but the interval reaches past it: not a PASS.
    est = mean([0.02, 0.07, 0.045])
    assert est.value < 0.05 < est.hi
    assert verdict(est, 0.05, above=False) == UNDECIDED
    assert verdict(Estimate(0.045, 0.041, 0.049, 3, "rounds"), 0.05, above=False) == (
        PASS
    )


def test_the_bootstrap_of_a_median_and_of_a_ratio_is_deterministic():
    steps = [0.10, 0.11, 0.12, 0.10, 0.30, 0.11, 0.10, 0.12, 0.11, 0.10]
    a, b = median(steps), median(steps)
    assert a == b and a.value == pytest.approx(0.11) and a.lo <= 0.11 <= a.hi
    assert a.hi < 0.30  # one slow step does not carry the median's interval
    host = [0.20 + 0.01 * (i % 3) for i in range(20)]
    overlap = [0.10 + 0.01 * (i % 3) for i in range(20)]
    r = ratio(host, overlap)
    assert r.value == pytest.approx(0.21 / 0.11) and r.n == 20
    assert verdict(r, 1.3, above=True) == PASS
    assert verdict(ratio(host, host), 1.3, above=True) == FAIL
    assert verdict(ratio(host[:3], overlap[:3]), 1.9, above=True) == UNDECIDED
    assert ratio([1.0], [2.0]).known is False


def test_paired_samples_keep_their_pairs():
    # Seeds that move both arms alike: paired, the ratio is sharp.
    a = [10.0, 20.0, 30.0, 40.0]
    b = [x * 1.25 for x in a]
    paired = ratio(b, a, "seeds", stat="mean", paired=True)
    assert paired.lo == pytest.approx(1.25) and paired.hi == pytest.approx(1.25)
    loose = ratio(b, a, "seeds", stat="mean")
    assert loose.hi - loose.lo > 0.5
    d = difference(b, a, paired=True)
    assert d.value == pytest.approx(6.25) and d.n == 4
    assert ratio([1.0, None, 3.0], [1.0, 2.0, None], paired=True).n == 1


def test_welch_difference():
    d = difference([1.0, 1.1, 0.9], [2.0, 2.1, 1.9])
    assert d.value == pytest.approx(-1.0) and d.hi < 0
    assert verdict(d, 0.0, above=False) == PASS
    same = difference([1.0, 1.0], [1.0, 1.0])
    assert same.lo == same.hi == 0.0
    assert difference([1.0], [2.0]).known is False


def test_show_says_what_a_figure_rests_on():
    est = Estimate(1.3123, 1.2, 1.4, 3, "seeds")
    assert est.show(".2f", "x") == "1.31x [1.20, 1.40] (3 seeds)"
    assert (
        Estimate(0.026, 0.021, 0.031, 10, "rounds").show("+.1f", "%", 100)
        == "+2.6% [+2.1, +3.1] (10 rounds)"
    )
