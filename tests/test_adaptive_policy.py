"""The adaptive strategy's model and decisions on stamps made up from measured
figures (no MPI).

The figures are the medians the fixed arms measured on the local cluster at 2
ranks (2026-11-28, ``docs/journal.md``): a dense step 52 ms at 10 Gb/s (its
allreduce 28 ms) and 211 ms at 1 Gb/s; top-k at 5% 74 ms (its selection 19,
its sparse allreduce 25 ms at 10 Gb/s, 49 at 1 Gb/s); under a 0.32 s random
straggler dense 385 ms and solo 263. The stamps are exchanged as the strategy
exchanges them (a synchronous candidate's read the next step, a partial one's
``staleness`` steps later), so the policy sees what it would on the ranks.
"""

from __future__ import annotations

import math
import random

import pytest

from research.strategies.adaptive.changepoint import ChangePoint
from research.strategies.adaptive.model import CostModel, Fit, replay
from research.strategies.adaptive.policy import Policy, parse_candidates, parse_plan
from research.strategies.adaptive.stamp import FIELDS

MB = 1e6
DENSE_BYTES, SPARSE_BYTES = 19.4 * MB, 2.6 * MB


class Cluster:
    """Ranks whose steps cost what the fixed arms measured (module docstring)."""

    def __init__(self, size: int = 2, seed: int = 0) -> None:
        self.size, self.rng = size, random.Random(seed)
        self.rate = 10.0  # Gb/s
        self.straggler = 0.0  # seconds, one random rank each step
        self.clock = [0.0] * size  # a partial collective's ranks run apart
        self.load = 1.0  # the cores' work takes this much longer (others' jobs)

    def transfer(self, kind: str) -> float:
        """Top-k's wait for messages (its sparse allreduce says it)."""
        return 2.6 * 8e-3 / self.rate + 2e-4 if kind == "sparse" else math.nan

    def comm(self, kind: str) -> float:
        wire = {"dense": 19.4, "partial": 19.4, "sparse": 2.6}[kind] * 8e-3
        fixed = {"dense": 0.013, "partial": 0.02, "sparse": 0.023}[kind]
        return fixed * self.load + wire / self.rate

    def step(self, step: int, method: int, since: int, kind: str, lag=math.nan):
        arrive = [
            (0.018 + self.rng.uniform(0, 0.004)) * self.load for _ in range(self.size)
        ]
        if self.straggler:
            arrive[self.rng.randrange(self.size)] += self.straggler
        other = {"dense": 0.006, "partial": 0.01, "sparse": 0.03}[kind] * self.load
        comm = self.comm(kind)
        nbytes = SPARSE_BYTES if kind == "sparse" else DENSE_BYTES
        rows = []
        waits = [0.0] * self.size
        if kind == "partial":  # its own pace; every 8th round waits for all
            self.clock = [t + a + comm + other for t, a in zip(self.clock, arrive)]
            if (step + 1) % 8 == 0:
                waits = [max(self.clock) - t for t in self.clock]
                self.clock = [max(self.clock)] * self.size
        for r in range(self.size):
            if kind == "partial":
                wait = comm + waits[r]
                total, age = arrive[r] + wait + other, 2.0 if self.straggler else 0.3
            else:
                wait = max(arrive) - arrive[r] + comm
                total, age = max(arrive) + comm + other, math.nan
            row = dict(
                step=step, method=method, since=since, total=total,
                arrive=arrive[r], comm=wait, bytes=nbytes, lag=lag, age=age,
                carried=0, transfer=self.transfer(kind),
                full=float(kind == "partial" and (step + 1) % 8 == 0),
            )  # fmt: skip
            rows.append([row[f] for f in FIELDS])
        return rows


def _policy(candidates: str = "host,sparse,solo", **kw) -> Policy:
    return Policy(parse_candidates(candidates, "0.05"), size=kw.pop("size", 2), **kw)


