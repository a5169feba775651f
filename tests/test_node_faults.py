"""Network and node faults on local nodes, every strategy (issue 30).

2 nodes x 2 ranks on a 1 Gb/s shaped link (``research/localnet.py``), the job
started as a user starts it: ``python -m experiments.train --hosts n1,n2
--np 4``. The matrix (``make test-faults``: every case below for ``fused``,
``host``, ``solo``, ``overlap`` and ``sparse``):

* link down (n2's eth0): the job ends with exit 124 and the watchdog's line
  within the timeout and :data:`BOUND_S`; no process of it on either node;
* n2 frozen (every process SIGSTOPped): the same;
* n2 killed, with ``--max-restarts 1``: the job finishes every step on n1
  (2 ranks, the global batch kept), resumed from the newest committed step,
  its loss going on where it was; ``summary.json`` holds the restart;
* the link slowed to 1 Mbit/s for 20 s mid-run, then back: the step caught
  by the change takes tens of healthy steps' time (not sparse's: top-k sends a
  few KB a step), the job finishes (exit 0) and no wait was quiet for the
  timeout. The timeout is the other cases' 10 s, not less: the collective in
  flight when the rate drops loses packets (a 20 ms queue at 1 Mbit/s) and
  TCP's retransmission backoff left up to 5.6 s without a byte on every rank
  (fused over MPI's allreduce; the journal), which a 5 s timeout took for a
  dead link.

And a DeepFreeze save in flight when the link goes down, with
``--max-restarts 1``: the restart finds n2 unreachable and finishes on n1 from
the persistent tier. And SIGTERM to a job hung by the link down, at its mpiexec
or its launcher: it ends within the same bound, nothing left on either node.
``make test`` keeps two cases: ``fused``'s link down and ``host``'s node
killed. Skipped with one line where nodes cannot be made (not root, no ``ip
netns``).
"""

from __future__ import annotations

import os
import signal
import statistics
import threading
import time

import pytest

from research.checkpoint.manifest import committed_steps, read_manifest
from research.comm.faults import watchdog
from research.rundir import read_metrics
from tests.node_faults import (
    Outcome,
    last_step,
    make_cluster,
    remove_cluster,
    run_with_fault,
)

pytestmark = [
    pytest.mark.launches,  # MPI jobs: not in make test-fast
    # One worker: one local cluster (a module fixture).
    pytest.mark.xdist_group("test_node_faults"),
]

NAME = f"w{os.getpid() % 100000}"
TIMEOUT_S = 10.0
#: Seconds from the fault to the job's end beyond the timeout: a tick of the
#: watchdog, the roll call's 3 s, MPI_Abort's grace, mpiexec taking the job
#: down, the launcher's reaping (measured: see the journal).
BOUND_S = 25.0
#: ``make test-faults`` sets it: every case, every strategy.
MATRIX = bool(os.environ.get("RESEARCH_FAULT_TESTS"))
STRATEGIES = ["fused", "host", "solo", "overlap", "sparse"]
#: A case of the matrix only (``make test`` keeps two, by their strategy).
matrix_only = pytest.mark.skipif(not MATRIX, reason="the matrix: make test-faults")


def strategies(kept: str) -> list[str]:
    """Every strategy in the matrix; ``kept`` alone in ``make test``."""
    return STRATEGIES if MATRIX else [kept]


@pytest.fixture(scope="module")
def cluster():
    made, why = make_cluster(NAME)
    if made is None:
        pytest.skip(f"node faults skipped: {why}")
    try:
        yield made
    finally:
        remove_cluster(NAME)


def check_stall(got: Outcome) -> None:
    """Exit 124 with the watchdog's line, in time, nothing left on a node."""
    assert got.code == watchdog.EXIT_CODE, got.out[-4000:]
    assert got.after_fault_s < TIMEOUT_S + BOUND_S, f"{got.after_fault_s:.1f} s"
    assert "comm watchdog: no progress for" in got.out, got.out[-4000:]
    assert "ending the job" in got.out, got.out[-4000:]
    assert all(not pids for pids in got.left.values()), got.left


