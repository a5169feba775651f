"""Max pooling with a gather-free gradient: drop-in ``flax.linen.max_pool``.

Why: JAX differentiates ``lax.reduce_window(max)`` into a select-and-scatter,
which XLA:CPU expands into a reduce-window over the values *and* one ``s32``
iota per dimension (to find each window's arg-max) followed by a scatter-add.
In a whole ResNet-50 step (batch 16 at 112x112, ``scripts.profile_step``) that
was about 60 ms of thunk time for its single stem pool: the forward
reduce-window 24 ms (it computes the arg-max indices as well), four iotas 32 ms
and the scatter 3 ms; VGG-16's five pools cost about 50 ms.

Here the forward is the maximum of the window's strided slices of the padded
input (one elementwise fusion), and the gradient routes each output's cotangent
to the *first* window position (row-major) holding the maximum, which is exactly
the tie rule of XLA's select-and-scatter with ``>=`` (the one JAX uses): after a
ReLU most windows of zeros are ties, so the rule matters. Each tap's
contribution is a masked copy of ``dy`` placed back with an interior-padded
``lax.pad``, and the taps are summed; XLA fuses all of it into one loop. The
values are identical to ``nn.max_pool``'s; gradients are identical where windows
do not overlap and equal up to the order of a few float additions where they do
(``tests/test_pool.py``).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from models.conv import window_slices

Pads = tuple[tuple[int, int], ...]


def max_pool(
    x: jax.Array,
    window_shape: Sequence[int],
    strides: Sequence[int] | None = None,
    padding: str | Sequence[tuple[int, int]] = "VALID",
) -> jax.Array:
    """Max pooling over the spatial axes of a channels-last ``(N, *spatial, C)`` input.

    Same arguments and values as ``flax.linen.max_pool`` (batch first, features
    last). Inputs without a batch axis and integer inputs go to
    ``flax.linen.max_pool`` unchanged.
    """
    import flax.linen as nn

    window = tuple(int(w) for w in window_shape)
    nd = len(window)
    strides = tuple(int(s) for s in (strides or (1,) * nd))
    if len(strides) != nd:
        raise ValueError(
            f"strides {strides} must have one entry per window axis {window}"
        )
    if x.ndim != nd + 2 or not jnp.issubdtype(x.dtype, jnp.floating):
        return nn.max_pool(x, window, strides=strides, padding=padding)
    if isinstance(padding, str):
        pads = lax.padtype_to_pads(x.shape[1:-1], window, strides, padding)
    else:
        pads = padding
    pads = tuple((int(lo), int(hi)) for lo, hi in pads)
    if len(pads) != nd:
        raise ValueError(
            f"padding {padding!r} must have one pair per window axis {window}"
        )
    if min(min(p) for p in pads) < 0:
        return nn.max_pool(x, window, strides=strides, padding=pads)
    return _max_pool(x, window, strides, pads)


def _out_shape(padded: Sequence[int], window, strides) -> tuple[int, ...]:
    out = tuple((p - k) // s + 1 for p, k, s in zip(padded, window, strides))
    if min(out) < 1:
        raise ValueError(
            f"window {window} does not fit the padded input {tuple(padded)}"
        )
    return out


def _pad(x: jax.Array, pads: Pads, value) -> jax.Array:
    config = [(0, 0, 0), *((lo, hi, 0) for lo, hi in pads), (0, 0, 0)]
    return lax.pad(x, jnp.asarray(value, x.dtype), config)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _max_pool(x, window, strides, pads):
    xp = _pad(x, pads, -jnp.inf)
    out = _out_shape(xp.shape[1:-1], window, strides)
    return functools.reduce(lax.max, window_slices(xp, window, strides, out))


def _max_pool_fwd(x, window, strides, pads):
    y = _max_pool(x, window, strides, pads)
    return y, (x, y)


def _max_pool_bwd(window, strides, pads, residuals, dy):
    x, y = residuals
    xp = _pad(x, pads, -jnp.inf)
    out = y.shape[1:-1]
    zero = jnp.zeros((), dy.dtype)
    taken = jnp.zeros(y.shape, bool)
    dxp = None
    offsets = itertools.product(*(range(k) for k in window))
    for offset, tap in zip(offsets, window_slices(xp, window, strides, out)):
        # The first tap (row-major) equal to the maximum takes the cotangent.
        hit = (tap == y) & ~taken
        taken = taken | hit
        part = jnp.where(hit, dy, zero)
        config = [(0, 0, 0)]
        for o, s, n, p in zip(offset, strides, out, xp.shape[1:-1]):
            config.append((o, p - o - s * (n - 1) - 1, s - 1))
        config.append((0, 0, 0))
        placed = lax.pad(part, zero, config)
        dxp = placed if dxp is None else dxp + placed
    start = (0, *(lo for lo, _ in pads), 0)
    limit = (
        x.shape[0],
        *(lo + n for (lo, _), n in zip(pads, x.shape[1:-1])),
        x.shape[-1],
    )
    return (lax.slice(dxp, start, limit),)


_max_pool.defvjp(_max_pool_fwd, _max_pool_bwd)
