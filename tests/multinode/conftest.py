"""Runs inside every rank of a job that tests/test_multinode.py starts on the
nodes of a local cluster (research/localnet.py): the same fixtures and
fail-fast abort as tests/mpi (a failing rank ends the whole job at once)."""

from tests.mpi.conftest import (  # noqa: F401 - pytest finds them here
    launched_world_size,
    pytest_runtest_makereport,
    world,
)