def check_restart(got: Outcome, *, steps: int, lost: list[str]) -> dict:
    """Finished on the other node after one restart; its record; the loss."""
    assert got.code == 0, got.out[-4000:]
    summary = got.summary()
    assert summary["steps"] == steps and summary["world_size"] == 2, summary
    (rec,) = summary["restarts"]
    assert rec["lost_nodes"] == lost, rec
    assert (rec["world_size_before"], rec["world_size_after"]) == (4, 2), rec
    assert rec["global_batch_before"] == rec["global_batch_after"], rec
    assert 0 < rec["step_resumed"] <= got.fault_step, rec
    assert 0 < rec["seconds_to_first_step"] < 300, rec
    assert all(not pids for pids in got.left.values()), got.left
    # The loss goes on from where it was: from the step resumed from to the
    # next, it moves no more than it moved from step to step before the fault
    # (a run that started over would jump back to its first loss).
    rows = [r for r in read_metrics(got.run_dir) if r.get("kind") != "eval"]
    resumed = rec["step_resumed"]
    attempt1 = rows[: next(i for i, r in enumerate(rows) if r["step"] == resumed) + 1]
    steps_moved = [abs(b["loss"] - a["loss"]) for a, b in zip(attempt1, attempt1[1:])]
    after = rows[max(i for i, r in enumerate(rows) if r["step"] == resumed + 1)]
    jump = abs(after["loss"] - attempt1[-1]["loss"])
    assert jump <= 3 * statistics.median(steps_moved) + 1e-3, (jump, steps_moved)
    return rec


def committed(run_dir) -> bool:
    """A checkpoint is committed in the persistent tier (the restart's start)."""
    return bool(committed_steps(read_manifest(run_dir / "checkpoints")))


@pytest.mark.parametrize("strategy", strategies("fused"))
def test_link_down(cluster, strategy, tmp_path):
    try:
        got = run_with_fault(
            cluster,
            tmp_path / "run",
            lambda: cluster.set_link("n2", False),
            at_step=8,
            args=["--strategy", strategy, "--steps", "1000"],
            comm_timeout=TIMEOUT_S,
        )
    finally:
        cluster.set_link("n2", True)
    check_stall(got)
    assert strategy != "fused" or "fused step" in got.out, got.out[-4000:]


@matrix_only
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_node_frozen(cluster, strategy, tmp_path):
    try:
        got = run_with_fault(
            cluster,
            tmp_path / "run",
            lambda: cluster.signal("n2", signal.SIGSTOP),
            at_step=8,
            args=["--strategy", strategy, "--steps", "1000"],
            comm_timeout=TIMEOUT_S,
        )
    finally:
        cluster.signal("n2", signal.SIGCONT)
    check_stall(got)


@pytest.mark.parametrize("strategy", strategies("host"))
def test_node_killed_restarts_on_the_other(cluster, strategy, tmp_path):
    try:
        got = run_with_fault(
            cluster,
            tmp_path / "run",
            lambda: cluster.kill("n2"),
            at_step=12,
            when=committed,
            args=["--strategy", strategy, "--steps", "30", "--max-restarts", "1"]
            + ["--checkpoint", "deepfreeze", "--checkpoint-every", "5"],
            comm_timeout=TIMEOUT_S,
        )
    finally:
        if not cluster.node("n2").alive():
            cluster.start("n2")
    check_restart(got, steps=30, lost=["n2"])


