"""The dense mean over ranks, and the allreduce paths it chooses between.

:mod:`research.comm.dense.mean` (``FusedAllreduce`` in jit, ``HostAllreduce``
on the host, re-exported here) averages with one of: the segmented ring
(``ring``, its C library built by ``ring_build`` from ``native/``), MPI's own
allreduce, the hierarchical one (``hierarchical``) or XLA's collectives
(``xla``), whichever ``choose`` measured fastest on every rank; ``fusion``
packs leaves into buffers and ``chain`` orders the fused path's work. The
strategies ``fused`` and ``host`` (``research.strategies``) run them.
Importing the package imports no MPI (the strategies' options read
``fusion``'s defaults before launch): the two are loaded when first named.
"""

from typing import Any

__all__ = ["FusedAllreduce", "HostAllreduce"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from research.comm.dense import mean

        return getattr(mean, name)
    raise AttributeError(f"module 'research.comm.dense' has no attribute {name!r}")
