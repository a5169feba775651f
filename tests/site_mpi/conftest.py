"""The site-MPI tier (``make test-site-mpi``): Open MPI's ``mpirun`` launches.

Collected only with ``RESEARCH_SITE_MPI_TESTS=1``, in an environment built by
``scripts/install.sh --site-mpi`` against Debian's Open MPI (``.venv-openmpi``).
tests/harness.py launches with ``RESEARCH_MPIEXEC``; set here to Open
MPI's launcher unless the caller chose one.
"""

import os

if not os.environ.get("RESEARCH_SITE_MPI_TESTS"):  # never outside the tier
    raise ImportError("tests/site_mpi runs only with RESEARCH_SITE_MPI_TESTS=1")

# Root needs --allow-run-as-root; --oversubscribe: 3 ranks on a 2-core machine
# (Open MPI counts slots by cores and refuses more ranks than slots).
os.environ.setdefault(
    "RESEARCH_MPIEXEC", "mpirun.openmpi --allow-run-as-root --oversubscribe"
)
# Programs compiled by the mpich-wheel environment stay out of this one's cache.
os.environ["JAX_COMPILATION_CACHE_DIR"] = (
    f"/tmp/research-jax-cache-openmpi-{os.getuid()}"
)
