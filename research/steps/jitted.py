"""Pure, jitted step functions: gradient, fused step, update, evaluation.

``grad_fn(state, x, y) -> (grads, batch_stats, metrics)`` is the shared core. The
fused step traces a mean inside the program between gradient and update so all
three are one XLA program; the other strategies jit gradient and update apart and
communicate on the host between them. The state argument of the update and of the
fused step is donated: XLA may write the new state into the old buffers.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from research.steps.state import TrainState


def _loss_and_aux(params, state: TrainState, x, y, train: bool):
    variables = {"params": params}
    has_bn = bool(jax.tree_util.tree_leaves(state.batch_stats))
    if has_bn:
        variables["batch_stats"] = state.batch_stats
    rngs = {"dropout": jax.random.fold_in(state.rng, state.step)} if train else None
    if train and has_bn:
        logits, new_vars = state.apply_fn(
            variables, x, train=True, mutable=["batch_stats"], rngs=rngs
        )
        batch_stats = new_vars["batch_stats"]
    else:
        logits = state.apply_fn(variables, x, train=train, rngs=rngs)
        batch_stats = state.batch_stats
    logits = logits.astype(jnp.float32)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    acc = (jnp.argmax(logits, -1) == y).mean()
    return loss, (batch_stats, acc)


def grad_fn(state: TrainState, x, y) -> tuple[Any, Any, dict]:
    """Gradients of the mean cross-entropy, new batch statistics, and metrics."""
    (loss, (batch_stats, acc)), grads = jax.value_and_grad(_loss_and_aux, has_aux=True)(
        state.params, state, x, y, True
    )
    return grads, batch_stats, {"loss": loss, "acc": acc}


def fused_step(average_in_jit):
    """``(state, x, y) -> (state, metrics)`` with averaging inside, to be jitted
    as one program (:func:`make_fused_step`, or one program of all ranks:
    ``research.strategies.fused``)."""

    def step(state: TrainState, x, y):
        grads, batch_stats, metrics = grad_fn(state, x, y)
        grads = average_in_jit(grads)
        return state.apply_gradients(grads=grads, batch_stats=batch_stats), metrics

    return step


def make_fused_step(average_in_jit):
    """:func:`fused_step` jitted, the state donated."""
    return jax.jit(fused_step(average_in_jit), donate_argnums=0)


grad_step = jax.jit(grad_fn)


def _apply(state: TrainState, grads, batch_stats) -> TrainState:
    return state.apply_gradients(grads=grads, batch_stats=batch_stats)


apply_step = jax.jit(_apply, donate_argnums=0)


def _set_params(state: TrainState, params, batch_stats) -> TrainState:
    return state.replace(params=params, batch_stats=batch_stats, step=state.step + 1)


set_params_step = jax.jit(_set_params, donate_argnums=0)


@jax.jit
def eval_step(state: TrainState, x, y) -> tuple[jax.Array, jax.Array]:
    """Sum of per-example losses and number correct on one batch."""
    variables = {"params": state.params}
    if jax.tree_util.tree_leaves(state.batch_stats):
        variables["batch_stats"] = state.batch_stats
    logits = state.apply_fn(variables, x, train=False).astype(jnp.float32)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    return losses.sum(), (jnp.argmax(logits, -1) == y).sum()
