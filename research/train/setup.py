"""What a run is made of before it trains: its set-up, strategy and implied hooks.

What only reads (data, schedule, model, state, the profile window) is made on
each rank alone; the ranks then compare outcomes (:func:`agree`), so bad input
raises the same :class:`research.usage.UsageError` on every rank and no rank
is left waiting in a collective that another will never join. The strategy
(:func:`make_averager`) and the hooks a config implies (:func:`implied_callbacks`:
checkpoints, a restart's record) follow.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from research.comm.base import Averager
from research.comm.faults import failures
from research.train.callback import Callback
from research.train.config import TrainConfig, load_data, model_options
from research.train.optim import make_optimizer_for
from research.train.profiling import ProfileWindow
from research.train.state import TrainState, create_train_state
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


def local_setup(config: TrainConfig, world: Any) -> Setup:
    """This rank's set-up, no collective. Raises ValueError or UsageError."""
    import models

    dataset, loader, total_steps = load_data(config, world)
    optimizer = functools.partial(make_optimizer_for, config, world.size, total_steps)
    schedule, tx = optimizer(1)
    model = models.get_model(
        config.model, num_classes=dataset.num_classes, **model_options(config)
    )
    state = create_train_state(model, dataset.train_x[:1], tx, config.seed)
    window = ProfileWindow.parse(config.profile, config.profile_ranks)
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


def make_averager(config: TrainConfig, world: Any, given: Averager | None) -> Averager:
    """``given``, or the config's strategy with its options and ``--link``
    (checked either way: a problem raises :class:`UsageError`, alike on every
    rank)."""
    from research.comm.registry import get_averager, strategy_options

    try:
        options = strategy_options(
            config.strategy, config.strategy_options, config.link
        )
        return given or get_averager(config.strategy, world, **options)
    except ValueError as e:  # the same on every rank
        raise UsageError(str(e)) from None


def implied_callbacks(config: TrainConfig) -> list[Callback]:
    """The hooks a run's config implies: checkpoints (``--checkpoint``) and, in
    a run that :mod:`research.entry.restart` relaunched, the restart's record."""
    out: list[Callback] = []
    if config.checkpoint != "none":
        from research.train.checkpointing import CheckpointCallback

        out.append(CheckpointCallback.for_run(config))
    if failures.attempt() > 0:
        from research.train.restart_record import RestartRecord

        out.append(RestartRecord())
    return out
