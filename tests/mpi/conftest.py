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