def _seed(p: Policy, cl: Cluster) -> None:
    """Start-up: every candidate's collective once at the first rate."""
    for i, c in enumerate(p.candidates):
        kind = "partial" if c.kind == "partial" else c.kind
        nbytes = SPARSE_BYTES if kind == "sparse" else DENSE_BYTES
        other = 0.03 if kind == "sparse" else 0.006
        p.model.seed(i, cl.comm(kind), nbytes, other)
    sparse = {i: cl.transfer("sparse") for i, c in enumerate(p.candidates)
              if c.kind == "sparse"}  # fmt: skip
    p.model.anchor(p.dense, 1e-4, sparse)


def _run(p: Policy, cl: Cluster, steps: range, events: dict) -> list[str]:
    """Run ``steps``; ``events``: step -> a change of the cluster. Returns the
    label that ran at each step."""
    ran, queue = [], []
    for step in steps:
        if step in events:
            events[step](cl)
        while queue and queue[0][0] <= step:
            p.observe(queue.pop(0)[1])
        before = p.current
        d = p.decide(step)
        if d.to is not None and p.candidates[before].kind == "partial":
            while queue:
                p.observe(queue.pop(0)[1])
        c = p.candidates[p.current]
        lag = 2.0 if c.kind == "sparse" and p.measure_lag(step) else math.nan
        rows = cl.step(step, p.current, p.since, c.kind, lag)
        p.account(rows[0][FIELDS.index("total")])
        queue.append((step + p.lag_of(step), rows))
        ran.append(p.labels[p.current])
    return ran


def test_changepoint_enters_and_leaves_on_the_same_test():
    cp = ChangePoint(window=3, rel=0.2)
    rng = random.Random(1)
    xs = [0.003 + rng.uniform(0, 0.002) for _ in range(20)]
    assert not any(cp.add(x, floor=0.005) for x in xs)
    assert not cp.add(0.4, floor=0.005)  # one sample: not yet
    assert cp.add(0.33, floor=0.005)  # the second: a new level
    assert cp.level == pytest.approx(0.365, abs=0.04)
    assert not any(cp.add(0.32 + rng.uniform(0, 0.02), 0.005) for _ in range(10))
    assert not cp.add(0.004, floor=0.005)
    assert cp.add(0.003, floor=0.005)  # and back, by the same rule
    assert cp.changes == 2
    # A lone outlier in a steady series moves nothing.
    steady = (0.004, 0.005, 0.9, 0.004, 0.005, 0.004)
    assert not any(cp.add(x, floor=0.005) for x in steady)
    copy = ChangePoint(window=3, rel=0.2)
    copy.load(cp.state())
    assert copy.state() == cp.state()


def test_a_fit_takes_its_fixed_part_then_its_slope_from_two_rates():
    f = Fit(wire=10 * MB)
    f.add_pair(1e-9, 0.030)  # 10 ms on the link at 1 ns/byte
    assert (f.alpha, f.c) == (pytest.approx(0.020), 1.0)
    f.add_pair(1e-8, 0.150)  # ten times slower: the slope is fitted too
    assert f.c == pytest.approx(4 / 3) and f.alpha == pytest.approx(0.03 - 0.04 / 3)


def test_replay_of_partial_collectives_under_a_straggler():
    rng = random.Random(0)
    rows = []
    for _ in range(40):
        r = [0.02, 0.02, 0.02, 0.02]
        r[rng.randrange(4)] += 0.32
        rows.append(r)
    sync = replay(rows, 0.03, 8, "sync")
    solo = replay(rows, 0.03, 8, "solo")
    majority = replay(rows, 0.03, 8, "majority")
    assert sync == pytest.approx(0.37)  # every step waits for the straggler
    assert solo < majority < sync
    assert solo < 0.25  # a rank is late in a quarter of its steps
    assert replay(rows, 0.03, 1, "solo") == pytest.approx(sync)  # all full


