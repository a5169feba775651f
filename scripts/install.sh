#!/usr/bin/env bash
# Creates .venv at the repository root (when missing) and installs the project into it.
# Idempotent: `make` calls it only when pyproject.toml or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[install] creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip wheel setuptools
# MPI (the mpich wheel brings mpiexec and mpicc) and mpi4jax's build requirements first.
$PIP install -q "mpich>=5.0,<6" "mpi4py>=4.1,<5" "jax>=0.10,<0.11" "jaxlib>=0.10,<0.11" \
  "numpy>=2.0,<3" nanobind cython
if ! .venv/bin/python -c "import mpi4jax" 2>/dev/null; then
  # mpi4jax compiles against the MPI it finds through mpicc, so .venv/bin goes first.
  # Where an nvcc is on PATH its build also makes a CUDA bridge and fails unless
  # CUDA_PATH names a real toolkit: find one next to nvcc, else in /usr/local/cuda.
  export PATH="$PWD/.venv/bin:$PATH"
  if [ -z "${CUDA_PATH:-}" ] && command -v nvcc >/dev/null 2>&1; then
    nvcc_root="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
    for cand in "$nvcc_root" /usr/local/cuda; do
      if [ -f "$cand/include/cuda_runtime.h" ]; then export CUDA_PATH="$cand"; break; fi
    done
  fi
  echo "[install] building mpi4jax from source (about a minute; CUDA_PATH=${CUDA_PATH:-unset})"
  $PIP install -q --no-build-isolation "mpi4jax>=0.9.1,<0.10"
fi
# dev: the test tools; data: scikit-learn, whose wheel holds the digits dataset
# (`--dataset digits`) that tests and `experiments.eager_sgd --dataset digits` use.
$PIP install -q -e ".[dev,data]"
.venv/bin/python -c "import jax, flax, optax, orbax.checkpoint, mpi4py, mpi4jax, google_crc32c; print('[install] ok: jax', jax.__version__, '| mpi4jax', mpi4jax.__version__)"
