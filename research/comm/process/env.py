"""What the launcher told this process, read from the environment without MPI.

Importing mpi4py initialises MPI; a process that only decides whether to relaunch
itself under mpiexec must not do that, so these helpers live apart from ``world``.
"""

from __future__ import annotations

import os

#: Shared-memory files MPICH's ranks on one node talk through. MPICH removes them
#: in MPI_Finalize; a job that aborts or is killed leaves them (2-4 MB each).
#: (Here, below ``research.entry.launch``, so ``world.abort`` can unlink its own.)
SHM_DIR = "/dev/shm"
SHM_PREFIXES = ("mpich_shm_",)

# Environment variables that launchers set in every rank they start.
_LAUNCHER_VARS = (
    "PMI_RANK",  # MPICH hydra, Intel MPI
    "PMI_SIZE",
    "OMPI_COMM_WORLD_SIZE",  # Open MPI
    "PMIX_RANK",
    "MPI_LOCALRANKID",
)


def launched_by_mpi() -> bool:
    """True when this process was started by mpiexec/mpirun/srun (before MPI init)."""
    if any(v in os.environ for v in _LAUNCHER_VARS):
        return True
    # srun starts ranks with SLURM_PROCID and SLURM_STEP_ID; a plain `python` in an
    # sbatch script has SLURM_JOB_ID but no step, so it still relaunches itself.
    return "SLURM_PROCID" in os.environ and "SLURM_STEP_ID" in os.environ


def env_size() -> int | None:
    """The number of ranks the launcher started, as it announced it (None: unknown).

    srun's ``SLURM_NTASKS`` counts only inside a job step (``SLURM_STEP_ID``).
    """
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        if var in os.environ:
            try:
                return int(os.environ[var])
            except ValueError:
                pass
    if "SLURM_STEP_ID" in os.environ and "SLURM_STEP_NUM_TASKS" in os.environ:
        try:
            return int(os.environ["SLURM_STEP_NUM_TASKS"])
        except ValueError:
            pass
    return None


def env_rank() -> int:
    """This process's rank as the launcher announced it (0 when not launched)."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if var in os.environ:
            try:
                return int(os.environ[var])
            except ValueError:
                pass
    return 0
