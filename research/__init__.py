"""Efficient synchronous data-parallel training in JAX on MPI.

Subpackages: ``comm`` (collectives), ``checkpoint``, ``train``, ``data``,
``studies`` (the experiments' logic);
modules ``trace`` (timeline) and ``imbalance`` (delay injection).
"""

__version__ = "0.1.0"
