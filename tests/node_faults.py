"""Faults on the nodes of a local cluster, for the fault tests (issue 30).

A job is ``python -m experiments.train --hosts n1,n2 --np 4`` on a cluster of 2
nodes x 2 ranks (``research/localnet.py``), started from the root namespace as
a user would (mpiexec then runs on n1). :func:`run_with_fault` waits for the
job to log a given step (or commit a checkpoint), injects the fault with the
cluster's own calls (the link down, every process of a node stopped, a node
killed, the link's rate changed), waits for the job's end and returns what
happened: the exit code, the seconds from the fault to the end, the output, the
processes left on each node and the run folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.harness import COMPILE_CACHE_ENV, ROOT, XLA_TEST_FLAGS, run_env
from tests.tiny import tiny_train


@dataclasses.dataclass
class Outcome:
    code: int
    after_fault_s: float
    out: str
    left: dict[str, list[int]]
    run_dir: Path
    fault_step: int  # the last step the job logged once the fault was made

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())


def env_for(cluster) -> dict[str, str]:
    env = run_env(
        XLA_FLAGS=XLA_TEST_FLAGS,
        NPROC="1",
        RESEARCH_SPARSE_COST=f"/nonexistent/research-sparse-cost-{os.getuid()}.json",
        **COMPILE_CACHE_ENV,
    )
    # A worker's own /dev/shm folder (tests/conftest.py) is not on the nodes:
    # each has its own /dev/shm. Nor the outer pytest's options (the ranks').
    for var in ("RESEARCH_SHM_DIR", "PYTEST_ADDOPTS"):
        env.pop(var, None)
    env.update(cluster.env())
    return env


def last_step(run_dir: Path) -> int:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("kind") != "eval":
            return int(row["step"])
    return 0


def run_with_fault(
    cluster,
    run_dir: Path,
    fault: Callable[[], None],
    *,
    at_step: int,
    args: list[str],
    when: Callable[[Path], bool] | None = None,
    comm_timeout: float = 10.0,
    timeout: float = 420,
) -> Outcome:
    """Run the job, call ``fault()`` once it reached ``at_step`` (and ``when``,
    if given, holds), wait for its end."""
    cmd = [sys.executable, *tiny_train("--hosts", "n1,n2", np=4, n_train=4096)]
    cmd += ["--log-every", "1", "--run-dir", str(run_dir), *args]
    cmd += ["--comm-timeout", str(comm_timeout)]
    job = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env_for(cluster),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + timeout
    try:
        while last_step(run_dir) < at_step or (when and not when(run_dir)):
            if job.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"the job did not reach step {at_step} (exit {job.poll()}):\n"
                    + (job.stdout.read() if job.poll() is not None else "")[-4000:]
                )
            time.sleep(0.05)
        t0 = time.time()
        fault()
        step = _settled_step(run_dir)
        out, _ = job.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if job.poll() is None:
            os.kill(job.pid, signal.SIGKILL)
            job.wait()
    took = time.time() - t0
    left = {h: _job_pids(cluster, h) for h in cluster.hosts() if _up(cluster, h)}
    if os.environ.get("RESEARCH_FAULT_LOG"):  # the journal's measured bounds
        with open(os.environ["RESEARCH_FAULT_LOG"], "a") as f:
            rec = {"args": args, "step": step, "code": job.returncode, "fault_at": t0}
            rec.update(after_fault_s=round(took, 2), left=left)
            try:  # a restart's record: seconds from the failure to training
                summary = json.loads((run_dir / "summary.json").read_text())
                rec["restarts"] = summary.get("restarts")
            except (OSError, ValueError):
                pass
            f.write(json.dumps(rec) + "\n")
    return Outcome(job.returncode, took, out, left, run_dir, step)


def _settled_step(run_dir: Path, quiet_s: float = 1.0) -> int:
    """The last step the job logs once the fault is made: the step read
    before it is not a bound, since killing a node (listing its processes,
    signalling them) took long enough under load for the job to finish two
    more steps and commit a checkpoint. After the fault no step completes past
    the one in flight; its row may still be on its way, so this waits until
    the count is still for ``quiet_s``."""
    step, since = last_step(run_dir), time.monotonic()
    while time.monotonic() - since < quiet_s:
        time.sleep(0.05)
        if (now := last_step(run_dir)) != step:
            step, since = now, time.monotonic()
    return step


def _up(cluster, host: str) -> bool:
    return cluster.node(host).alive()


def _job_pids(cluster, host: str) -> list[int]:
    """Processes on ``host`` other than its holder, after a moment for the
    kernel to reap what was just killed."""
    for _ in range(50):
        pids = cluster.pids(host)
        if not pids:
            return []
        time.sleep(0.1)
    return pids


def make_cluster(name: str, rate: str = "1gbit"):
    """A 2-node cluster, or a skip reason (one line) where none can be made."""
    from research.localnet import LocalnetError, check_can_run, up

    try:
        check_can_run()
    except LocalnetError as e:
        return None, str(e)
    return up(2, rate=rate, name=name), None


def remove_cluster(name: str) -> None:
    from research.localnet import down

    down(name)
    netns = subprocess.run(["ip", "netns"], capture_output=True, text=True).stdout
    assert f"{name}-n" not in netns
