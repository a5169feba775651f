"""Communication: MPI start-up and the collectives; nothing of steps or strategies.

At the top: ``world`` (MPI start-up, communicators, abort), ``link`` (the
emulated network), ``info`` (``CommInfo``, what a call did), ``partial`` (with
``partial_rounds``: eager-SGD's solo and majority rounds) and ``ps`` (the
parameter server). In packages: ``process`` (a rank's set-up before MPI),
``faults`` (the watchdog, failure records, lifelines), ``asynchronous`` (the
progress thread and handles), ``dense`` (the dense mean in jit and on the
host, over ring, MPI, hierarchical or XLA allreduce) and ``sparse`` (SparCML's
sparse allreduce, top-k with error feedback). The strategies that run them are
``research.strategies``.

Depends on mpi4py, mpi4jax, numpy, jax and, of ours, ``research.trace`` and
``research.provenance`` only (``research/import_rules.py`` checks it); never on
flax, ``models`` or anything that trains. Submodules are imported explicitly
(``research.comm.world``, ...): importing mpi4py's ``MPI`` initialises MPI,
which a process about to relaunch itself under mpiexec must not do.
"""