def test_the_model_sees_the_link_fall_and_predicts_topk():
    cl = Cluster()
    p = _policy()
    _seed(p, cl)
    _run(p, cl, range(0, 12), {})
    dense, sparse = p.model.predict(0), p.model.predict(1)
    assert dense == pytest.approx(0.052, rel=0.15)
    assert sparse > dense  # at 10 Gb/s top-k's selection costs more than it saves
    events = {12: lambda c: setattr(c, "rate", 1.0)}
    _run(p, cl, range(12, 15), events)
    assert [e["what"] for e in p.events] == ["link"]
    assert p.model.predict(0) == pytest.approx(0.19, rel=0.2)
    assert p.model.predict(1) < 0.5 * p.model.predict(0)


def test_follows_a_fast_link_a_slow_one_and_a_straggler_without_probing():
    """The scenario the demonstration runs, in miniature: dense, then top-k a
    few steps after the link falls, dense after it comes back, solo a few
    steps into the straggler, dense a few steps after it left."""
    cl = Cluster()
    p = _policy(dense_steps=5)
    _seed(p, cl)
    events = {
        30: lambda c: setattr(c, "rate", 1.0),
        60: lambda c: setattr(c, "rate", 10.0),
        90: lambda c: setattr(c, "straggler", 0.32),
        120: lambda c: setattr(c, "straggler", 0.0),
    }
    ran = _run(p, cl, range(150), events)
    assert set(ran[:30]) == {"host"}
    assert ran[29 + 4 : 60] == ["sparse:0.05"] * (60 - 33), ran[25:60]
    assert ran[60 + 4 : 90] == ["host"] * (90 - 64), ran[58:90]
    assert ran[90 + 4 : 120] == ["solo"] * (120 - 94), ran[88:120]
    # Solo's stamps come staleness (8) steps late: its end is seen then.
    assert ran[120 + 8 + 4 :] == ["host"] * (150 - 132), ran[118:]
    assert p.probes == 0 and p.switches == 4
    assert [e["what"] for e in p.events].count("lateness") >= 2


def test_sees_the_link_come_back_under_topk_while_the_cores_slow_down():
    """Top-k sends little: when the link comes back its step barely moves, and
    here the cores slow down twice at the same step (another job), which
    alone would hide it. Its fit's fixed part is CPU work, scaled by the
    slower computation, so what is left of its seconds shows the link: dense
    again, once the slower computation is the median of the last steps'
    (``RECENT``, 8) and the rule has seen two samples (step 35, dense at 36)."""
    cl = Cluster()
    p = _policy(candidates="host,sparse", dense_steps=5)
    _seed(p, cl)

    def back(c):
        c.rate, c.load = 10.0, 2.0

    ran = _run(p, cl, range(60), {10: lambda c: setattr(c, "rate", 1.0), 30: back})
    assert ran[14:30] == ["sparse:0.05"] * 16, ran
    assert ran[36:] == ["host"] * 24, ran
    assert [e["what"] for e in p.events if e["step"] >= 30][:1] == ["link"]


def test_keeps_dense_first_and_when_the_gain_is_inside_the_margin():
    cl = Cluster()
    p = _policy(dense_steps=40, margin=0.1)
    _seed(p, cl)
    ran = _run(p, cl, range(40), {2: lambda c: setattr(c, "rate", 1.0)})
    assert set(ran) == {"host"}  # the first steps: dense whatever it costs
    q = _policy(candidates="host,sparse", dense_steps=0, margin=0.9)
    _seed(q, cl)
    assert set(_run(q, cl, range(40), {})) == {"host"}  # 10% gain < 90% margin


