"""The suite's harness: how tests start processes, MPI jobs among them.

Every test that starts a process imports it from here, never from another
test module: :func:`run_env` and :func:`python` (a plain process, as a user
would start it), :func:`launcher` and :func:`run_under_mpiexec` (an MPI job),
the XLA flags every process of the suite runs with (:data:`XLA_TEST_FLAGS`,
:data:`XLA_MPI_TEST_FLAGS`) and the compile cache they share; and the few
things tests ask of this machine (:func:`local_user`, :func:`node_local_entries`,
:func:`processes_naming`, :func:`until`). ``tests/conftest.py`` applies the
environment; ``tests/test_mpi.py`` runs tests/mpi's files under mpiexec.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

#: The checkout: the working folder and import path of the processes tests start.
ROOT = Path(__file__).resolve().parent.parent
#: The files run under mpiexec (``tests/test_mpi.py`` groups them by rank count).
MPI_FILES = sorted(p.name for p in (ROOT / "tests" / "mpi").glob("test_*.py"))
# Ranks and runs compile the same programs: a persistent cache shared by every
# process of the suite turns most compiles after the first into a disk read.
COMPILE_CACHE_ENV = {
    "JAX_COMPILATION_CACHE_DIR": os.environ.get(
        "JAX_COMPILATION_CACHE_DIR", f"/tmp/research-jax-cache-{os.getuid()}"
    ),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}
#: XLA for every process the suite starts: one intra-op thread per process
#: (ranks oversubscribe 2 cores), and LLVM at -O1. The suite's processes both
#: compile (models' gradients in the test's own process) and train (the
#: experiments it runs): -O0 compiled no faster than -O1 and its steps ran
#: slower, XLA's default compiled slower and ran no faster. test_stages,
#: test_conv and the scalability smoke test, CPU-s from an empty compile cache
#: / a warm one: -O0 144 / 69, -O1 141 / 51, default 153 / 61 (bench lock,
#: 2026-11-27). One level for every process that trains: a test compares their
#: numbers with its own bit for bit.
_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false"
#: And XLA:CPU's older elemental emitters instead of its MLIR fusion emitters,
#: which took most of a small program's compile time: from an empty cache
#: ResNet-tiny's gradient compiled in 1.2 CPU-s instead of 2.0 at -O1 (0.5
#: instead of 1.5 at -O0), 80 one-op programs in 0.6 instead of 1.4 (-O0), and
#: tests/mpi/test_dense's 120-leaf average in 0.5 instead of 1.3 (-O0). At -O1
#: the small CNN's, VGG-tiny's and P1B2's steps ran as fast, the ResNets' 7%
#: (tiny) and 16% (ResNet-50) slower (bench lock, 2026-11-27).
_COMPILE_FAST = "--xla_cpu_use_fusion_emitters=false"
XLA_TEST_FLAGS = f"{_ONE_THREAD} {_COMPILE_FAST} --xla_backend_optimization_level=1"
#: tests/mpi's ranks (``tests/test_mpi.py``): many small programs, each
#: compiled once and run briefly, so compiling is what costs and LLVM -O0 pays.
#: Never for a job whose numbers a test compares with its own process's: the
#: two levels round differently (a checkpoint of a 4-rank job differed from the
#: same state computed in the test in the last bit). From an empty compile cache
#: the 2-rank run took 161 CPU-s instead of 212 at -O1 (83 both from a warm one).
XLA_MPI_TEST_FLAGS = f"{_ONE_THREAD} {_COMPILE_FAST} --xla_backend_optimization_level=0"
#: What marks a process as one of an MPI job's ranks: a process a test starts
#: outside mpiexec drops them, or it would take itself for a rank.
MPI_JOB_VARS = (
    "PMI_RANK",
    "PMI_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PMIX_RANK",
    "RESEARCH_UNDER_MPI",
)


def run_env(**extra: str) -> dict[str, str]:
    """The environment of a process that a test starts as a user would: this
    checkout importable, output unbuffered, and none of an MPI job's variables
    (a launcher starts its own mpiexec; a plain process is no rank). ``extra``
    is set over it."""
    env = {k: v for k, v in os.environ.items() if k not in MPI_JOB_VARS}
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def python(
    args: list[str],
    *,
    cwd: Path | str = ROOT,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    **kw,
) -> subprocess.CompletedProcess:
    """``python ARGS`` run to its end in :func:`run_env` (or ``env``), its
    output captured as text."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=run_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )


def mpiexec() -> str:
    """The environment's ``mpiexec``; refused under ``make test-fast``
    (``RESEARCH_NO_MPIEXEC``): a test that launches must be marked
    ``launches`` (``tests/conftest.py``)."""
    if os.environ.get("RESEARCH_NO_MPIEXEC"):
        raise RuntimeError(
            "RESEARCH_NO_MPIEXEC is set (make test-fast): mark this test "
            "@pytest.mark.launches"
        )
    exe = Path(sys.executable).parent / "mpiexec"
    return str(exe) if exe.exists() else "mpiexec"


def launcher() -> list[str]:
    """The launch command: ``RESEARCH_MPIEXEC`` when set (``make test-site-mpi``
    sets ``mpirun --allow-run-as-root --oversubscribe``, Open MPI's), else
    :func:`mpiexec`. Either takes ``-n N`` next."""
    custom = os.environ.get("RESEARCH_MPIEXEC", "").strip()
    if custom and os.environ.get("RESEARCH_NO_MPIEXEC"):
        mpiexec()  # refused the same way
    return shlex.split(custom) if custom else [mpiexec()]


def run_under_mpiexec(
    np_: int, args: list[str], timeout: float = 300, env_extra: dict | None = None
) -> subprocess.CompletedProcess:
    """``python ARGS`` on ``np_`` ranks to its end, its output captured; the
    ranks compute as the test's own process does (bit-equal results)."""
    env = run_env(
        RESEARCH_UNDER_MPI="1",
        XLA_FLAGS=XLA_TEST_FLAGS,  # as the test's own process: bit-equal results
        NPROC="1",  # XLA:CPU's intra-op pool: one thread per rank
        # sparse_allreduce(auto) uses its documented defaults, not whatever
        # calibration this machine's user cache holds (tests/conftest.py).
        RESEARCH_SPARSE_COST="defaults",
        # tests/mpi/conftest.py checks the world it gets against this.
        RESEARCH_EXPECTED_NP=str(np_),
        **COMPILE_CACHE_ENV,
    )
    # The outer pytest's options (say --durations, -q) are not the ranks': the
    # summary line tests/test_mpi.py reads must stay as it is.
    env.pop("PYTEST_ADDOPTS", None)
    env.update(env_extra or {})
    cmd = [*launcher(), "-n", str(np_), sys.executable, *args]
    return subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def local_user(name: str) -> int:
    """The uid of local user ``name``, made (no home, no login) if missing
    (root only)."""
    for _ in range(50):  # useradd fails while another one holds /etc/passwd
        try:
            return int(
                subprocess.run(
                    ["id", "-u", name], capture_output=True, text=True, check=True
                ).stdout
            )
        except subprocess.CalledProcessError:
            subprocess.run(
                ["useradd", "-M", "-s", "/usr/sbin/nologin", name], capture_output=True
            )
        time.sleep(0.1)
    raise RuntimeError(f"could not create the local user {name}")


def node_local_entries() -> set[str]:
    """What of this user's is in the node's shared places: the entries of its
    private folders, and names earlier versions put right into /dev/shm (for
    tests that check a run removes what it put there)."""
    from research import privdir

    out = {str(p) for b in privdir.existing_bases() for p in b.iterdir()}
    bases = set(privdir.candidates())
    shm = Path("/dev/shm")
    if shm.is_dir():
        out |= {str(p) for p in shm.glob("research-*") if p not in bases}
    return out


def until(cond: Callable[[], bool], limit: float) -> None:
    """Wait until ``cond()`` holds; an AssertionError after ``limit`` seconds."""
    end = time.monotonic() + limit
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"not within {limit} s")
        time.sleep(0.05)


def processes_naming(text: str | os.PathLike) -> list[int]:
    """The processes whose command line holds ``text`` (a test's own folder:
    what a job it started left running)."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if str(text).encode() in f.read():
                        found.append(int(pid))
            except OSError:
                continue
    return found