@matrix_only
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_slow_link_is_not_a_dead_one(cluster, strategy, tmp_path):
    def slow() -> None:
        cluster.set_rate("n2", "1mbit")
        threading.Timer(20.0, cluster.set_rate, ("n2", "1gbit")).start()

    try:
        got = run_with_fault(
            cluster,
            tmp_path / "run",
            slow,
            at_step=6,
            args=["--strategy", strategy, "--steps", "30"],
            comm_timeout=TIMEOUT_S,
        )
    finally:
        time.sleep(0.1)
        cluster.set_rate("n2", "1gbit")
    assert got.code == 0 and "ending the job" not in got.out, got.out[-4000:]
    summary = got.summary()
    assert summary["comm_watchdog"]["longest_quiet_s"] < TIMEOUT_S, summary
    if strategy != "sparse":  # top-k 1% sends a few KB a step: fast even so
        rows = _rows(got.run_dir)
        healthy = statistics.median(
            r["step_time"] for r in rows if 1 < r["step"] <= got.fault_step
        )
        slowed = max(r["step_time"] for r in rows if r["step"] > got.fault_step)
        # The crawling link held a collective up for many healthy steps' time.
        assert slowed > 10 * healthy, (slowed, healthy)


@matrix_only
def test_deepfreeze_save_in_flight_when_the_link_goes_down(cluster, tmp_path):
    run = tmp_path / "run"

    try:
        got = run_with_fault(
            cluster,
            run,
            lambda: cluster.set_link("n2", False),
            at_step=10,
            when=in_flight,
            args=["--strategy", "host", "--steps", "40", "--max-restarts", "1"]
            + ["--checkpoint", "deepfreeze", "--checkpoint-every", "5"],
            comm_timeout=TIMEOUT_S,
        )
    finally:
        cluster.set_link("n2", True)
    rec = check_restart(got, steps=40, lost=["n2"])
    assert rec["cause"] == "comm-timeout", rec
    assert "comm watchdog: no progress" in got.out


@matrix_only
@pytest.mark.parametrize("target", ["mpiexec", "launcher"])
def test_sigterm_to_a_hung_job_leaves_nothing(cluster, target, tmp_path):
    """The issue's second finding: n2's link down, the job hung, then SIGTERM
    to its mpiexec or to the launcher. The ranks cannot stop cleanly (that
    needs a collective); each side's watchdog ends its own ranks at the
    timeout, so the job ends non-zero within the link-down bound and no rank
    or proxy is left on either node (with the default timeout the far side's
    ranks linger up to 180 s: nothing can reach them sooner)."""
    run = tmp_path / "run"

    def hang_then_term() -> None:
        cluster.set_link("n2", False)
        time.sleep(2.0)
        (pid,) = _job_process(run, mpiexec=target == "mpiexec")
        os.kill(pid, signal.SIGTERM)

    try:
        got = run_with_fault(
            cluster,
            run,
            hang_then_term,
            at_step=8,
            args=["--strategy", "fused", "--steps", "1000"],
            comm_timeout=TIMEOUT_S,
        )
    finally:
        cluster.set_link("n2", True)
    assert got.code != 0, got.out[-4000:]
    assert got.after_fault_s < TIMEOUT_S + BOUND_S, f"{got.after_fault_s:.1f} s"
    assert all(not pids for pids in got.left.values()), got.left


def _job_process(run, *, mpiexec: bool) -> list[int]:
    """The job's mpiexec, or its launcher (``python -m experiments.train``
    without PMI_RANK: not a rank), found by ``run`` in their command lines."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                rank = b"PMI_RANK=" in f.read()
        except OSError:
            continue
        if str(run).encode() not in cmd:
            continue
        is_mpiexec = os.path.basename(cmd[0]).startswith(b"mpiexec")
        if is_mpiexec if mpiexec else not (is_mpiexec or rank):
            found.append(int(pid))
    return found


def in_flight(run_dir) -> bool:
    """A step is committed and a later one was requested (every 5 steps) but
    is not committed yet: its DeepFreeze save is in flight."""
    steps = committed_steps(read_manifest(run_dir / "checkpoints"))
    return bool(steps) and max(steps) < last_step(run_dir) // 5 * 5


def _rows(run_dir) -> list[dict]:
    return [r for r in read_metrics(run_dir) if r.get("kind") != "eval"]
