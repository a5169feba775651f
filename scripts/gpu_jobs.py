"""The GPU check's jobs: a run folder, a clock with a deadline, and processes
that are ended, their process groups with them, when the deadline comes.

``scripts.gpu_check`` runs its stages through a :class:`Check`: each job in
its own process group, its output in ``logs/<name>.log``, cut where the lent
machine's minutes would run out, so that nothing is left holding the GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: Each job's limit; a job past it is ended (SIGTERM, then SIGKILL).
JOB_TIMEOUT_S = 240


class Check:
    """The run folder, the clock and the log of one check."""

    def __init__(self, root: Path, args: argparse.Namespace) -> None:
        self.root = root
        self.args = args
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.deadline_s
        self.results: dict[str, Any] = {"skipped": [], "cut": []}

    def say(self, text: str) -> None:
        print(f"gpu_check [{time.monotonic() - self.t0:5.0f} s] {text}", flush=True)

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p
        )
        for var in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK"):
            env.pop(var, None)
        env.update(extra)
        return env

    def left(self, timeout: float = JOB_TIMEOUT_S) -> float:
        """Seconds a job starting now may take: ``timeout`` or less, to the
        deadline."""
        return min(timeout, self.deadline - time.monotonic())

    def start(self, name: str, cmd: list[str], **env) -> subprocess.Popen:
        """Start ``cmd`` in its own process group, output to ``logs/<name>.log``."""
        log = self.root / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as out:
            return subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=self.env(**env),
                stdout=out,
                stderr=out,
                start_new_session=True,
            )

    def run(self, name: str, cmd: list[str], timeout: float = JOB_TIMEOUT_S, **env):
        """Run ``cmd`` (its output to ``logs/<name>.log``); ``(rc, seconds)``;
        rc None where the deadline came before it could start."""
        limit = self.left(timeout)
        if limit < 10:
            self.results["cut"].append(name)
            return None, 0.0
        t = time.monotonic()
        proc = self.start(name, cmd, **env)
        try:
            rc = proc.wait(limit)
        except subprocess.TimeoutExpired:
            if limit < timeout:
                self.results["cut"].append(name)
            rc = end_job(proc)
        return rc, time.monotonic() - t


def end_job(proc: subprocess.Popen, grace: float = 20.0, group: bool = True) -> int:
    """SIGTERM to ``proc``'s process group (``group``) or to ``proc`` alone (as a
    scheduler signals a job's launcher), then SIGKILL to the group after
    ``grace``: the exit code, or -9. The group's other processes (mpiexec, the
    ranks) go with it, so that nothing is left holding the GPU."""
    if group:
        _signal_group(proc, signal.SIGTERM)
    else:
        proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(grace)
    except subprocess.TimeoutExpired:
        rc = -9
    _signal_group(proc, signal.SIGKILL)
    proc.wait()
    return rc


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def python_cmd(*args: str) -> list[str]:
    return [sys.executable, *args]


def gpu_names() -> list[str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version"]
            + ["--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
