"""One MPI for everything a site-MPI install builds, the one MPICC names.

``make test-site-mpi`` builds ``.venv-openmpi`` the way a cluster user with a
module left loaded would: the mpich wheel's ``mpicc`` first on PATH and
``MPICC=mpicc.openmpi`` (Debian's Open MPI). mpi4py, mpi4jax and the native
ring must all be built with Open MPI, and the install must say which ``mpicc``
it used and why (``scripts/install.sh``; mpi4jax's own build reads
``MPI4JAX_BUILD_MPICC`` or the PATH, never ``MPICC``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

OPENMPI_CC = shutil.which("mpicc.openmpi")
LOG = Path(sys.prefix) / "install.log"

pytestmark = pytest.mark.skipif(
    OPENMPI_CC is None or not LOG.exists(),
    reason="needs .venv-openmpi built by make test-site-mpi (Debian's Open MPI)",
)


def _linked(library: Path) -> str:
    return subprocess.run(
        ["ldd", str(library)], capture_output=True, text=True, check=True
    ).stdout


def test_the_install_said_which_mpicc_and_why():
    text = LOG.read_text()
    assert (
        f"[install] --site-mpi: building mpi4py, mpi4jax and the native ring with "
        f"{OPENMPI_CC} (MPICC; C++: {OPENMPI_CC.replace('mpicc', 'mpicxx')})"
    ) in text, text[-3000:]


def test_mpi4py_and_mpi4jax_are_built_with_open_mpi():
    import mpi4py
    from mpi4py import MPI

    assert mpi4py.get_config().get("mpicc") == OPENMPI_CC
    assert "Open MPI" in MPI.Get_library_version()
    import mpi4jax  # refuses an MPI other than mpi4py's

    bridges = sorted(
        (Path(mpi4jax.__file__).parent / "_src" / "xla_bridge").glob("*.so")
    )
    assert bridges
    for lib in bridges:
        linked = _linked(lib)
        assert "libmpi" in linked and "openmpi" in linked, (lib, linked)
        assert "mpich" not in linked, (lib, linked)


def test_the_native_ring_is_built_with_open_mpi():
    from research.comm import ring

    assert ring.compiler() == OPENMPI_CC.replace("mpicc", "mpicxx")
    assert f"[install] native ring built with {ring.compiler()}" in LOG.read_text()
    linked = _linked(ring.build())
    assert "openmpi" in linked and "mpich" not in linked, linked
