"""Runs every tests/mpi/test_*.py file under a real ``mpiexec`` with 2 and 4 ranks.

Each rank runs pytest on the file; the job passes only if every rank passes. XLA
is pinned to one intra-op thread per rank so 4 ranks on 2 cores don't fight.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parent
# Ranks and runs compile the same programs: a persistent cache shared by every
# process of the suite turns most compiles after the first into a disk read.
COMPILE_CACHE_ENV = {
    "JAX_COMPILATION_CACHE_DIR": os.environ.get(
        "JAX_COMPILATION_CACHE_DIR", f"/tmp/research-jax-cache-{os.getuid()}"
    ),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}
FILES = sorted(p.name for p in (HERE / "mpi").glob("test_*.py"))


def mpiexec() -> str:
    exe = Path(sys.executable).parent / "mpiexec"
    return str(exe) if exe.exists() else "mpiexec"


def launcher() -> list[str]:
    """The launch command: ``RESEARCH_MPIEXEC`` when set (``make test-site-mpi``
    sets ``mpirun --allow-run-as-root --oversubscribe``, Open MPI's), else
    :func:`mpiexec`. Either takes ``-n N`` next."""
    custom = os.environ.get("RESEARCH_MPIEXEC", "").strip()
    return shlex.split(custom) if custom else [mpiexec()]


def run_under_mpiexec(
    np_: int, args: list[str], timeout: float = 300, env_extra: dict | None = None
) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update(
        RESEARCH_UNDER_MPI="1",
        XLA_FLAGS="--xla_cpu_multi_thread_eigen=false",
        NPROC="1",  # XLA:CPU's intra-op pool: one thread per rank
        # sparse_allreduce(auto) uses its documented defaults, not whatever
        # calibration this machine's user cache holds.
        RESEARCH_SPARSE_COST=f"/nonexistent/research-sparse-cost-{os.getuid()}.json",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=str(ROOT),
    )
    env.update(COMPILE_CACHE_ENV)
    env.update(env_extra or {})
    cmd = [*launcher(), "-n", str(np_), sys.executable, *args]
    return subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("np_", [2, 4])
@pytest.mark.parametrize("name", FILES)
def test_under_mpiexec(name: str, np_: int) -> None:
    proc = run_under_mpiexec(np_, ["-m", "pytest", f"tests/mpi/{name}", "-x"])
    if proc.returncode != 0:
        pytest.fail(
            f"mpiexec -n {np_} pytest tests/mpi/{name} exited "
            f"{proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n"
            f"--- stderr\n{proc.stderr[-6000:]}"
        )
