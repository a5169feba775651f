"""The gradient-averaging strategies: one module a strategy, one object each.

Each module holds its strategy whole: its options (a frozen dataclass with
ranges, ``research.options``), the one object that both the Trainer and a
user's own loop call (``research.strategies.base.Strategy``: average the
gradients or run the step, drain, state to checkpoint, what it records), and
its registration (``research.strategies.registry.register``). Importing this
package registers them all, one line each below; MPI starts only when a
strategy is made.

======================  ==========================================================
``fused``               gradient, mpi4jax mean and update in one jitted program
``host``                jitted gradient, its mean on the host, jitted update
``partial``             ``solo``, ``majority``, ``sync``: eager-SGD's partial allreduce
``ps``                  an asynchronous parameter server
``layerwise``           DDP-style buckets allreduced during the backward pass
``overlap``             SC18: per-stage reduce-scatter, sharded update, allgather
``sparse``              SparCML: top-k with error feedback, sparse allreduce
``adaptive``            one of host, top-k, majority, solo at a time, by a model
``local_sgd``           H local steps, then parameters and optimizer state averaged
======================  ==========================================================

``base`` (the object's two faces, the step's phases), ``staged`` (what
``layerwise`` and ``overlap`` share: the model run stage by stage) and
``registry`` (names, checks, ``--list``) are the rest. The collectives they
run are ``research.comm``'s; the pieces of a step ``research.steps``'.
"""

from research.strategies import (  # noqa: F401  (each registers itself)
    adaptive,
    fused,
    host,
    layerwise,
    local_sgd,
    overlap,
    partial,
    ps,
    sparse,
)
