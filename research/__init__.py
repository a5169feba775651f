"""Efficient synchronous data-parallel training in JAX on MPI.

Subpackages: ``comm`` (collectives), ``checkpoint``, ``train``, ``data``,
``studies`` (the experiments' logic);
modules ``trace`` (timeline) and ``imbalance`` (delay injection);
``research.averaging(name, world, **options)`` (``research/api.py``): every
averaging strategy behind one call, ``grads, info = avg(grads)``.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    # ``research.averaging`` without importing MPI when ``research`` is imported
    # (a launcher imports it before it relaunches under mpiexec).
    if name == "averaging":
        from research.api import averaging

        return averaging
    raise AttributeError(f"module 'research' has no attribute {name!r}")
