"""Communication: MPI start-up, the collectives, and each strategy's averaging.

At the top: ``world`` (MPI start-up, communicators, abort), ``link`` (the
emulated network), the strategies' seam (``base``, ``registry``, ``calling``,
``declared``) and the host-side strategies ``partial`` (with its
``partial_rounds``), ``ps`` and ``sharded``. In packages: ``process`` (a rank's
set-up before MPI), ``faults`` (the watchdog and failure records),
``asynchronous`` (the progress thread and handles), ``dense`` (fused and host
averaging and their allreduce paths) and ``sparse`` (SparCML).

Depends on mpi4py, mpi4jax, numpy, jax and, of ours, ``research.trace``,
``research.options``, ``research.registry`` and ``research.provenance`` only
(``research/layers.py`` checks it); never on flax or ``models``. Submodules are
imported explicitly (``research.comm.world``, ...): importing mpi4py initialises
MPI, which a process about to relaunch itself under mpiexec must not do.
"""
