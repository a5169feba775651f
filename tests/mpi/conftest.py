"""Runs inside every rank of an ``mpiexec -n N python -m pytest tests/mpi/...`` job.

A failing test on one rank would leave the others blocked in a collective, so a
failure aborts the whole job at once (MPI_Abort), turning a hang into a red test.
Tests are written for any size (mpi4jax style): expectations are in terms of size.
"""

import os
import sys

import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
os.environ.setdefault("NPROC", "1")  # XLA:CPU's intra-op pool: one thread


def _expected_size() -> int | None:
    """The -n this job was launched with: RESEARCH_EXPECTED_NP (tests/harness.py
    exports it), else what the launcher tells its processes (MPICH's PMI,
    Open MPI, Slurm)."""
    for var in ("RESEARCH_EXPECTED_NP", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        if os.environ.get(var):
            return int(os.environ[var])
    return None


@pytest.fixture(scope="session", autouse=True)
def launched_world_size():
    """Every test file checks that it got the world it was launched for: a
    launch that gave each process a world of one would pass every size-generic
    expectation otherwise."""
    from mpi4py import MPI

    want = _expected_size()
    got = MPI.COMM_WORLD.Get_size()
    assert want is not None, (
        "tests/mpi runs under mpiexec: set RESEARCH_EXPECTED_NP to the -n you "
        "launch with (tests/harness.py does)"
    )
    assert got == want, f"launched with -n {want} but MPI.COMM_WORLD has {got} ranks"
    assert got > 1, "tests/mpi needs at least 2 ranks"
    return got


@pytest.fixture(scope="session")
def world():
    from research.comm.world import get_world

    return get_world()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when in ("setup", "call"):
        from mpi4py import MPI

        if MPI.COMM_WORLD.Get_size() > 1:
            rank = MPI.COMM_WORLD.Get_rank()
            print(
                f"\nr{rank} | FAILED {item.nodeid}\n{report.longreprtext}",
                file=sys.stderr,
                flush=True,
            )
            MPI.COMM_WORLD.Abort(1)


def pytest_sessionstart(session):
    """As an experiment's ranks do (``research.train.process``): the imports
    out of the cyclic collector's sight, 10% less CPU for the 3-rank run of
    test_contract and test_adaptive here (perf stat, bench lock)."""
    from research.train.process import freeze_imports

    freeze_imports()
