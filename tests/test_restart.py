"""``--max-restarts``: a rank lost mid-run costs a restart, not the run; a killed
launcher leaves nothing behind.

On one machine there are no nodes to lose: a rank killed with SIGKILL stands for
a lost node, and the restart relaunches at the same ``--np`` (with ``--hosts``
the lost node is dropped: the local-nodes tier, ``make test-faults``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from research.checkpoint.integrity import remove_tree
from research.checkpoint.manifest import committed_steps, read_manifest
from research.checkpoint.tiers import default_fast_root
from research.rundir import read_metrics
from tests.harness import ROOT, run_env
from tests.tiny import tiny_train

STEPS = 40
ARGS = tiny_train(
    "--steps", str(STEPS), "--checkpoint", "deepfreeze", "--checkpoint-every", "5"
)  # fmt: skip
#: Seconds from a SIGKILL of the launcher until none of its job's processes
#: is left (measured 1-3 s here: mpiexec dies with the launcher, its proxy and
#: ranks with it, writers with their ranks).
LEFT_BEHIND_BOUND_S = 15.0


def _start(run: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, *ARGS, "--run-dir", str(run), *extra],
        cwd=ROOT,
        env=run_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _committed(run: Path) -> list[int]:
    return committed_steps(read_manifest(run / "checkpoints"))


def _wait_for_commit(job: subprocess.Popen, run: Path) -> int:
    deadline = time.monotonic() + 240
    while not _committed(run):
        assert job.poll() is None, job.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint committed in 240 s"
        time.sleep(0.05)
    return max(_committed(run))


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` now (children of children...)."""
    children: dict[int, list[int]] = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(p))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _ranks(job: subprocess.Popen) -> list[int]:
    """The ranks: ``python -m experiments.train`` below the launcher."""
    found = []
    for pid in descendants(job.pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if b"python" in cmd[0] and cmd[1:3] == [b"-m", b"experiments.train"]:
            found.append(pid)  # not mpiexec, whose command names it too
    return found


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] != "Z":
                    out.append(pid)
        except OSError:
            continue
    return out


