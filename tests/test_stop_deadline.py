"""SIGTERM ends a job whose step never ends, within the stop deadline.

A rank stuck inside a device computation (on a GPU: a kernel or a collective
that never returns) runs no Python signal handler, so it never reaches the
step boundary where the ranks agree to stop; before the deadline, such a job
outlived ``timeout``'s SIGTERM (the first two-rank GPU runs, 2026-11-28). The
job here hangs the same way on the CPU (``tests/hang_driver.py``), with the
watchdog off, and must end with ``128 + SIGTERM`` soon after the deadline.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from research.train.preemption import GRACE_ENV, STOP_EXIT
from tests.harness import ROOT, launcher

pytestmark = pytest.mark.launches  # an MPI job: not in make test-fast

GRACE_S = 5


def test_sigterm_ends_a_job_stuck_in_a_step(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", NPROC="1")
    env.pop("PYTEST_ADDOPTS", None)
    env[GRACE_ENV] = str(GRACE_S)
    cmd = [*launcher(), "-n", "3", sys.executable, "tests/hang_driver.py"]
    proc = subprocess.Popen(
        [*cmd, str(tmp_path / "run"), "2", "3"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        hung = None
        end = time.monotonic() + 240
        for line in proc.stdout:  # until the rank is stuck
            if line.startswith("HUNG"):
                hung = time.monotonic()
                break
            assert time.monotonic() < end, "the job never reached the hang"
        assert hung is not None, proc.stderr.read()[-3000:]
        time.sleep(1.0)  # the others are in their allreduce by now
        proc.send_signal(signal.SIGTERM)  # mpiexec forwards it to every rank
        sent = time.monotonic()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    took = time.monotonic() - sent
    assert proc.returncode == STOP_EXIT["SIGTERM"], err[-3000:]
    assert re.search(r"r\d \| SIGTERM \d+ s ago, and the ranks have not agreed", err)
    # Not a speed check: the deadline, then MPI_Abort; a hang ran into the
    # 120 s limit above.
    assert took < GRACE_S + 60, f"took {took:.0f} s"
