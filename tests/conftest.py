"""Test configuration shared by the single-process suite.

Files under tests/mpi/ are meant to run inside ``mpiexec`` (every rank runs
pytest); plain ``pytest`` reaches them through tests/test_mpi.py, which launches
them with 2 and 4 ranks. They are not collected directly.

The environment set here is inherited by every process a test starts: XLA gets
one intra-op thread per process (ranks oversubscribe 2 cores), and all processes
share a persistent compilation cache, since ranks and runs compile the same
programs and compiling is most of this suite's time.
"""

import os

from research import privdir


def _compile_cache() -> str:
    """A folder of ours for compiled programs. They are loaded and run, so a
    predictable name in /tmp that another user made first is refused
    (``research/privdir.py``) for one in this user's private folder."""
    path = f"/tmp/research-jax-cache-{os.getuid()}"
    try:
        return str(privdir.make(path))
    except OSError:
        return str(privdir.base() / "jax-cache")


os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
os.environ.setdefault("NPROC", "1")  # XLA:CPU's intra-op pool: one thread
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _compile_cache()
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# sparse_allreduce(auto) decides with the documented defaults, not whatever
# this machine's cache holds, and measures nothing on first use (the tests of
# that set the variable themselves: tests/mpi/test_sparse.py).
os.environ.setdefault("RESEARCH_SPARSE_COST", "defaults")

collect_ignore_glob = (
    [] if os.environ.get("RESEARCH_UNDER_MPI") else ["mpi/*", "multinode/*"]
)
if not os.environ.get("RESEARCH_CLUSTER_TESTS"):  # `make test-cluster` runs them
    collect_ignore_glob.append("cluster/*")
if not os.environ.get("RESEARCH_FAULT_TESTS"):  # `make test-faults` runs them
    collect_ignore_glob.append("faults/*")
# The folder itself, not only its files: its conftest.py sets RESEARCH_MPIEXEC
# (Open MPI's mpirun) for the whole session when it is imported.
collect_ignore = [] if os.environ.get("RESEARCH_SITE_MPI_TESTS") else ["site_mpi"]


def pytest_sessionfinish(session, exitstatus):
    """What killed jobs cannot remove: MPICH's and DeepFreeze's files in /dev/shm."""
    if not os.environ.get("RESEARCH_UNDER_MPI"):
        from research.checkpoint.deepfreeze import remove_stale_transfer_files
        from research.launch import remove_orphaned_shm

        remove_orphaned_shm()
        remove_stale_transfer_files()
