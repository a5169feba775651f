#!/usr/bin/env bash
# Creates a venv (default .venv at the repository root; VENV=DIR for another) when
# missing and installs the project into it. Idempotent: `make` calls it only when
# pyproject.toml or this script changed.
#
#   bash scripts/install.sh             laptop/CI: MPICH from the `mpich` wheel
#   bash scripts/install.sh --site-mpi  cluster: mpi4py, mpi4jax and the native
#                                       ring built with MPICC, else the first
#                                       mpicc on PATH (it says which)
set -euo pipefail
cd "$(dirname "$0")/.."
SITE_MPI=0
case "${1:-}" in
  "") ;;
  --site-mpi) SITE_MPI=1 ;;
  *) echo "usage: bash scripts/install.sh [--site-mpi]" >&2; exit 2 ;;
esac
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
if [ "$SITE_MPI" = 1 ]; then
  # One MPI for everything: the MPICC given, else the first mpicc on PATH, as an
  # absolute path; mpi4py, mpi4jax and the native ring are all built with it.
  if [ -n "${MPICC:-}" ]; then
    FROM="MPICC"
    MPICC_PATH="$(command -v "$MPICC" || true)"
  else
    FROM="the first mpicc on PATH; set MPICC=/path/to/mpicc for another"
    MPICC_PATH="$(command -v mpicc || true)"
  fi
  if [ -z "$MPICC_PATH" ]; then
    echo "[install] --site-mpi: ${MPICC:-no mpicc on PATH}: not found; load the site's MPI first (e.g. module load openmpi) or set MPICC" >&2
    exit 2
  fi
  MPICC="$MPICC_PATH"
  ON_PATH="$(command -v mpicc || true)"
  if [ "$FROM" = "MPICC" ] && [ -n "$ON_PATH" ] \
    && [ "$(readlink -f "$ON_PATH")" != "$(readlink -f "$MPICC")" ]; then
    FROM="MPICC; not $ON_PATH, the first mpicc on PATH"
  fi
  # Its C++ wrapper: the same name with mpicxx (mpicc.openmpi: mpicxx.openmpi).
  MPICXX="$(dirname "$MPICC")/$(basename "$MPICC" | sed 's/mpicc/mpicxx/')"
  [ -x "$MPICXX" ] || MPICXX="$(dirname "$MPICC")/mpicxx"
  # The MPI library behind MPICC, from a two-line program it builds and runs
  # (MPI_Get_library_version needs no MPI_Init).
  PROBE="$(mktemp -d)"
  printf '#include <mpi.h>\n#include <stdio.h>\nint main(void) { char v[MPI_MAX_LIBRARY_VERSION_STRING]; int n; MPI_Get_library_version(v, &n); printf("%%s\\n", v); return 0; }\n' > "$PROBE/probe.c"
  if ! "$MPICC" "$PROBE/probe.c" -o "$PROBE/probe" >"$PROBE/log" 2>&1; then
    echo "[install] --site-mpi: $MPICC cannot build an MPI program:" >&2
    cat "$PROBE/log" >&2
    exit 2
  fi
  SITE_LIBRARY="$("$PROBE/probe" | head -1 | sed 's/[[:space:]]*$//')"
  rm -rf "$PROBE"
  echo "[install] --site-mpi: building mpi4py, mpi4jax and the native ring with $MPICC ($FROM; C++: $MPICXX): $SITE_LIBRARY"
  # The wheel's mpi.h (VENV/include) and mpicxx (VENV/bin) come first at build
  # time and would shadow the site MPI's: mpi4py then links the site's libmpi
  # against MPICH's declarations, and the native ring against the wrong MPI.
  if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -m pip show -q mpich >/dev/null 2>&1; then
    echo "[install] --site-mpi: $VENV holds the mpich wheel, whose headers would shadow the site MPI's; use a fresh VENV=DIR or \`$VENV/bin/python -m pip uninstall mpich mpi4py mpi4jax\` first" >&2
    exit 2
  fi
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "[install] creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip wheel setuptools
# mpi4jax's build requirements first (it is built without isolation, below).
$PIP install -q "jax>=0.10,<0.11" "jaxlib>=0.10,<0.11" "numpy>=2.0,<3" nanobind cython
if [ "$SITE_MPI" = 1 ]; then
  # An mpi4py that loads another MPI library than MPICC's is built again.
  BUILT_WITH="$("$VENV/bin/python" -c "import mpi4py.MPI as M; print(M.Get_library_version().splitlines()[0].strip())" 2>/dev/null || echo none)"
  if [ "$BUILT_WITH" != "$SITE_LIBRARY" ]; then
    # From source, against the site MPI; --no-cache-dir: pip's wheel cache would
    # hand back a build made earlier against another MPI.
    echo "[install] building mpi4py with $MPICC (the one there loads: $BUILT_WITH)"
    MPICC="$MPICC" MPICXX="$MPICXX" $PIP install -q --no-cache-dir --force-reinstall \
      --no-deps --no-binary mpi4py "mpi4py>=4.1,<5"
  fi
  # mpi4jax's build takes MPI4JAX_BUILD_MPICC, else the first mpicc on PATH
  # (not MPICC): both are pointed at ours, so a module or conda environment
  # left loaded cannot give mpi4jax another MPI than mpi4py's.
  SHIM="$(mktemp -d)"
  trap 'rm -rf "$SHIM"' EXIT
  ln -s "$MPICC" "$SHIM/mpicc"
  ln -s "$MPICXX" "$SHIM/mpicxx"
  export MPICC MPICXX MPI4JAX_BUILD_MPICC="$MPICC" PATH="$SHIM:$PATH"
  # What the native ring (research/comm/dense/ring.py) compiles with, at run time too:
  # mpi4py does not record the wrappers it was built with.
  printf '{"mpicc": "%s", "mpicxx": "%s", "library": "%s"}\n' \
    "$MPICC" "$MPICXX" "$SITE_LIBRARY" > "$VENV/research-mpi.json"
