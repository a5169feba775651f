"""``experiments.train --checkpoint``: killed with SIGKILL, run again, same result.

A user's batch job hits its time limit or a node dies: the job is gone at once,
with no clean-up. Running the same command again must resume from the newest
committed checkpoint and end with parameters bit-identical to a run that never
stopped; a run that ends normally leaves nothing of its own in /dev/shm.
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

from research.checkpoint.manifest import committed_steps, read_manifest
from research.checkpoint.tiers import default_fast_root
from tests.harness import node_local_entries, python, run_env
from tests.tiny import RESUME_ARGS

pytestmark = pytest.mark.launches  # MPI jobs: not in make test-fast

ARGS = RESUME_ARGS


def _train(cwd: Path, run_dir: str, *extra: str) -> dict:
    proc = python([*ARGS, "--run-dir", run_dir, *extra], cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((cwd / run_dir / "summary.json").read_text())


def _committed(run: Path) -> list[int]:
    return committed_steps(read_manifest(run / "checkpoints"))


def _shm() -> set[str]:
    return node_local_entries()


def test_kill_9_then_same_command_resumes_bit_identically(tmp_path):
    shm_before = _shm()
    reference = _train(tmp_path, "ref")
    assert reference["resumed_from"] is None and reference["steps"] == 60

    run = tmp_path / "run"
    job = subprocess.Popen(
        [sys.executable, *ARGS, "--run-dir", "run"],
        cwd=tmp_path,
        env=run_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: mpiexec, ranks, writers
    )
    deadline = time.monotonic() + 240
    while not _committed(run) and job.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint committed in 240 s"
        time.sleep(0.02)
    assert job.poll() is None, "the job ended before it could be killed"
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    killed_at = max(_committed(run))
    assert 0 < killed_at < 60

    resumed = _train(tmp_path, "run")
    assert resumed["resumed_from"] is not None
    assert killed_at <= resumed["resumed_from"] < 60
    assert resumed["steps"] == 60
    assert resumed["params_sha256"] == reference["params_sha256"]

    # Normal ends remove their fast tiers and transfer files (the killed run's
    # leftovers were taken over and removed by the run that resumed).
    for name in ("ref", "run"):
        assert not default_fast_root(tmp_path / name / "checkpoints").exists()
    assert _shm() - shm_before == set()


def test_longer_run_continues_where_the_last_one_ended(tmp_path):
    first = _train(tmp_path, "run", "--steps", "20")
    again = _train(tmp_path, "run", "--steps", "30")
    assert first["steps"] == 20 and again["resumed_from"] == 20
    assert again["steps"] == 30
    rows = [
        json.loads(line)
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows if r.get("kind") != "eval"][-1] == 30
    fresh = _train(tmp_path, "run", "--steps", "10", "--no-resume")
    assert fresh["resumed_from"] is None and fresh["steps"] == 10
