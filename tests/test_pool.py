"""``models.pool.max_pool``: same values as ``flax.linen.max_pool``, same gradient.

Inputs are rounded and passed through a ReLU, as in the models, so most windows
hold ties: the gradient must go to the first maximum in row-major window order,
as XLA's select-and-scatter (what JAX differentiates ``nn.max_pool`` into) does.
Where windows do not overlap the gradients are bit-identical; where they
overlap, a position that is the maximum of several windows sums their
cotangents in another order, so they agree to float rounding.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.pool import max_pool

CASES = [
    # (input shape, window, strides, padding, windows overlap)
    ((2, 9, 9, 3), (3, 3), (2, 2), "SAME", True),  # ResNet's stem pool
    ((2, 8, 8, 4), (2, 2), (2, 2), "VALID", False),  # VGG's
    ((2, 30, 5), (5,), (5,), "VALID", False),  # CANDLE NT3's 1-D pool
    ((2, 7, 8, 3), (3, 2), (1, 2), [(1, 1), (0, 1)], True),
    ((1, 10, 10, 2), (3, 3), (2, 2), "VALID", True),
    ((2, 11, 6), (4,), (3,), "SAME", True),
    ((1, 4, 5, 6, 2), (2, 2, 2), (2, 2, 2), "SAME", False),
]


def _case(shape, seed):
    rng = np.random.default_rng(seed)
    x = np.maximum(rng.integers(-2, 3, size=shape), 0).astype(np.float32)
    return jnp.asarray(x)


@pytest.mark.parametrize("shape,window,strides,padding,overlap", CASES)
def test_values_and_gradients_match_flax(shape, window, strides, padding, overlap):
    x = _case(shape, 0)
    ref_y, ref_vjp = jax.vjp(
        lambda x: nn.max_pool(x, window, strides=strides, padding=padding), x
    )
    y, vjp = jax.vjp(lambda x: max_pool(x, window, strides, padding), x)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(ref_y))
    dy = jnp.asarray(np.random.default_rng(1).standard_normal(y.shape), jnp.float32)
    (dx,), (ref_dx,) = vjp(dy), ref_vjp(dy)
    if overlap:
        np.testing.assert_allclose(
            np.asarray(dx), np.asarray(ref_dx), rtol=1e-6, atol=1e-6
        )
    else:
        np.testing.assert_array_equal(np.asarray(dx), np.asarray(ref_dx))
    # Every cotangent lands on exactly one input: none lost or doubled.
    np.testing.assert_allclose(float(dx.sum()), float(dy.sum()), rtol=1e-5)


def test_jitted_and_second_order_free_of_surprises():
    x = _case((2, 9, 9, 3), 2)
    f = jax.jit(lambda x: (max_pool(x, (3, 3), (2, 2), "SAME") ** 2).sum())
    g = jax.grad(lambda x: (nn.max_pool(x, (3, 3), (2, 2), "SAME") ** 2).sum())(x)
    np.testing.assert_allclose(
        np.asarray(jax.jit(jax.grad(f))(x)), np.asarray(g), atol=1e-6
    )


def test_other_inputs_go_to_flax_unchanged():
    ints = jnp.arange(2 * 4 * 4 * 1).reshape(2, 4, 4, 1)
    np.testing.assert_array_equal(
        np.asarray(max_pool(ints, (2, 2), (2, 2))),
        np.asarray(nn.max_pool(ints, (2, 2), strides=(2, 2))),
    )
    unbatched = _case((6, 6, 2), 3)
    np.testing.assert_array_equal(
        np.asarray(max_pool(unbatched, (2, 2), (2, 2))),
        np.asarray(nn.max_pool(unbatched, (2, 2), strides=(2, 2))),
    )


def test_bad_arguments_say_what_is_wrong():
    x = _case((1, 6, 6, 2), 4)
    with pytest.raises(ValueError, match="strides"):
        max_pool(x, (2, 2), (2,))
    with pytest.raises(ValueError, match="padding"):
        max_pool(x, (2, 2), (2, 2), [(0, 0)])
    with pytest.raises(ValueError, match="does not fit"):
        max_pool(x, (8, 8), (1, 1))
