"""The suite's own node-local folders (tests/conftest.py): a pytest run that
ends removes its workers' /dev/shm folders and those of runs that were killed,
never those of a run still going beside it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm here")
def test_a_run_ending_leaves_the_folders_of_a_run_beside_it():
    uid = os.getuid()
    # A run still going (this process is its controller) and a killed one.
    alive = Path(f"/dev/shm/pytest-{uid}-{os.getpid()}-gw7")
    dead = Path(f"/dev/shm/pytest-{uid}-{_dead_pid()}-gw7")
    for folder in (alive, dead):
        folder.mkdir(mode=0o700)
        (folder / "shard").write_text("x")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTEST_XDIST_WORKER", "RESEARCH_TEST_RUN", "PYTEST_ADDOPTS")
    }
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
            + ["tests/test_rundir.py"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert (alive / "shard").exists(), "a live run's folder was removed"
        assert not dead.exists(), proc.stdout[-3000:]
        assert f"tests left node-local files in {dead}" in proc.stdout
    finally:
        for folder in (alive, dead):
            if folder.exists():
                (folder / "shard").unlink(missing_ok=True)
                folder.rmdir()
