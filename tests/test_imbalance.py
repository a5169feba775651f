"""Load-imbalance models and their command-line grammar (single process)."""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pytest

from research.imbalance import (
    DistImbalance,
    FixedImbalance,
    Imbalance,
    RandomImbalance,
    hold,
    parse_imbalance,
)


def table(imb: Imbalance, steps: int, size: int) -> np.ndarray:
    return np.array([[imb.delay(s, r) for r in range(size)] for s in range(steps)])


def test_none_never_sleeps():
    imb = parse_imbalance("none", size=4)
    assert type(imb) is Imbalance
    assert not table(imb, 10, 4).any()
    assert imb.describe() == {"name": "none", "spec": "none"}


def test_fixed_sleeps_given_ranks_every_step():
    imb = parse_imbalance("fixed:ranks=1,3:seconds=0.1", size=4)
    assert isinstance(imb, FixedImbalance)
    t = table(imb, 5, 4)
    assert (t[:, [1, 3]] == 0.1).all() and not t[:, [0, 2]].any()


def test_random_draws_exactly_k_shared_ranks():
    imb = parse_imbalance("random:k=1:seconds=0.32", size=8, seed=3)
    t = table(imb, 200, 8)
    assert ((t > 0).sum(axis=1) == 1).all()
    assert set(np.unique(t)) == {0.0, 0.32}
    # Spread over ranks, not always the same one.
    assert len(set(np.flatnonzero(t.max(axis=0)))) == 8
    # Same seed, same draw (what every rank computes on its own).
    again = parse_imbalance("random:k=1:seconds=0.32", size=8, seed=3)
    assert (table(again, 200, 8) == t).all()
    other = parse_imbalance("random:k=1:seconds=0.32", size=8, seed=4)
    assert (table(other, 200, 8) != t).any()


def test_random_k_range():
    imb = parse_imbalance("random:k=1-2:seconds=0.5", size=4, seed=0)
    counts = (table(imb, 300, 4) > 0).sum(axis=1)
    assert set(counts) == {1, 2}
    assert isinstance(imb, RandomImbalance) and imb.spec() == "random:k=1-2:seconds=0.5"


@pytest.mark.parametrize(
    "spec,mean",
    [
        ("dist:exponential:mean=0.05", 0.05),
        ("dist:uniform:low=0.01:high=0.03", 0.02),
        ("dist:lognormal:mean=0.04:sigma=0.5", 0.04),
        ("dist:normal:mean=0.05:std=0.01", 0.05),
    ],
)
def test_distributions_have_their_mean_and_differ_per_rank(spec, mean):
    imb = parse_imbalance(spec, size=4, seed=1)
    assert isinstance(imb, DistImbalance)
    t = table(imb, 2000, 4)
    assert (t >= 0).all()
    assert abs(t.mean() - mean) < 0.1 * mean
    assert (t[:, 0] != t[:, 1]).any()
    assert parse_imbalance(imb.spec(), size=4, seed=1).spec() == imb.spec()


def test_random_groups_hold_one_node_of_ranks_together():
    # 2 nodes x 2 ranks in blocks: each step the ranks of one node, both of them.
    imb = parse_imbalance("random:k=1:seconds=0.2:group=2", size=4, seed=1)
    t = table(imb, 200, 4) > 0
    assert ((t[:, 0] == t[:, 1]) & (t[:, 2] == t[:, 3])).all()
    assert (t.sum(axis=1) == 2).all()
    assert t[:, 0].any() and t[:, 2].any()  # either node, drawn per step
    assert imb.spec() == "random:k=1:seconds=0.2:group=2"
    # group=1 is the per-rank draw, the same delays as without it.
    plain = parse_imbalance("random:k=1:seconds=0.2", size=4, seed=1)
    one = parse_imbalance("random:k=1:seconds=0.2:group=1", size=4, seed=1)
    assert (table(one, 50, 4) == table(plain, 50, 4)).all()
    assert one.spec() == plain.spec()
    # Groups of three ranks: k=2 holds both groups, all six ranks.
    three = parse_imbalance("random:k=2:seconds=0.1:group=3", size=6)
    assert ((table(three, 20, 6) > 0).sum(axis=1) == 6).all()


def test_start_skips_early_steps():
    imb = parse_imbalance("fixed:ranks=0:seconds=0.2:start=3", size=2)
    assert [imb.delay(s, 0) for s in range(5)] == [0, 0, 0, 0.2, 0.2]
    assert imb.spec() == "fixed:ranks=0:seconds=0.2:start=3"


def test_end_closes_the_window():
    imb = parse_imbalance("random:k=1:seconds=0.1:start=2:end=4", size=2)
    per_step = [sum(imb.delay(s, r) for r in range(2)) for s in range(6)]
    assert per_step == [0, 0, 0.1, 0.1, 0, 0]
    with pytest.raises(ValueError, match="end=2 must be after start=2"):
        parse_imbalance("fixed:ranks=0:seconds=1:start=2:end=2", size=2)


