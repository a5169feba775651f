"""One failing rank ends the whole job, in every phase, with tracing on.

Each case runs a real MPI job (``tests/fail_driver.py``) in which one rank of 3
fails at one step in one phase (data loading, the jitted step, the
partial collective on the progress thread, a callback, DeepFreeze's background
thread, its writer process, evaluation, writing the run folder). The job must
exit non-zero well before the launch's own timeout (a hang runs into it), with
the failing rank's traceback printed once; before the fix, a failure with
tracing on hung in the tracer's closing barrier until killed.

Three ranks, not two and four as until 2026-11-27: the failing rank is the last
(rank 0 for the run folder, which only it writes), so two others must be taken
down, one of them not rank 0, at a rank count that is not a power of two; that
is what the 2- and the 4-rank jobs asked between them, in half the launches.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import pytest

from research.checkpoint.deepfreeze import remove_stale_transfer_files
from research.checkpoint.integrity import remove_tree
from research.checkpoint.tiers import default_fast_root
from research.entry.launch import _mapped_shm_files
from tests.fail_driver import PHASES
from tests.harness import run_under_mpiexec

pytestmark = pytest.mark.launches  # MPI jobs: not in make test-fast

FAIL_STEP = 4  # even: DeepFreeze checkpoints every 2 steps in the driver


@pytest.mark.parametrize("np_", [3])
@pytest.mark.parametrize("phase", PHASES)
def test_one_failing_rank_ends_the_job(phase, np_, tmp_path):
    rank = 0 if phase == "rundir" else np_ - 1  # only rank 0 writes the run folder
    shm_before = _shm()
    job = uuid.uuid4().hex  # marks this job's processes, its writers' too
    proc = run_under_mpiexec(
        np_,
        ["tests/fail_driver.py", str(tmp_path / "run"), phase, str(rank), "4"],
        timeout=240,
        env_extra={JOB_ENV: job},
    )
    end = time.time()
    # A killed run leaves its fast tier for the next run of the same folder to
    # take over; this one has no next run. Its writer processes die with their
    # ranks (PDEATHSIG) but may still be creating a folder for a moment.
    _wait_for_job_gone(job)
    remove_tree(default_fast_root(tmp_path / "run" / "checkpoints"))
    remove_stale_transfer_files()  # the killed ranks' (their pids are gone)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    stamps = re.findall(r"INJECTED (\d+\.\d+)", proc.stdout)
    assert len(stamps) == 1, out[-4000:]
    # Not a speed check: the abort takes a few seconds on a quiet machine and
    # more under load; a job that hangs instead runs into the 240 s timeout.
    assert end - float(stamps[0]) < 120, f"took {end - float(stamps[0]):.0f} s"
    # Every rank that reports says who it is, once.
    reports = re.findall(r"r(\d+) \| uncaught exception", proc.stderr)
    assert reports and len(reports) == len(set(reports)), out[-4000:]
    if phase != "writer":
        assert reports == [str(rank)], out[-4000:]
        assert f"injected failure on rank {rank} in phase {phase}" in proc.stderr
    else:  # the commit round tells every rank; whichever raises first aborts
        assert (
            f"rank {rank}: RuntimeError: checkpoint writer process ended"
            in (proc.stderr)
            or f"rank {rank}: BrokenPipeError" in proc.stderr
        ), out[-4000:]
    # The aborting rank unlinked MPICH's shared-memory file of the node (files
    # that live processes map belong to other jobs running meanwhile).
    left = {n for n in _shm() - shm_before if n.startswith("mpich_shm_")}
    assert left - _mapped_shm_files() == set()


#: Set in the job's environment: its ranks and their writer processes carry it.
JOB_ENV = "RESEARCH_TEST_JOB"


def _job_pids(job: str) -> list[int]:
    """Processes whose environment holds this job's mark (ours only: others'
    environments are not readable, and other jobs have other marks)."""
    mark = f"{JOB_ENV}={job}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:  # gone meanwhile, or not ours
                continue
    return pids


def _wait_for_job_gone(job: str, timeout: float = 10.0) -> None:
    """Until no process of this job is left (writers exit with their rank)."""
    end = time.monotonic() + timeout
    while _job_pids(job) and time.monotonic() < end:
        time.sleep(0.05)


def _shm() -> set[str]:
    shm = Path("/dev/shm")
    return {p.name for p in shm.iterdir()} if shm.is_dir() else set()
