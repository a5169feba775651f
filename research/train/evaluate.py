"""Evaluation over the whole test split, every rank taking its share."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from research.comm.dense import HostAllreduce
from research.comm.faults import watchdog
from research.comm.world import World
from research.steps import jitted as steps
from research.steps.state import TrainState


def average_batch_stats(state: TrainState, mean: HostAllreduce) -> TrainState:
    """BatchNorm statistics averaged over ranks (collective), as Flax's example.

    Ranks see different batches, so their running statistics differ; evaluation
    uses their mean, packed and reduced as gradients are
    (``research.comm.dense.fusion``).
    """
    if mean.size == 1 or not jax.tree_util.tree_leaves(state.batch_stats):
        return state
    stats, _ = mean.reduce(state.batch_stats)
    # The result views recycled host buckets: copy it into the state.
    return state.replace(batch_stats=jax.tree.map(jnp.array, stats))


def evaluate(
    state: TrainState, batches: Iterable[Any], world: World
) -> dict[str, float]:
    """Test loss and accuracy of ``state`` over ``batches``, this rank's share
    of the test split (``research.data.protocol.Data.eval_batches``), summed
    over every rank's."""
    totals = np.zeros(3)
    for x, y in batches:
        loss_sum, correct = steps.eval_step(state, x, y)
        totals += (float(loss_sum), float(correct), len(y))
    with watchdog.watch("evaluate: sum of test totals"):
        totals = world.comm.allreduce(totals)
    n = max(totals[2], 1)
    return {"test_loss": totals[0] / n, "test_acc": totals[1] / n}
