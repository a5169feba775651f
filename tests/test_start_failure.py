"""A rank that fails while the job starts ends the job with its message.

The first two-rank GPU runs (2026-11-28) had an mpi4jax built against another
MPI than mpi4py's: importing it raises "MPI ABI incompatibility detected!".
Here one rank of a real job gets such an mpi4jax (a package earlier on its
PYTHONPATH that raises what mpi4jax's own check raises); the job must end
non-zero, with that rank's message, well before the test's timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.harness import ROOT, launcher

pytestmark = pytest.mark.launches  # an MPI job: not in make test-fast

MESSAGE = "MPI ABI incompatibility detected! (injected by the test)"


def test_a_rank_with_a_broken_mpi4jax_ends_the_job(tmp_path):
    fake = tmp_path / "broken" / "mpi4jax"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"raise RuntimeError({MESSAGE!r})\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", NPROC="1")
    env.pop("PYTEST_ADDOPTS", None)
    args = [
        sys.executable,
        "-m",
        "experiments.train",
        "--steps",
        "5",
        "--no-progress",
        "--run-dir",
        str(tmp_path / "run"),
    ]
    broken = f"{fake.parent}{os.pathsep}{ROOT}"
    # MPMD: rank 0 as usual, rank 1 with the broken mpi4jax first on its path.
    cmd = [*launcher(), "-n", "1", *args, ":", "-n", "1"]
    cmd += ["-env", "PYTHONPATH", broken, *args]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert f"r1 | RuntimeError: {MESSAGE}" in proc.stderr, proc.stderr[-3000:]
