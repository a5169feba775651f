"""Synchronous dense averaging, and the allreduce paths it chooses between.

The strategies ``fused`` and ``host`` (:mod:`research.comm.dense.averagers`,
re-exported here) average with one of: the segmented ring (``ring``, its C
library built by ``ring_build`` from ``native/``), MPI's own allreduce, the
hierarchical one (``hierarchical``) or XLA's collectives (``xla``), whichever
``choose`` measured fastest on every rank; ``fusion`` packs leaves into
buffers and ``chain`` orders the fused path's work.
"""

from research.comm.dense.averagers import FusedAllreduce, HostAllreduce

__all__ = ["FusedAllreduce", "HostAllreduce"]
