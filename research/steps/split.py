"""A model's stages: which parameters each owns, found by tracing it stage by stage.

``split_model`` cuts a model following ``models.staging`` into its ``Stage``s
(the top-level parameter and statistics keys each creates, and its tapped dense
layers); ``group_stages`` merges consecutive ones. ``research.steps.stages``
runs them. Pure JAX: nothing is allocated or compiled here.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.staging import TAP_ERRORS

Tree = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage: its place, its name and the top-level keys it owns.

    Attributes:
        index: position in the forward order.
        name: the model's name for it (``"stem"``, ``"block2_1"``, ``"head"``;
            ``"first..last"`` for a group made by ``group_stages``).
        param_keys: top-level keys of ``params`` that belong to this stage.
        stat_keys: top-level keys of ``batch_stats`` that belong to this stage.
        span: the model's stages ``(i, j)`` this one runs, ``(index, index + 1)``
            unless grouped.
        tap_keys: top-level keys of the stage's tapped dense layers
            (``models.staging.TappedDense``), sorted.
    """

    index: int
    name: str
    param_keys: tuple[str, ...]
    stat_keys: tuple[str, ...]
    span: tuple[int, int]
    tap_keys: tuple[str, ...] = ()

    @property
    def exchangeable(self) -> bool:
        """Whether every parameter belongs to a tapped dense layer, so the
        stage's gradient can come from its layers' inputs and errors."""
        return bool(self.tap_keys) and set(self.tap_keys) == set(self.param_keys)

    def params(self, tree: Tree) -> Tree:
        """This stage's subtree of a ``params``-shaped tree (grads, momenta...)."""
        return {k: tree[k] for k in self.param_keys}

    def stats(self, tree: Tree) -> Tree:
        """This stage's subtree of a ``batch_stats`` tree."""
        return {k: tree[k] for k in self.stat_keys}


def split_model(
    model: nn.Module, input_shape: Sequence[int] | None = None
) -> list[Stage]:
    """Cuts a model into its stages, finding the keys each stage owns.

    Each stage is initialised alone (abstractly, with ``jax.eval_shape``: nothing
    is allocated or compiled) on the abstract output of the stage before, so the
    keys are those the stage really creates.

    Args:
        model: a module with ``stage_names`` that accepts ``stages=(i, j)``.
        input_shape: per-example input shape; defaults to ``model.input_shape``.

    Returns:
        The stages in forward order.

    Raises:
        ValueError: if the stages' keys overlap or miss part of the whole tree.
    """
    shape = tuple(input_shape or model.input_shape)
    return list(_split(model, shape))


@functools.lru_cache(maxsize=16)
def _split(model: nn.Module, shape: tuple[int, ...]) -> tuple[Stage, ...]:
    """``split_model``, once per (model, input shape) in a process (modules
    compare by their fields; the tracing takes a second for ResNet-50)."""
    names = tuple(model.stage_names)
    x = jax.ShapeDtypeStruct((1, *shape), jnp.float32)
    rngs = {"params": jax.random.key(0), "dropout": jax.random.key(1)}
    whole = jax.eval_shape(lambda x: model.init(rngs, x, train=False), x)
    stages = []
    for i, name in enumerate(names):
        y, variables = jax.eval_shape(
            lambda x, i=i: model.init_with_output(
                rngs, x, train=False, stages=(i, i + 1)
            ),
            x,
        )
        taps = jax.eval_shape(
            lambda v, x, i=i: model.apply(
                v, x, train=False, stages=(i, i + 1), mutable=[TAP_ERRORS]
            )[1],
            variables,
            x,
        )
        stages.append(
            Stage(
                i,
                name,
                tuple(variables.get("params", {})),
                tuple(variables.get("batch_stats", {})),
                (i, i + 1),
                tuple(sorted(taps.get(TAP_ERRORS, {}))),
            )
        )
        x = y
    for collection, attr in (("params", "param_keys"), ("batch_stats", "stat_keys")):
        owned = [k for s in stages for k in getattr(s, attr)]
        expected = set(whole.get(collection, {}))
        if len(owned) != len(set(owned)) or set(owned) != expected:
            raise ValueError(
                f"stages of {type(model).__name__} do not partition {collection}: "
                f"owned {sorted(owned)}, whole tree {sorted(expected)}"
            )
    return tuple(stages)


def group_stages(stages: Sequence[Stage], sizes: Sequence[int]) -> list[Stage]:
    """Merges consecutive stages into groups, each run as one program.

    Fewer, larger stages mean fewer program boundaries (less dispatch, more
    fusion) and fewer, larger messages for a strategy that sends per stage,
    like DDP's gradient buckets.

    Args:
        stages: consecutive stages, e.g. from ``split_model``.
        sizes: how many stages each group takes, in order; they must add up to
            ``len(stages)``.

    Returns:
        The groups as stages, indexed from 0.

    Raises:
        ValueError: if the sizes are not positive or do not cover the stages.
    """
    if any(n < 1 for n in sizes) or sum(sizes) != len(stages):
        raise ValueError(f"group sizes {list(sizes)} do not cover {len(stages)}")
    groups, start = [], 0
    for index, n in enumerate(sizes):
        part = stages[start : start + n]
        start += n
        name = part[0].name if n == 1 else f"{part[0].name}..{part[-1].name}"
        groups.append(
            Stage(
                index,
                name,
                tuple(k for s in part for k in s.param_keys),
                tuple(k for s in part for k in s.stat_keys),
                (part[0].span[0], part[-1].span[1]),
                tuple(sorted(k for s in part for k in s.tap_keys)),
            )
        )
    return groups