@pytest.mark.launches
def test_a_killed_rank_costs_one_restart(tmp_path):
    """Rank 1 is killed with SIGKILL after a checkpoint: the launcher relaunches
    the job once, it resumes from the newest committed step and finishes every
    step; summary.json and restarts.json say what happened and what it cost."""
    run = tmp_path / "run"
    job = _start(run, "--max-restarts", "1")
    committed = _wait_for_commit(job, run)
    ranks = _ranks(job)
    assert len(ranks) == 2, ranks
    victim = max(ranks)  # started second: rank 1 as a rule; either will do
    os.kill(victim, signal.SIGKILL)
    out, _ = job.communicate(timeout=300)
    assert job.returncode == 0, out[-4000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["world_size"] == 2
    (rec,) = summary["restarts"]
    assert rec["restart"] == 1 and rec["cause"] == "exit", rec
    assert rec["world_size_before"] == rec["world_size_after"] == 2
    assert rec["lost_nodes"] == []
    assert committed <= rec["step_resumed"] < STEPS, rec
    assert 0 < rec["seconds_to_first_step"] < 240, rec
    assert json.loads((run / "restarts.json").read_text()) == summary["restarts"]
    assert "restart 1 after exit" in out, out[-4000:]
    assert f"resuming from step {rec['step_resumed']}" in out, out[-4000:]
    # The loss curve goes on: every tenth step logged, and a step logged by
    # both attempts (the same world resumes bit for bit) has the same loss.
    rows = [r for r in read_metrics(run) if r.get("kind") != "eval"]
    assert rows[-1]["step"] == STEPS
    assert set(range(10, STEPS + 1, 10)) <= {r["step"] for r in rows}
    seen: dict[int, float] = {}
    for r in rows:
        if r["step"] in seen:
            assert abs(seen[r["step"]] - r["loss"]) < 1e-6, (r, seen[r["step"]])
        seen[r["step"]] = r["loss"]


@pytest.mark.launches
def test_a_killed_launcher_leaves_nothing_behind(tmp_path):
    """SIGKILL to ``python -m experiments.train`` (no handler can run): its
    mpiexec dies with it (PDEATHSIG), the proxy and the ranks with mpiexec,
    the checkpoint writers with their ranks."""
    run = tmp_path / "run"
    job = _start(run, "--steps", "400")
    _wait_for_commit(job, run)
    below = descendants(job.pid)
    assert len(_ranks(job)) == 2 and len(below) >= 4, below
    t0 = time.monotonic()
    job.kill()
    job.wait()
    while _alive(below) and time.monotonic() - t0 < LEFT_BEHIND_BOUND_S:
        time.sleep(0.05)
    took = time.monotonic() - t0
    # The killed job's fast tier stays in /dev/shm by design (the same command
    # resumes from it); this one is never resumed, so the test frees it.
    remove_tree(default_fast_root(run / "checkpoints"))
    assert not _alive(below), f"left after {took:.1f} s: {_alive(below)}"


@pytest.mark.launches
def test_a_restart_without_a_checkpoint_starts_over_and_is_on_the_timeline(tmp_path):
    """No checkpoint committed (none asked for): the restart starts from step 0
    and says so; the timeline of the restarted run marks the restart."""
    run = tmp_path / "run"
    cut = ARGS.index("--checkpoint")  # --checkpoint deepfreeze --checkpoint-every 5
    args = ARGS[:cut] + ARGS[cut + 4 :]
    job = subprocess.Popen(
        [sys.executable, *args, "--run-dir", str(run), "--max-restarts", "1"]
        + ["--trace"],
        cwd=ROOT,
        env=run_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 240
    while not [r for r in _metrics(run) if r["step"] >= 10]:
        assert job.poll() is None, job.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "no step 10 in 240 s"
        time.sleep(0.05)
    os.kill(max(_ranks(job)), signal.SIGKILL)
    out, _ = job.communicate(timeout=300)
    assert job.returncode == 0, out[-4000:]
    assert "no committed checkpoint: starting over from step 0" in out, out[-4000:]
    summary = json.loads((run / "summary.json").read_text())
    (rec,) = summary["restarts"]
    assert rec["step_resumed"] == 0 and summary["steps"] == STEPS, rec
    assert 0 < rec["seconds_to_first_step"] < 240, rec
    events = json.loads((run / "trace.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    marks = [e for e in events if e.get("cat") == "restart"]
    assert marks and marks[0]["name"] == "restart 1", marks
    assert marks[0]["args"]["step_resumed"] == 0, marks[0]


def _metrics(run: Path) -> list[dict]:
    return [r for r in read_metrics(run) if r.get("kind") != "eval"]


def test_the_batch_templates_call_records_and_resizes(tmp_path, capsys):
    """``python -m research.entry.restart after-failure ... -- FLAGS`` as
    scripts/slurm.sbatch calls it between attempts (its options before ``--``,
    the job's flags after): one node of two lost, the global batch kept."""
    from research.entry.restart import main

    run = tmp_path / "run"
    argv = ["after-failure", "--attempt", "0", "--exit-code", "137",
            "--np-before", "4", "--np-after", "2", "--lost", "n2",
            "--", *ARGS[4:], "--run-dir", str(run)]  # fmt: skip
    main(argv)  # the first attempt never wrote its config: nothing to resize
    assert capsys.readouterr().out.split() == []
    assert not (run / "restarts.json").exists()
    # What the first attempt's rank 0 wrote (research.train.report): the same
    # command line's resolved config; the experiment is not imported again.
    run.mkdir()
    first = {"batch_size": 16, "lr": 0.05, "scale_lr": False, "steps": STEPS}
    (run / "config.json").write_text(json.dumps({"config": first}))
    main(argv)
    assert capsys.readouterr().out.split() == ["--batch-size", "32", "--lr", "0.05"]
    (rec,) = json.loads((run / "restarts.json").read_text())
    assert rec["lost_nodes"] == ["n2"] and rec["exit_code"] == 137, rec
    assert rec["global_batch_before"] == rec["global_batch_after"] == 64, rec