def test_a_partial_replay_learns_its_bias_and_probes_past_its_bound():
    """The model replays solo over the arrivals; a solo that waits for every
    rank each round (a broken one) is 1.4x slower than its replay: the model
    takes the bias from solo's own steps and goes back to dense. A solo ten
    times faster than its replay is beyond what the model takes (0.25): its
    error stays above the bound, so it probes dense, counted with its seconds,
    and comes back to solo."""

    class Scaled(Cluster):
        def __init__(self, factor: float) -> None:
            super().__init__()
            self.factor, self.straggler = factor, 0.32

        def step(self, step, method, since, kind, lag=math.nan):
            rows = super().step(step, method, since, kind, lag)
            if kind == "partial":
                for row in rows:
                    row[FIELDS.index("total")] *= self.factor
            return rows

    slow = Scaled(1.4)
    p = _policy(candidates="host,solo", dense_steps=0, patience=10)
    _seed(p, slow)
    ran = _run(p, slow, range(80), {})
    assert "solo" in ran and ran[-10:] == ["host"] * 10, ran
    assert p.model.fits[1].scale > 1.2 and p.probes == 0
    fast = Scaled(0.1)
    q = _policy(candidates="host,solo", dense_steps=0, patience=10)
    _seed(q, fast)
    ran = _run(q, fast, range(80), {})
    assert 1 <= q.probes <= 3 and q.probe_s > 0, (q.probes, ran)
    assert ran[-1] == "solo" and q.model.fits[1].scale == 0.25


def test_guard_leaves_topk_and_keeps_it_away():
    cl = Cluster()
    p = _policy(plan=[(0, 1)], interval=4, max_lag=3.0, cooldown=2)
    _seed(p, cl)
    d = None
    for step in range(1, 10):
        lag = 8.0 if step == 5 else math.nan
        p.observe(cl.step(step - 1, p.current, p.since, "sparse", lag))
        d = p.decide(step)
        if d.to is not None:
            break
    assert (d.reason, p.labels[p.current], p.guard_fired) == ("guard", "host", 1)
    assert "holds 8.0 gradients" in d.why and p.cooldown_until == d.step + 8


def test_plan_switches_at_its_steps():
    cands = parse_candidates("host,sparse,solo", "0.05")
    plan = parse_plan("sparse:0.05@0,host@6,solo@13", [c.label for c in cands])
    p = Policy(cands, size=2, plan=plan)
    assert p.labels[p.current] == "sparse:0.05"
    ran = {}
    for step in range(1, 30):
        d = p.decide(step)
        if d.to is not None:
            ran[step] = p.labels[p.current]
    assert ran == {6: "host", 13: "solo"}
    with pytest.raises(ValueError, match="METHOD@STEP"):
        parse_plan("host", [c.label for c in cands])
    with pytest.raises(ValueError, match="must include host"):
        parse_candidates("sparse,solo", "0.01")


def test_state_round_trips_through_a_vector():
    cl = Cluster()
    p = _policy()
    _seed(p, cl)
    _run(p, cl, range(40), {20: lambda c: setattr(c, "rate", 1.0)})
    q = _policy()
    q.load(p.vector())
    assert q.vector() == pytest.approx(p.vector(), nan_ok=True)
    assert [q.model.predict(i) for i in range(3)] == pytest.approx(
        [p.model.predict(i) for i in range(3)]
    )
    with pytest.raises(ValueError, match="other candidates"):
        _policy(candidates="host,sparse").load(p.vector())


def test_costmodel_state_keeps_every_fit():
    m = CostModel(["dense", "sparse"], ["sync", "sync"], 2, 8)
    m.seed(0, 0.03, DENSE_BYTES, 0.006)
    m.seed(1, 0.025, SPARSE_BYTES, 0.03)
    m.anchor(0, 1e-4)
    n = CostModel(["dense", "sparse"], ["sync", "sync"], 2, 8)
    n.load(m.state())
    assert n.state() == pytest.approx(m.state(), nan_ok=True)


