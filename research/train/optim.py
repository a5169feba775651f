"""Optax SGD with momentum and weight decay, and the papers' learning-rate schedules.

* ``step``: linear warm-up, then the rate times 0.1 at each boundary (Goyal et al.,
  the ResNet-50 schedule eager-SGD and DeepFreeze train with).
* ``cosine``: linear warm-up, then cosine decay to zero.
* ``constant``: linear warm-up, then flat.
"""

from __future__ import annotations

from collections.abc import Sequence

import optax

SCHEDULES = ("constant", "step", "cosine")


def make_schedule(
    name: str,
    lr: float,
    total_steps: int,
    warmup_steps: int = 0,
    boundaries: Sequence[float] = (0.5, 0.75),
    decay: float = 0.1,
) -> optax.Schedule:
    """Learning rate as a function of the step.

    Args:
      name: one of ``SCHEDULES``.
      lr: peak learning rate (reached at the end of warm-up).
      total_steps: training length, used by ``cosine`` and by ``step`` boundaries.
      warmup_steps: linear warm-up from 0 over this many steps.
      boundaries: for ``step``, fractions of ``total_steps`` where the rate drops.
      decay: for ``step``, the factor applied at each boundary.
    """
    if name not in SCHEDULES:
        raise ValueError(
            f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}"
        )
    warmup_steps = max(0, min(warmup_steps, total_steps))
    rest = max(1, total_steps - warmup_steps)
    if name == "constant":
        main = optax.constant_schedule(lr)
    elif name == "cosine":
        main = optax.cosine_decay_schedule(lr, rest)
    else:
        marks = {max(1, int(b * total_steps) - warmup_steps): decay for b in boundaries}
        main = optax.piecewise_constant_schedule(lr, marks)
    if warmup_steps == 0:
        return main
    warm = optax.linear_schedule(0.0, lr, warmup_steps)
    return optax.join_schedules([warm, main], [warmup_steps])


def make_optimizer(
    schedule: optax.Schedule,
    momentum: float = 0.9,
    weight_decay: float = 5e-4,
    nesterov: bool = False,
) -> optax.GradientTransformation:
    """SGD with momentum and L2 weight decay added to the gradient (as the papers)."""
    parts = []
    if weight_decay > 0:
        parts.append(optax.add_decayed_weights(weight_decay))
    parts.append(optax.sgd(schedule, momentum=momentum or None, nesterov=nesterov))
    return optax.chain(*parts)


def make_optimizer_for(
    config,
    world_size: int,
    total_steps: int,
    pushes_per_step: int = 1,
    weight_decay: float | None = None,
) -> tuple[optax.Schedule, optax.GradientTransformation]:
    """The run's ``(schedule, optimizer)`` from a ``TrainConfig``.

    ``config.lr`` is scaled by the global batch / 256 when ``config.scale_lr``.
    A consumer that applies ``pushes_per_step`` updates per synchronous step (a
    parameter server: one push per worker) gets lr / pushes on a schedule that
    many times as long, so the per-example rate is the same. ``weight_decay``
    overrides ``config.weight_decay`` (0 for a strategy that decays the local
    gradient itself, ``sparse``: decay must be applied once).
    """
    k = max(1, pushes_per_step)
    lr = config.lr * (config.batch_size * world_size / 256 if config.scale_lr else 1)
    schedule = make_schedule(
        config.schedule, lr / k, total_steps * k, config.warmup_steps * k
    )
    wd = config.weight_decay if weight_decay is None else weight_decay
    return schedule, make_optimizer(schedule, config.momentum, wd)
