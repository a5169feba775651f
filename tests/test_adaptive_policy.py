"""The adaptive strategy's decisions, fed with made-up windows (no MPI).

The figures are what every rank would report for a window of steps; the
policy must probe what it has not measured, pick the cheapest only when it
is cheaper by more than the noise, come back to the more accurate method when
it is within the noise again, re-probe when conditions change, and leave top-k
at once when the guard's figure is over its bound.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from research.comm.adaptive_policy import (
    PROBE,
    RUN,
    Policy,
    Window,
    estimate,
    parse_candidates,
    parse_plan,
)


def _policy(**kw) -> Policy:
    cands = parse_candidates(kw.pop("candidates", "host,sparse,solo"), "0.01")
    opts = dict(
        interval=10, probe_steps=3, refresh=100, max_refresh=400, margin=0.05,
        max_lag=50.0, cooldown=2, plan=[],
    )  # fmt: skip
    opts.update(kw)
    return Policy(cands, **opts)


def _windows(
    cost: float,
    n: int = 4,
    ranks: int = 2,
    spread: float = 0.0,
    comm: float = 0.0,
    lag: float | None = None,
    jitter: float = 0.002,
):
    """Every rank's window: steps of ``cost`` s (+- jitter), arrivals apart by
    ``spread`` (rank 0 late), ``comm`` s of communication."""
    rng = np.random.default_rng(0)
    out = []
    for r in range(ranks):
        w = Window(lag=lag)
        for _ in range(n):
            late = spread if r == 0 else 0.0
            w.add(cost + jitter * rng.standard_normal(), 0.01 + late, comm)
        out.append(w)
    return out


def _run_to_decision(p: Policy, step: int, cost_of: dict[str, float], **kw):
    """Decide at ``step`` with windows of the current method's cost."""
    assert p.due(step), (step, p.window_start, p.phase)
    return p.decide(step, _windows(cost_of[p.labels[p.current]], **kw))


def test_candidates_expand_and_order():
    labels = [c.label for c in parse_candidates("solo,sparse,host", "0.001,0.01")]
    assert labels == ["host", "sparse:0.01", "sparse:0.001", "solo"]
    with pytest.raises(ValueError, match="must include host"):
        parse_candidates("sparse,solo", "0.01")
    with pytest.raises(ValueError, match="unknown"):
        parse_candidates("host,fused", "0.01")
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        parse_candidates("host,sparse", "0,0.1")
    assert parse_plan("host@0,sparse:0.01@8", labels) == [(0, 0), (8, 1)]
    with pytest.raises(ValueError, match="METHOD@STEP"):
        parse_plan("host", labels)
    with pytest.raises(ValueError, match="candidates are"):
        parse_plan("dense@3", labels)


def test_estimate_takes_the_slowest_rank_and_the_waiting():
    windows = _windows(0.1, spread=0.05, jitter=0.0)
    windows[1].step_s = [0.2] * 4  # rank 1 is slower
    e = estimate(windows, step=7)
    assert e.cost == pytest.approx(0.2) and e.at == 7
    assert e.imbalance == pytest.approx(0.025)  # latest - mean arrival


def test_probes_then_picks_the_cheaper_by_more_than_noise():
    p = _policy()
    cost = {"host": 0.200, "sparse:0.01": 0.080, "solo": 0.150}
    d = _run_to_decision(p, 10, cost)
    # Balanced ranks: solo is not probed; sparse has never been measured.
    assert (d.reason, p.labels[d.to], p.phase) == ("probe", "sparse:0.01", PROBE)
    d = _run_to_decision(p, 14, cost)  # the probed method stays: no switch
    assert (d.reason, d.to, p.phase) == ("choice", None, RUN)
    assert p.labels[p.current] == "sparse:0.01"
    assert "120.0 ms/step cheaper than host" in d.why
    assert p.switches == 1 and p.probes == 1


def test_stays_with_dense_when_sparse_is_within_noise():
    p = _policy()
    cost = {"host": 0.100, "sparse:0.01": 0.098}
    _run_to_decision(p, 10, cost)  # probe sparse
    d = _run_to_decision(p, 14, cost)
    assert d.reason == "choice" and p.labels[p.current] == "host"
    assert "within noise" in d.why
    assert p.refresh_now == 200  # the probe confirmed host: refresh later


