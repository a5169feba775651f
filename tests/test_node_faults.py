"""Network faults on local nodes: the two cases ``make test`` keeps (issue 30).

2 nodes x 2 ranks on a 1 Gb/s shaped link (``research/localnet.py``), the job
started as a user starts it: ``python -m experiments.train --hosts n1,n2 --np
4``. The link of n2 goes down mid-run under ``fused``: the job ends with exit
124 and the watchdog's line within the timeout and :data:`BOUND_S`, leaving no
process on either node. n2 is killed mid-run under ``host`` with
``--max-restarts 1``: the job finishes every step on n1, resumed from the
newest committed step with its loss going on, the restart in
``summary.json``. The whole matrix (every strategy, a frozen node, a slow
link, a DeepFreeze save in flight) is ``make test-faults``
(``tests/faults/test_nodes.py``). Skipped with one line where nodes cannot be
made (not root, no ``ip netns``).
"""

from __future__ import annotations

import os
import statistics

import pytest

from research.checkpoint.manifest import committed_steps, read_manifest
from research.comm import watchdog
from research.rundir import read_metrics
from tests.node_faults import Outcome, make_cluster, remove_cluster, run_with_fault

pytestmark = [
    pytest.mark.launches,  # MPI jobs: not in make test-fast
    # One worker: one local cluster (a module fixture).
    pytest.mark.xdist_group("test_node_faults"),
]

NAME = f"w{os.getpid() % 100000}"
TIMEOUT_S = 10.0
#: Seconds from the fault to the job's end beyond the timeout: a tick of the
#: watchdog, the roll call's 3 s, MPI_Abort's grace, mpiexec taking the job
#: down, the launcher's reaping (measured: see the journal, 2026-11-26).
BOUND_S = 25.0


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


def test_link_down_ends_the_job(cluster, tmp_path):
    try:
        got = run_with_fault(
            cluster,
            tmp_path / "run",
            lambda: cluster.set_link("n2", False),
            at_step=8,
            args=["--strategy", "fused", "--steps", "1000"],
            comm_timeout=TIMEOUT_S,
        )
    finally:
        cluster.set_link("n2", True)
    check_stall(got)
    assert "fused step" in got.out, got.out[-4000:]


def test_node_killed_costs_a_restart(cluster, tmp_path):
    try:
        got = run_with_fault(
            cluster,
            tmp_path / "run",
            lambda: cluster.kill("n2"),
            at_step=12,
            when=committed,
            args=["--strategy", "host", "--steps", "30", "--max-restarts", "1"]
            + ["--checkpoint", "deepfreeze", "--checkpoint-every", "5"],
            comm_timeout=TIMEOUT_S,
        )
    finally:
        if not cluster.node("n2").alive():
            cluster.start("n2")
    check_restart(got, steps=30, lost=["n2"])
