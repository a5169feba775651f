"""Training runs: their config, optimizer and schedules, the loop and its hooks.

``config`` (``TrainConfig``, the flags), ``optim``, ``setup`` (what a run is
made of before it trains, agreed by every rank), ``loop`` (the ``Trainer``),
``evaluate``, ``callback``, ``checkpointing``, ``preemption``,
``restart_record``, ``report``, ``tensorboard``, ``profiling`` and
``process``. The step is the strategy's (``research.strategies``), its pieces
``research.steps``'.
"""