def test_a_link_that_moves_as_a_switch_lands_leaves_the_fits_true():
    """The campaign's failure (2026-11-28, run 2): the link fell during a
    switch's first measured steps, so their seconds were taken as the new
    method's at the old link; its fixed part swelled and dense was predicted
    at 1 Gb/s figures for the rest of the run. Here the link falls on top-k's
    second step after a switch and comes back on dense's: both are read as the
    link, the fits stay those of the cluster, and the model chooses again."""
    cl = Cluster()
    p = _policy(candidates="host,sparse", plan=[(0, 0), (20, 1), (40, 0)])
    _seed(p, cl)
    events = {
        22: lambda c: setattr(c, "rate", 1.0),  # top-k's second fresh step
        42: lambda c: setattr(c, "rate", 10.0),  # dense's second fresh step
    }
    _run(p, cl, range(60), events)
    whats = [(e["step"], e["what"]) for e in p.events]
    assert (22, "link") in whats and (42, "link") in whats, whats
    truth = {0: 0.020 + cl.comm("dense") + 0.006, 1: 0.020 + cl.comm("sparse") + 0.03}
    for i, t in truth.items():
        assert p.model.predict(i) == pytest.approx(t, rel=0.2), (i, p.model.fits[i])
    cl.rate = 1.0  # and at the slow link, where only top-k's old figures were
    p.plan = []
    ran = _run(p, cl, range(60, 80), {})
    assert ran[-10:] == ["sparse:0.05"] * 10, ran
    want = 0.020 + cl.comm("dense") + 0.006
    assert p.model.predict(0) == pytest.approx(want, rel=0.2)


def test_a_switch_right_after_the_link_moved_reads_the_link_not_a_pair():
    """Dense saw one slow step (the link fell at step 19: one sample out of
    its band, not yet a change) and the switch came at the next step: top-k's
    first step is read as the link, not as top-k's own figure."""
    cl = Cluster()
    p = _policy(candidates="host,sparse", plan=[(0, 0), (20, 1)])
    _seed(p, cl)
    _run(p, cl, range(40), {19: lambda c: setattr(c, "rate", 1.0)})
    assert [(e["step"], e["what"]) for e in p.events][:1] == [(21, "link")]
    dense = 0.020 + cl.comm("dense") + 0.006
    assert p.model.predict(0) == pytest.approx(dense, rel=0.2)


def test_a_partial_collectives_waits_are_not_read_as_the_link():
    """Majority's ranks wait for their round's initiator, the straggler in a
    quarter of its rounds: those waits hold lateness, not the link (read as
    it, a straggler became a slow link and dense was predicted at 700 ms
    against 115, 4 ranks, 2026-11-28)."""

    class Initiators(Cluster):
        def step(self, step, method, since, kind, lag=math.nan):
            rows = super().step(step, method, since, kind, lag)
            if kind == "partial" and step % 4 == 0:
                for row in rows:
                    row[FIELDS.index("comm")] += self.straggler
            return rows

    cl = Initiators()
    cl.straggler = 0.32
    p = _policy(candidates="host,majority", plan=[(0, 0), (10, 1)])
    _seed(p, cl)
    _run(p, cl, range(10), {})
    beta = p.model.beta
    _run(p, cl, range(10, 60), {})
    assert p.model.beta == pytest.approx(beta, rel=0.2)
    assert "link" not in [e["what"] for e in p.events]
    dense = p.model.fits[0].comm(p.model.beta)
    assert dense == pytest.approx(cl.comm("dense"), rel=0.2)


def test_one_rank_has_no_link_and_keeps_each_seeded_time():
    """At one rank a dense collective moves no byte (its wire is 0): the start-up
    once divided by it (`--np 1 --strategy adaptive`, 2026-11-28, on GPU and
    CPU). The link is then 0 and each candidate costs what it was seen to."""
    for transfer in (None, {0: 0.001, 1: 0.002}):
        m = CostModel(["dense", "sparse"], ["sync", "sync"], 1, 8)
        m.seed(0, 0.0005, DENSE_BYTES, 0.006)
        m.seed(1, 0.002, SPARSE_BYTES, 0.03)
        m.anchor(0, 1e-4, transfer)
        assert math.isfinite(m.beta)
        assert m.fits[0].comm(m.beta) == pytest.approx(0.0005)