def test_change_reprobes_and_imbalance_brings_in_partial():
    p = _policy()
    cost = {"host": 0.100, "sparse:0.01": 0.098, "solo": 0.060}
    _run_to_decision(p, 10, cost)
    _run_to_decision(p, 14, cost)  # back to host
    assert _run_to_decision(p, 24, cost).to is None  # nothing changed
    cost["host"] = 0.180  # a straggler: host now waits for it
    d = _run_to_decision(p, 34, cost, spread=0.08)
    assert d.reason == "probe" and "conditions changed" in d.why
    probed = [p.labels[d.to]]
    while p.phase == PROBE:
        d = _run_to_decision(p, p.window_start + 4, cost, spread=0.08)
        probed.append(p.labels[p.current])
    assert probed[:2] == ["sparse:0.01", "solo"]
    assert p.labels[p.current] == "solo" and d.reason == "choice"


def test_guard_leaves_topk_and_keeps_it_away():
    p = _policy(plan=[(0, 1)])
    assert p.labels[p.current] == "sparse:0.01"
    assert _run_to_decision(p, 10, {"sparse:0.01": 0.05}, lag=3.0).to is None
    d = _run_to_decision(p, 20, {"sparse:0.01": 0.05}, lag=80.0)
    assert (d.reason, p.labels[p.current], p.guard_fired) == ("guard", "host", 1)
    assert "holds 80.0 gradients" in d.why and "max_lag 50" in d.why
    assert p.cooldown_until == 40


def test_plan_switches_at_its_steps():
    p = _policy(plan=[(0, 1), (6, 0), (13, 2)])
    assert p.labels[p.current] == "sparse:0.01"
    ran = {}
    for step in range(1, 30):
        if p.due(step):
            p.decide(step, _windows(0.05))
            ran[step] = p.labels[p.current]
    # Decisions at plan steps and every interval after the last one.
    assert ran == {6: "host", 13: "solo", 23: "solo"}


def test_state_round_trips_through_a_vector():
    p = _policy()
    cost = {"host": 0.200, "sparse:0.01": 0.080}
    _run_to_decision(p, 10, cost)
    p.account(0.2)
    q = _policy()
    q.load(p.vector())
    assert q.vector().tobytes() == p.vector().tobytes()
    assert (q.current, q.phase, q.window_start, q.queue) == (
        p.current, p.phase, p.window_start, p.queue,
    )  # fmt: skip
    assert math.isnan(q.est[2].cost)
    with pytest.raises(ValueError, match="other candidates"):
        _policy(candidates="host,sparse").load(p.vector())


def test_two_anomalous_steps_bring_the_decision_forward():
    p = _policy()
    cost = {"host": 0.100, "sparse:0.01": 0.098}
    _run_to_decision(p, 10, cost)
    _run_to_decision(p, 14, cost)  # host kept: a run window with an estimate
    assert p.watching() and not p.anomalous(0.110)  # within 25%
    assert p.anomalous(0.300)  # the link fell: host's allreduce is slow now
    d = p.decide(16, _windows(0.300, n=2), early=True)
    assert d.reason == "probe" and "-> 300.7 ms for 2 steps" in d.why
    assert not p.watching()  # probing: no early decision


def test_a_link_change_shows_in_the_communication_of_topk():
    """Top-k's step barely moves when the link comes back to 10 Gb/s, but its
    communication falls to less than half: the others are probed again."""
    p = _policy(plan=[])
    cost = {"host": 0.200, "sparse:0.01": 0.070}
    _run_to_decision(p, 10, cost, comm=0.150)
    _run_to_decision(p, 14, cost, comm=0.004)  # sparse chosen
    assert p.labels[p.current] == "sparse:0.01"
    assert _run_to_decision(p, 34, cost, comm=0.004).to is None
    d = _run_to_decision(p, 54, {"sparse:0.01": 0.068}, comm=0.0012)
    assert d.reason == "probe" and "comm 4.0 -> 1.2 ms" in d.why
    assert p.labels[p.current] == "host"
