"""Communication: MPI start-up, dense, partial, overlapped and sparse averaging.

Depends on mpi4py, mpi4jax, numpy, jax and, of ours, ``research.trace``,
``research.options``, ``research.registry`` and ``research.provenance`` only
(``research/layers.py`` checks it); never on flax or ``models``. Submodules are
imported explicitly (``research.comm.world``, ...): importing mpi4py initialises
MPI, which a process about to relaunch itself under mpiexec must not do.
"""
