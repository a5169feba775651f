"""What a run is made of before it trains: its process, set-up and implied hooks.

:func:`start_process` sets what is the process's own before JAX computes (the
watchdog's timeout, where a failing rank says why, JAX's distributed runtime
where the strategy asks for it) and returns the strategy's options. What only
reads (data, schedule, model, state, the profile window) is made on each rank
alone; the ranks then compare outcomes (:func:`agree`), so bad input raises
the same :class:`research.usage.UsageError` on every rank and no rank is left
waiting in a collective that another will never join. The hooks a config
implies (:func:`implied_callbacks`: checkpoints, a restart's record) follow.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from research.comm.faults import failures
from research.steps.state import TrainState, create_train_state
from research.strategies.base import StrategyOptions
from research.train.callback import Callback
from research.train.config import TrainConfig
from research.train.optim import make_optimizer_for
from research.train.profiling import ProfileWindow
from research.usage import UsageError


@dataclass
class Setup:
    """This rank's data, optimizer, model and state for a run.

    ``optimizer(pushes_per_step, weight_decay=None) -> (schedule, tx)``: the
    run's optimizer for a consumer of that many updates per step
    (:func:`research.train.optim.make_optimizer_for`).
    """

    dataset: Any
    loader: Any
    total_steps: int
    optimizer: Any
    schedule: Any
    model: Any
    state: TrainState
    profile_window: ProfileWindow | None


def load_data(config: TrainConfig, world: Any) -> tuple[Any, Any, int]:
    """This rank's ``(dataset, loader, total_steps)`` for ``config`` (local work:
    no collective; bad data raises here)."""
    import math

    dataset, loader = config.data.create(
        batch_size=config.batch_size, rank=world.rank, size=world.size, seed=config.seed
    )
    steps = config.steps
    if steps <= 0:
        steps = max(1, math.ceil(config.epochs * loader.steps_per_epoch))
    return dataset, loader, steps


def local_setup(config: TrainConfig, world: Any) -> Setup:
    """This rank's set-up, no collective. Raises ValueError or UsageError."""

    dataset, loader, total_steps = load_data(config, world)
    optimizer = functools.partial(make_optimizer_for, config, world.size, total_steps)
    schedule, tx = optimizer(1)
    model = config.model.create(dataset.num_classes)
    state = create_train_state(model, dataset.example_batch(), tx, config.seed)
    window = ProfileWindow.parse(config.records.profile, config.records.profile_ranks)
    if window is not None:
        problem = window.problem(total_steps, world.size)
        if problem:
            raise UsageError(problem)
    return Setup(
        dataset, loader, total_steps, optimizer, schedule, model, state, window
    )


def agreed_setup(config: TrainConfig, world: Any) -> Setup:
    """:func:`local_setup` on every rank, then the same outcome on all
    (collective): a problem on any rank raises :class:`UsageError` on each."""
    setup, problem = None, None
    try:
        setup = local_setup(config, world)
    except (ValueError, UsageError) as e:
        problem = str(e)
    agree(world, problem)
    assert setup is not None
    return setup


def agree(world: Any, problem: str | None) -> None:
    """Raise :class:`UsageError` on every rank if any rank has a ``problem``
    (the same text where all have it; else the first, with its rank)."""
    problems = world.allgather(problem)
    failed = [(r, p) for r, p in enumerate(problems) if p is not None]
    if failed:
        r, p = failed[0]
        raise UsageError(p if len(failed) == world.size else f"rank {r}: {p}")


def start_process(config: TrainConfig, world: Any, run_dir: Any) -> StrategyOptions:
    """The run's process-wide parts, before JAX computes (collective); the
    strategy's options (a problem raises :class:`UsageError`, alike on every
    rank: the flags are the same)."""
    from research.checkpoint.savers import beside_xla_runtime
    from research.comm.dense import xla

    config.faults.create(run_dir)  # the watchdog's timeout, where a rank says why
    try:
        options = config.strategy.typed()
    except ValueError as e:
        raise UsageError(str(e)) from None
    # XLA's collectives (allreduce=xla, or auto on GPUs) need JAX's runtime.
    want = options.xla_runtime(xla.platform()) if world.size > 1 else None
    if xla.wanted(want, beside_xla_runtime(config.checkpoint.saver)):
        xla.start(world)
    return options


def implied_callbacks(config: TrainConfig) -> list[Callback]:
    """The hooks a run's config implies: checkpoints (``--checkpoint``) and, in
    a run that :mod:`research.entry.restart` relaunched, the restart's record."""
    out: list[Callback] = []
    if config.checkpoint.saver != "none":
        from research.train.checkpointing import CheckpointCallback

        out.append(CheckpointCallback.for_run(config))
    if failures.attempt() > 0:
        from research.train.restart_record import RestartRecord

        out.append(RestartRecord())
    return out
