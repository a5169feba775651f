"""Entry-point plumbing shared by every ``python -m experiments.NAME``.

* Started without a launcher, an experiment relaunches itself under the
  environment's ``mpiexec`` with ``--np`` ranks; under mpiexec, srun or a PBS job it
  uses the world it is given.
* Bad input gets one clear line and exit code 2, printed by one process only.
* XLA threads per rank are set before JAX creates its CPU client.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from research.comm.env import env_rank, launched_by_mpi

USAGE_EXIT = 2


class UsageError(Exception):
    """Bad command-line input: reported as one line with exit code 2."""


def fail_usage(prog: str, message: str) -> None:
    """Print ``prog: error: message`` once (rank 0) and exit 2 on every rank."""
    if env_rank() == 0:
        print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(USAGE_EXIT)


def mpiexec_path() -> str:
    """The ``mpiexec`` of this environment (the mpich wheel's), else the PATH's."""
    local = Path(sys.executable).parent / "mpiexec"
    if local.exists():
        return str(local)
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found is None:
        raise UsageError(
            "no mpiexec found: run `make run` once, or put mpiexec on PATH"
        )
    return found


def xla_thread_flags(threads: int) -> str:
    """XLA_FLAGS giving each rank ``threads`` intra-op threads (0: XLA's default)."""
    if threads <= 0:
        return os.environ.get("XLA_FLAGS", "")
    flags = [
        f
        for f in os.environ.get("XLA_FLAGS", "").split()
        if not f.startswith(
            ("--xla_cpu_multi_thread_eigen", "intra_op_parallelism_threads")
        )
    ]
    if threads == 1:
        flags += [
            "--xla_cpu_multi_thread_eigen=false",
            "intra_op_parallelism_threads=1",
        ]
    else:
        flags += [f"intra_op_parallelism_threads={threads}"]
    return " ".join(flags)


def set_threads(threads: int) -> None:
    """Apply :func:`xla_thread_flags` to this process (before any JAX computation)."""
    os.environ["XLA_FLAGS"] = xla_thread_flags(threads)
    if threads > 0:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)


def relaunch(module: str, argv: list[str], np_: int, threads: int = 1) -> int:
    """Run ``python -m module argv`` under ``mpiexec -n np_`` and return its exit code.

    Rank output streams straight through. Ctrl-C stops the whole job.
    """
    env = dict(os.environ)
    env["XLA_FLAGS"] = xla_thread_flags(threads)
    env.setdefault("PYTHONUNBUFFERED", "1")
    cmd = [mpiexec_path(), "-n", str(np_), sys.executable, "-m", module, *argv]
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 130


def maybe_relaunch(module: str, argv: list[str], np_: int, threads: int = 1) -> None:
    """Relaunch under mpiexec unless already launched by MPI; exits when it does."""
    if launched_by_mpi() or np_ <= 0:
        return
    try:
        code = relaunch(module, argv, np_, threads)
    except UsageError as e:
        print(f"{module}: error: {e}", file=sys.stderr)
        code = USAGE_EXIT
    raise SystemExit(code)
