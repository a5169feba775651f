"""Communication: MPI start-up, dense, partial, overlapped and sparse averaging.

Depends on mpi4py, mpi4jax, numpy, jax and ``research.trace`` only; never on flax
or ``models``.
"""

from research.comm.world import World, get_world

__all__ = ["World", "get_world"]
