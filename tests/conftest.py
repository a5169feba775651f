"""Test configuration shared by the single-process suite.

Files under tests/mpi/ are meant to run inside ``mpiexec`` (every rank runs
pytest); plain ``pytest`` reaches them through tests/test_mpi.py, which launches
them with 2, 3 and 4 ranks. They are not collected directly.

The environment set here is inherited by every process a test starts: XLA gets
one intra-op thread per process (ranks oversubscribe 2 cores) and compiles at
LLVM -O1 (``tests.harness.XLA_TEST_FLAGS``; tests/mpi's ranks at -O0,
``XLA_MPI_TEST_FLAGS``), and all processes share a
persistent compilation cache, since ranks and runs compile the same programs
and compiling is most of this suite's time.

``make test`` runs the suite on two workers (pytest-xdist, ``--dist loadgroup``):
about a third of its time is spent waiting (timeouts, signals, processes
starting), which the other worker fills. What that asks of the tests is here:
the longest tests are handed out first (:func:`pytest_collection_modifyitems`);
each worker keeps its own private folder for node-local data, so a test that
checks a run left nothing there sees only its own worker's runs; ranks that wait
sleep now and then instead of spinning (MPICH's progress throttle and heavy
yield), so a job waiting on one worker leaves the cores to the other; and a
test file whose tests share a module fixture (a local cluster, a trained model)
keeps them on one worker with ``pytest.mark.xdist_group(name)``.
"""

import os

from research import privdir
from tests.harness import XLA_TEST_FLAGS


def _compile_cache() -> str:
    """A folder of ours for compiled programs. They are loaded and run, so a
    predictable name in /tmp that another user made first is refused
    (``research/privdir.py``) for one in this user's private folder."""
    path = f"/tmp/research-jax-cache-{os.getuid()}"
    try:
        return str(privdir.make(path))
    except OSError:
        return str(privdir.base() / "jax-cache")


os.environ.setdefault("XLA_FLAGS", XLA_TEST_FLAGS)
# The ~400 processes the suite starts import the project's modules. Where the
# environment sets PYTHONDONTWRITEBYTECODE (container images often do), each
# one compiled them from source again (about 0.08 CPU-s a process here); the
# suite's processes write and share bytecode in __pycache__ (ignored by git).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
os.environ.setdefault("NPROC", "1")  # XLA:CPU's intra-op pool: one thread
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _compile_cache()
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# A rank waiting in MPICH's progress loop sleeps 1 us after a run of polls that
# found nothing, instead of spinning: with more ranks than cores (and another
# worker's job beside this one) the spinning ranks took the cores that the
# working ones need (-18% CPU for tests/mpi at 4 ranks here). Tests only: the
# experiments' measurements were made with MPICH's defaults.
os.environ.setdefault("MPIR_CVAR_CH4_PROGRESS_THROTTLE", "1")
# And a rank that yields MPICH's lock (thread level MULTIPLE: every progress
# poll yields it) sleeps briefly instead of calling sched_yield, which on an
# oversubscribed core hands the CPU straight back to the spinning rank: the
# 3-rank MPI run took 107 CPU-s instead of 147 here (perf stat, bench lock).
os.environ.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
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


#: This process's xdist worker ("gw0", "gw1", ...), None when not one.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
#: The pytest run this process belongs to: the controller's process id, handed
#: to its workers in the environment. The workers' folders carry it, so a run
#: ending removes its own folders only, not those of a run beside it (a second
#: `make test`, or one test file run by hand while the suite runs: that once
#: removed the suite's folders, and its runs fell back to /tmp/research-<user>).
RUN = os.environ.setdefault("RESEARCH_TEST_RUN", str(os.getpid()))


def _worker_shm() -> str | None:
    """A private /dev/shm folder for this worker's node-local data (its runs'
    fast tiers and transfer files; ``research.privdir`` reads
    ``RESEARCH_SHM_DIR``), so that tests on two workers do not see each other's."""
    if not WORKER or "RESEARCH_SHM_DIR" in os.environ or not os.path.isdir("/dev/shm"):
        return None
    path = f"/dev/shm/pytest-{os.getuid()}-{RUN}-{WORKER}"
    try:
        privdir.make(path)
    except OSError:
        return None
    return path


WORKER_SHM = _worker_shm()
if WORKER_SHM:
    os.environ["RESEARCH_SHM_DIR"] = WORKER_SHM


def _longest_first(item) -> int:
    """The MPI suite's launches, then the other tests that launch jobs, then
    the rest: handed out in this order, the two workers end together."""
    if item.nodeid.startswith("tests/test_mpi.py::test_under_mpiexec["):
        return 0
    return 1 if item.get_closest_marker("launches") else 2


def pytest_collection_modifyitems(config, items):
    """Longest first (:func:`_longest_first`); the tests of one
    ``xdist_group`` stay together, where the first of them goes, so a module
    fixture they share is made once."""
    if os.environ.get("RESEARCH_UNDER_MPI"):
        return

    def group(item):
        mark = item.get_closest_marker("xdist_group")
        if mark is None:
            return None
        return mark.args[0] if mark.args else mark.kwargs.get("name")

    keys = [(_longest_first(item), i) for i, item in enumerate(items)]
    first: dict[str, tuple[int, int]] = {}  # a group's place: its earliest key
    for item, key in zip(items, keys, strict=True):
        if (g := group(item)) is not None:
            first[g] = min(first.get(g, key), key)
    keys = [first.get(group(item), key) for item, key in zip(items, keys, strict=True)]
    order = sorted(range(len(items)), key=lambda i: (keys[i], i))
    items[:] = [items[i] for i in order]


def pytest_sessionfinish(session, exitstatus):
    """What killed jobs cannot remove: MPICH's and DeepFreeze's files in
    /dev/shm, and the workers' folders (naming what a test left in them).

    Once, after every worker has finished: files of a job still running on
    another worker must not be taken for orphans."""
    if os.environ.get("RESEARCH_UNDER_MPI") or WORKER:
        return
    import glob
    import re
    import shutil

    # This run's folders, and those of runs whose controller is gone (killed:
    # /dev/shm is memory); never those of a run still going beside this one.
    mine = []
    for folder in sorted(glob.glob(f"/dev/shm/pytest-{os.getuid()}-*-gw*")):
        found = re.fullmatch(
            rf"pytest-{os.getuid()}-(\d+)-gw\d+", os.path.basename(folder)
        )
        if found and (found[1] == RUN or not os.path.exists(f"/proc/{found[1]}")):
            mine.append(folder)
    for folder in mine:
        left = [
            os.path.relpath(os.path.join(d, n), folder)
            for d, _, files in os.walk(folder)
            for n in files
        ]
        if left:
            print(
                f"\ntests left node-local files in {folder} (removed now): {left[:10]}"
            )
        shutil.rmtree(folder, ignore_errors=True)

    from research.checkpoint.deepfreeze import remove_stale_transfer_files
    from research.entry.launch import remove_orphaned_shm

    remove_orphaned_shm()
    remove_stale_transfer_files()
