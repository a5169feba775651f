"""Test configuration shared by the single-process suite.

Files under tests/mpi/ are meant to run inside ``mpiexec`` (every rank runs
pytest); plain ``pytest`` reaches them through tests/test_mpi.py, which launches
them with 2 and 4 ranks. They are not collected directly.
"""

import os

os.environ.setdefault(
    "XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
)

collect_ignore_glob = [] if os.environ.get("RESEARCH_UNDER_MPI") else ["mpi/*"]
