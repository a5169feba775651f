"""A DeepFreeze writer process killed mid-run: the job ends, the same command resumes.

The writer is a helper process of each rank (``research.checkpoint.writer``);
the OOM killer or an operator may end it alone. Its rank then fails (the job
ends non-zero, no rank left hanging) and running the same command again
restores the last step committed before the failure.
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
from tests.harness import python, run_env
from tests.tiny import RESUME_ARGS as ARGS

pytestmark = pytest.mark.launches  # MPI jobs: not in make test-fast

LIMIT_S = 300


def _committed(run: Path) -> list[int]:
    return _committed_in(run / "checkpoints")


def _committed_in(tier: Path) -> list[int]:
    return committed_steps(read_manifest(tier))


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _writers(root: int) -> list[int]:
    """Writer processes descending from process ``root`` (the job)."""
    pids = []
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"research.checkpoint.writer" not in cmd:
                continue
            p = pid
            while p > 1 and p != root:
                p = _parent(p)
            if p == root:
                pids.append(pid)
        except (OSError, ValueError, IndexError):  # ended meanwhile
            continue
    return pids


def test_killed_writer_ends_the_job_and_the_same_command_resumes(tmp_path):
    run = tmp_path / "run"
    args = [*ARGS, "--run-dir", "run"]
    job = subprocess.Popen(
        [sys.executable, *args],
        cwd=tmp_path,
        env=run_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + LIMIT_S
    while not (_committed(run) and _writers(job.pid)):
        assert job.poll() is None, job.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint committed"
        time.sleep(0.05)
    os.kill(_writers(job.pid)[0], signal.SIGKILL)
    try:
        out, _ = job.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        raise AssertionError("the job outlived its killed writer") from None
    # Checkpoints every 5 of 60 steps, killed at the first: later saves need it.
    assert job.returncode != 0, out[-3000:]
    assert "checkpoint writer process ended" in out, out[-3000:]
    # The newest step committed in either tier (the node-local fast tier may
    # hold one not yet flushed to the persistent tier).
    fast = default_fast_root(run / "checkpoints")
    last = max(_committed(run) + (_committed_in(fast) if fast.exists() else []))

    again = python(args, cwd=tmp_path, timeout=LIMIT_S)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from"] == last
    assert summary["steps"] == 60
    # The killed run's fast tier was taken over and removed by the resumed run.
    assert not default_fast_root(run / "checkpoints").exists()
