"""The stage protocol: every model here can run a contiguous range of its stages.

A model's ``stage_names`` lists its stages in order (stem, each block or layer
group, head), and ``model.apply(variables, x, train=..., stages=(i, j))`` runs
stages ``i`` to ``j - 1`` only: ``x`` is then stage ``i``'s input and the result is
stage ``j - 1``'s output (the logits when ``j`` is the last). ``stages=None`` runs
the whole model.

Every submodule a stage creates carries an explicit name, the one Flax would have
given it in the whole model (``Conv_3``, ``Dense_0``, ``bn_init``), so a stage run
alone reads and writes exactly the variables it does inside the whole model, and a
``Dropout`` draws the same mask (Flax derives the mask's key from the module path).
The split is by top-level submodule, so it does not depend on how a layer computes.
``research.steps.stages`` builds the per-stage forward and backward on this.

Dense layers are :class:`TappedDense`: an ``nn.Dense`` (same parameters, same
names) that can hand out its input and the error at its output, for the SC18
FC-activation exchange (``research.strategies.overlap``): with the ``TAP_INPUTS``
collection mutable it sows its input, and given a zero-valued ``TAP_ERRORS``
variable (a Flax perturbation) the gradient with respect to that variable is the
loss's gradient at the layer's output. Without those collections it is exactly
``nn.Dense``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import flax.linen as nn
import jax.numpy as jnp

#: Collection where a ``TappedDense`` sows its input (``{"x": (input,)}``).
TAP_INPUTS = "dense_inputs"
#: Collection of the zero-valued perturbations at a ``TappedDense``'s output.
TAP_ERRORS = "dense_errors"

StageFn = Callable[[jnp.ndarray], jnp.ndarray]


def run_stages(
    x: jnp.ndarray,
    fns: Sequence[StageFn],
    names: Sequence[str],
    stages: tuple[int, int] | None,
) -> jnp.ndarray:
    """Applies ``fns[i:j]`` in order to ``x``, for ``stages=(i, j)`` or all of them.

    Args:
        x: the input of stage ``i``.
        fns: one function per stage, each creating its own (named) submodules.
        names: the model's ``stage_names``; only its length is checked, so the
            declared stages and the built ones cannot drift apart.
        stages: ``(i, j)`` with ``0 <= i < j <= len(fns)``, or ``None`` for all.

    Returns:
        The output of stage ``j - 1``.

    Raises:
        ValueError: for a range outside the model's stages.
    """
    if len(fns) != len(names):
        raise ValueError(f"model builds {len(fns)} stages but names {len(names)}")
    lo, hi = (0, len(fns)) if stages is None else stages
    if not 0 <= lo < hi <= len(fns):
        raise ValueError(f"stages {stages} outside 0..{len(fns)}")
    for fn in fns[lo:hi]:
        x = fn(x)
    return x


class TappedDense(nn.Dense):
    """``nn.Dense`` with taps: its input (sown to ``TAP_INPUTS`` as ``"x"``) and
    its output perturbed by ``TAP_ERRORS``' ``"dz"`` (zero-valued: the gradient
    with respect to it is the error at the output, ``dL/dz``). Its kernel
    gradient is then ``x^T dz`` over the batch, and its bias gradient ``dz``
    summed over the batch. ``init`` creates the parameters only, as
    ``nn.Dense``'s."""

    @nn.compact
    def __call__(self, inputs: jnp.ndarray) -> jnp.ndarray:
        y = super().__call__(inputs)
        if self.is_initializing():
            return y
        self.sow(TAP_INPUTS, "x", inputs)
        return self.perturb("dz", y, collection=TAP_ERRORS)
