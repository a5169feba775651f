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


def _libmpi(library: Path) -> set[str]:
    """The MPI libraries ``library`` loads, as ``ldd`` resolves them (Open
    MPI's is ``libmpi.so.40``, MPICH's ``libmpi.so.12``)."""
    out = subprocess.run(
        ["ldd", str(library)], capture_output=True, text=True, check=True
    ).stdout
    return {ln.split()[0] for ln in out.splitlines() if "libmpi.so" in ln}


def _mpi4py_libmpi() -> set[str]:
    import mpi4py

    (ext,) = Path(mpi4py.__file__).parent.glob("MPI.*.so")
    return _libmpi(ext)


def _library_of(cc: str, tmp: Path) -> str:
    """The MPI library a program built with ``cc`` loads (first line)."""
    src = tmp / "probe.c"
    src.write_text(
        "#include <mpi.h>\n#include <stdio.h>\nint main(void) { char "
        "v[MPI_MAX_LIBRARY_VERSION_STRING]; int n; MPI_Get_library_version(v, "
        '&n); printf("%s\\n", v); return 0; }\n'
    )
    subprocess.run([cc, str(src), "-o", str(tmp / "probe")], check=True)
    out = subprocess.run([str(tmp / "probe")], capture_output=True, text=True)
    return out.stdout.splitlines()[0].strip()


def test_the_install_said_which_mpicc_and_why(tmp_path):
    text = LOG.read_text()
    library = _library_of(OPENMPI_CC, tmp_path)
    assert library.startswith("Open MPI")
    said = [ln for ln in text.splitlines() if ln.startswith("[install] --site-mpi:")]
    assert len(said) == 1, text[-3000:]
    cxx = OPENMPI_CC.replace("mpicc", "mpicxx")
    assert said[0].startswith(
        f"[install] --site-mpi: building mpi4py, mpi4jax and the native ring with "
        f"{OPENMPI_CC} (MPICC; not "
    ), said[0]
    assert said[0].endswith(f", the first mpicc on PATH; C++: {cxx}): {library}")


def test_mpi4py_and_mpi4jax_are_built_with_open_mpi(tmp_path):
    from mpi4py import MPI

    assert MPI.Get_library_version().splitlines()[0].strip("\x00 ") == _library_of(
        OPENMPI_CC, tmp_path
    )
    import mpi4jax  # refuses an MPI other than mpi4py's

    mine = _mpi4py_libmpi()
    assert mine == {"libmpi.so.40"}, mine  # Open MPI's
    bridges = sorted(
        (Path(mpi4jax.__file__).parent / "_src" / "xla_bridge").glob("*cpu*.so")
    )
    assert bridges
    for lib in bridges:
        assert _libmpi(lib) == mine, lib


def test_the_native_ring_is_built_with_open_mpi():
    from research.comm.dense import ring

    cxx = OPENMPI_CC.replace("mpicc", "mpicxx")
    assert ring.compiler() == cxx  # recorded by the install in the environment
    assert f"[install] native ring built with {cxx}" in LOG.read_text()
    assert _libmpi(ring.build()) == _mpi4py_libmpi() == {"libmpi.so.40"}