def test_spec_round_trips():
    for spec in [
        "fixed:ranks=1,3:seconds=0.1",
        "random:k=2:seconds=0.32",
        "dist:exponential:mean=0.05",
        "random:k=1:seconds=0.1:start=2:how=spin",
        "dist:uniform:low=0:high=0.1:how=spin",
        "dist:exponential:mean=0.05:start=1:end=9",
    ]:
        assert parse_imbalance(spec, size=4).spec() == spec
    assert parse_imbalance("fixed:ranks=0:seconds=1:how=sleep", size=2).how == "sleep"


def _runnable_s() -> float:
    """Seconds this process's threads ran or waited to run (schedstat).

    A thread that keeps a core busy accumulates it at the wall-clock rate however
    loaded the machine is (time it is denied the CPU it spends queued); a thread
    that sleeps accumulates none. CPU time alone would read low on a loaded
    machine and fail a correct spin.
    """
    total = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/schedstat") as f:
                run_ns, queued_ns = f.read().split()[:2]
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        total += int(run_ns) + int(queued_ns)
    return total / 1e9


def _uncharged_s() -> float:
    """Seconds the machine's cores spent in interrupts or stolen by the hypervisor.

    The scheduler charges neither to any task (with IRQ and steal time accounting,
    as on these VMs), so a thread that keeps its core busy accumulates less than
    wall time in schedstat by up to this much. Summed over all cores, so an upper
    bound on what one thread lost.
    """
    with open("/proc/stat") as f:
        # cpu user nice system idle iowait irq softirq steal
        fields = f.readline().split()
    ticks = sum(int(v) for v in fields[6:9])
    return ticks / os.sysconf("SC_CLK_TCK")


def test_spin_keeps_a_core_busy_and_sleep_does_not():
    imb = parse_imbalance("fixed:ranks=0:seconds=0.2:how=spin", size=2)
    hold(0.0, "spin")  # compile and calibrate outside the measurement

    def measure(how: str, seconds: float) -> tuple[float, float, float]:
        b0, l0, t0 = _runnable_s(), _uncharged_s(), time.perf_counter()
        if how == "spin":
            imb.hold(seconds)
        else:
            hold(seconds)
        wall = time.perf_counter() - t0
        return wall, _runnable_s() - b0, _uncharged_s() - l0

    # CI once read 0.147 s of 0.200 for a spin on a loaded VM. Time spent in
    # interrupts or stolen by the hypervisor is charged to no task, so it is
    # credited; and a spin gets three tries, since a sleeping one reads near zero
    # every time while a busy one is only sometimes descheduled.
    tries = [measure("spin", 0.2) for _ in range(3)]
    assert all(wall >= 0.2 for wall, _, _ in tries)
    assert any(busy + lost > 0.8 * wall for wall, busy, lost in tries), tries
    wall, busy, _ = measure("sleep", 0.2)
    assert wall >= 0.2
    assert busy < 0.1 * wall, ("sleep", wall, busy)


def test_spin_leaves_the_gil_to_other_threads():
    hold(0.0, "spin")
    ticks = []
    stop = threading.Event()

    def other():
        # Needs the GIL for every tick and gives it back only while asleep.
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(1e-5)

    # With a 100 s switch interval the interpreter never takes the GIL from a
    # thread that holds it: the other thread can tick during the spin only if the
    # spin gives the GIL up itself (inside each XLA chunk). No rate is assumed,
    # so a loaded machine cannot fail it.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    th = threading.Thread(target=other)
    try:
        th.start()
        t0 = time.perf_counter()
        hold(0.5, "spin")
        t1 = time.perf_counter()
    finally:
        stop.set()
        th.join()
        sys.setswitchinterval(interval)
    during = [t for t in ticks if t0 <= t <= t1]
    assert len(during) >= 2, len(during)


@pytest.mark.parametrize(
    "spec,message",
    [
        ("slow", "unknown imbalance model 'slow'"),
        ("none:x=1", "takes no arguments"),
        ("fixed:seconds=0.1", "missing ranks"),
        ("fixed:ranks=4:seconds=0.1", "ranks must be in 0..3"),
        ("fixed:ranks=a:seconds=0.1", "comma-separated integers"),
        ("fixed:ranks=1:seconds=-1", "seconds must be >= 0"),
        ("fixed:ranks=1:seconds=x", "seconds='x' is not a number"),
        ("random:k=5:seconds=0.1", "k must satisfy"),
        ("random:k=2-1:seconds=0.1", "is empty"),
        ("random:k=1:secs=0.1", "unknown key 'secs'"),
        ("random:k=1:k=2:seconds=1", "k given twice"),
        ("random:k1", "expected key=value"),
        ("dist:mean=0.1", "name a distribution first"),
        ("dist:pareto:a=1", "unknown distribution 'pareto'"),
        ("dist:uniform:low=0.2:high=0.1", "low <= high"),
        ("dist:normal:mean=0.1", "missing std"),
        ("random:k=1:seconds=0.1:how=nap", "how='nap'; choose one of sleep, spin"),
        ("dist:exponential:mean=0.1:how=x", "how='x'"),
        ("random:k=1:seconds=0.1:group=3", "group must divide the 4 ranks"),
        ("random:k=3:seconds=0.1:group=2", "k <= 2 groups of 2, got 3-3"),
        ("random:k=1:seconds=0.1:group=x", "group='x' is not an integer"),
    ],
)
def test_bad_specs_raise_clear_errors(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        parse_imbalance(spec, size=4)
