#!/usr/bin/env bash
# Creates a virtual environment (.venv at the repository root, or $VENV) when missing
# and installs the project into it. Idempotent: `make` calls it only when
# pyproject.toml or this script changed.
#
#   bash scripts/install.sh             laptop: the mpich wheel brings MPI (mpiexec, mpicc)
#   bash scripts/install.sh --site-mpi  cluster: mpi4py and mpi4jax built against the MPI
#                                       whose mpicc is $MPICC (default: `mpicc` on PATH);
#                                       the mpich wheel is never installed
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=laptop
for arg in "$@"; do
  case "$arg" in
    --site-mpi) MODE=site ;;
    *) echo "usage: [VENV=DIR] [MPICC=PATH] bash scripts/install.sh [--site-mpi]" >&2; exit 2 ;;
  esac
done
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[install] creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
VENV="$(cd "$VENV" && pwd)"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip wheel setuptools

if [ "$MODE" = site ]; then
  MPICC="${MPICC:-$(command -v mpicc || true)}"
  if [ -z "$MPICC" ] || [ ! -x "$MPICC" ]; then
    echo "[install] --site-mpi needs the site MPI's mpicc: load its module or set MPICC=/path/to/mpicc" >&2
    exit 2
  fi
  MPICC="$(command -v "$MPICC")"
  case "$(readlink -f "$MPICC")" in
    "$VENV"/*)
      echo "[install] $MPICC is inside $VENV (the mpich wheel's?): put the site MPI's mpicc first on PATH or set MPICC" >&2
      exit 2 ;;
  esac
  if $PIP show -q mpich >/dev/null 2>&1; then
    # Its mpi.h in $VENV/include would shadow the site MPI's at build time, and its
    # mpicxx would compile the native ring for the wrong MPI (issue 26).
    echo "[install] $VENV holds the mpich wheel: use a fresh venv for the site MPI, or \`$PIP uninstall mpich\` first" >&2
    exit 2
  fi
  MPI_BIN="$(dirname "$MPICC")"
  echo "[install] site MPI: $MPICC ($("$MPICC" --showme:version 2>/dev/null || "$MPICC" -v 2>&1 | head -1))"
  $PIP install -q "jax>=0.10,<0.11" "jaxlib>=0.10,<0.11" "numpy>=2.0,<3" nanobind cython
  # Built here, never from pip's wheel cache: a wheel cached from a build against
  # another MPI (a laptop venv's mpi4jax) has the same name and would be reused.
  # Rebuilt unless the installed mpi4py was built here with this very mpicc
  # (mpi4py 4 records no build configuration of its own: $VENV/.site-mpicc does).
  STAMP_MPICC="$VENV/.site-mpicc"
  if [ "$(cat "$STAMP_MPICC" 2>/dev/null)" != "$(readlink -f "$MPICC")" ] ||
     ! "$VENV/bin/python" -c "import mpi4py" 2>/dev/null; then
    echo "[install] building mpi4py from source with MPICC=$MPICC"
    MPICC="$MPICC" $PIP install -q --no-cache-dir --no-binary mpi4py --force-reinstall --no-deps "mpi4py>=4.1,<5"
    readlink -f "$MPICC" > "$STAMP_MPICC"
    MPI4PY_BUILT=1
  fi
  # mpi4jax compiles against the MPI it finds through mpicc: the site MPI's goes first.
  export PATH="$MPI_BIN:$PATH"
  MPI4JAX_REBUILD=1
  if [ -z "${MPI4PY_BUILT:-}" ] && "$VENV/bin/python" -c "import mpi4jax" 2>/dev/null; then MPI4JAX_REBUILD=0; fi
  MPI4JAX_FLAGS=(--no-cache-dir --force-reinstall --no-deps)
  EXTRAS="dev,data"
else
  # MPI (the mpich wheel brings mpiexec and mpicc) and mpi4jax's build requirements first.
  $PIP install -q "mpich>=5.0,<6" "mpi4py>=4.1,<5" "jax>=0.10,<0.11" "jaxlib>=0.10,<0.11" \
    "numpy>=2.0,<3" nanobind cython
  # mpi4jax compiles against the MPI it finds through mpicc, so the venv's bin goes first.
  export PATH="$VENV/bin:$PATH"
  MPI4JAX_REBUILD=1
  if "$VENV/bin/python" -c "import mpi4jax" 2>/dev/null; then MPI4JAX_REBUILD=0; fi
  MPI4JAX_FLAGS=()
  EXTRAS="dev,data,mpich"
fi
if [ "$MPI4JAX_REBUILD" = 1 ]; then
  # Where an nvcc is on PATH mpi4jax's build also makes a CUDA bridge and fails unless
  # CUDA_PATH names a real toolkit: find one next to nvcc, else in /usr/local/cuda.
  if [ -z "${CUDA_PATH:-}" ] && command -v nvcc >/dev/null 2>&1; then
    nvcc_root="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
    for cand in "$nvcc_root" /usr/local/cuda; do
      if [ -f "$cand/include/cuda_runtime.h" ]; then export CUDA_PATH="$cand"; break; fi
    done
  fi
  echo "[install] building mpi4jax from source (about a minute; CUDA_PATH=${CUDA_PATH:-unset})"
  $PIP install -q --no-build-isolation "${MPI4JAX_FLAGS[@]}" "mpi4jax>=0.9.1,<0.10"
fi
# dev: the test tools; data: scikit-learn, whose wheel holds the digits dataset
# (`--dataset digits`) that tests and `experiments.eager_sgd --dataset digits` use;
# mpich (laptop only): the MPICH wheel, so that pip keeps it with the project.
$PIP install -q -e ".[$EXTRAS]"
"$VENV/bin/python" -c "import jax, flax, optax, orbax.checkpoint, mpi4jax, google_crc32c; from mpi4py import MPI; print('[install] ok: jax', jax.__version__, '| mpi4jax', mpi4jax.__version__, '| MPI:', MPI.Get_library_version().splitlines()[0])"