else
  # MPI (the mpich wheel brings mpiexec, mpicc and mpicxx).
  $PIP install -q "mpich>=5.0,<6" "mpi4py>=4.1,<5"
  # mpi4jax compiles against the MPI it finds through mpicc, so VENV/bin goes first.
  export PATH="$PWD/$VENV/bin:$PATH"
fi
# Importing mpi4jax fails when it was built against another MPI than mpi4py's
# ("Please rebuild mpi4jax with the same MPI library"): built again then.
if ! "$VENV/bin/python" -c "import mpi4jax" 2>/dev/null; then
  # Where an nvcc is on PATH mpi4jax's build also makes a CUDA bridge and fails
  # unless CUDA_PATH names a real toolkit: find one next to nvcc, else in
  # /usr/local/cuda.
  if [ -z "${CUDA_PATH:-}" ] && command -v nvcc >/dev/null 2>&1; then
    nvcc_root="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
    for cand in "$nvcc_root" /usr/local/cuda; do
      if [ -f "$cand/include/cuda_runtime.h" ]; then export CUDA_PATH="$cand"; break; fi
    done
  fi
  echo "[install] building mpi4jax from source (about a minute; CUDA_PATH=${CUDA_PATH:-unset})"
  # --no-cache-dir: a cached build may be against the other MPI.
  $PIP install -q --no-cache-dir --no-build-isolation --force-reinstall --no-deps \
    "mpi4jax>=0.9.1,<0.10"
fi
# dev: the test tools; data: scikit-learn, whose wheel holds the digits dataset
# (`--dataset digits`) that tests and `experiments.eager_sgd --dataset digits` use.
if [ "$SITE_MPI" = 1 ]; then
  $PIP install -q -e ".[dev,data]"
else
  $PIP install -q -e ".[mpich,dev,data]"
fi
"$VENV/bin/python" -c "import jax, flax, optax, orbax.checkpoint, mpi4py.MPI as M, mpi4jax, google_crc32c; print('[install] ok: jax', jax.__version__, '| mpi4jax', mpi4jax.__version__, '|', M.Get_library_version().splitlines()[0].strip())"
if [ "$SITE_MPI" = 1 ]; then
  # The native ring (research/comm/dense/ring.py) is built on first use with the
  # C++ wrapper of the MPI mpi4py was built with; built here once, to say which.
  "$VENV/bin/python" -c "from research.comm.dense import ring; lib = ring.build(); print('[install] native ring built with', ring.compiler(), '->', lib)" \
    || echo "[install] the native ring could not be built: runs use MPI's own allreduce (the reason is printed above)"
fi
