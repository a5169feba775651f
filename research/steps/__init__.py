"""What a training step is made of, below the strategies that run it.

``state`` (``TrainState``: parameters, optimizer state, BatchNorm statistics
and a strategy's own entries), ``jitted`` (the pure jitted pieces: gradient,
update, the fused step of gradient, mean and update, evaluation), ``split``
and ``stages`` (the model run stage by stage: forward per stage, backward per
stage with ``jax.vjp``), ``flat`` (a stage's parameters as one aligned vector,
host buffers JAX reads in place) and ``activation_exchange`` (a dense stage's
exact gradient from every rank's inputs and output errors). Nothing here
communicates: a strategy (``research.strategies``) hands the pieces their
collectives.
"""
