"""Tests for ``models.conv``: exact gradients against ``lax.conv_general_dilated``."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from models import conv

DN2 = ("NHWC", "HWIO", "NHWC")
DN1 = ("NWC", "WIO", "NWC")

# (input shape, kernel shape, strides, padding); every kernel here is one the
# matmul path takes (1x1, or window * inputs <= PATCH_LIMIT) unless marked XLA.
CASES = [
    ((2, 8, 8, 6), (1, 1, 6, 5), (1, 1), "SAME"),
    ((2, 9, 7, 6), (1, 1, 6, 5), (2, 2), "SAME"),
    ((1, 9, 9, 4), (1, 1, 4, 3), (2, 1), "VALID"),
    ((2, 7, 7, 3), (1, 1, 3, 4), (1, 1), [(1, 0), (2, 1)]),
    ((2, 8, 8, 7), (3, 3, 7, 4), (1, 1), "SAME"),
    ((2, 9, 9, 5), (3, 3, 5, 4), (2, 2), "SAME"),
    ((1, 11, 10, 2), (3, 3, 2, 3), (2, 1), "VALID"),
    ((2, 13, 13, 1), (7, 7, 1, 4), (2, 2), [(3, 3), (3, 3)]),
    ((2, 15, 15, 3), (7, 7, 3, 8), (2, 2), [(3, 3), (3, 3)]),  # XLA (147 > 64)
    ((3, 10, 10, 16), (3, 3, 16, 8), (1, 1), "SAME"),  # XLA (144 > 64)
    ((2, 7, 9, 2), (3, 2, 2, 3), (1, 2), [(2, 0), (0, 1)]),
]

CASES_1D = [
    ((2, 37, 1), (20, 1, 6), (1,), "VALID"),
    ((2, 31, 3), (10, 3, 4), (1,), "VALID"),
    ((1, 33, 2), (5, 2, 3), (3,), "SAME"),
    ((2, 20, 8), (10, 8, 4), (1,), "VALID"),  # XLA (80 > 64)
]


@pytest.fixture(autouse=True)
def matmul_mode():
    # The matmul kernel gradient (the default; RESEARCH_CONV_WGRAD may change it).
    with conv.weight_grad("matmul"):
        yield


def _grads(fn, x, w, dn, strides, padding):
    def loss(x, w):
        y = fn(x, w, strides, padding, dimension_numbers=dn)
        # A non-uniform cotangent so every output position matters.
        return jnp.sum(y * jnp.cos(jnp.arange(y.size).reshape(y.shape)))

    return jax.value_and_grad(loss, argnums=(0, 1))(x, w)


def _check(x_shape, w_shape, strides, padding, dn):
    kx, kw = jax.random.split(jax.random.PRNGKey(sum(x_shape) + sum(w_shape)))
    x = jax.random.normal(kx, x_shape, jnp.float32)
    w = jax.random.normal(kw, w_shape, jnp.float32)
    ref_val, (ref_dx, ref_dw) = _grads(
        lax.conv_general_dilated, x, w, dn, strides, padding
    )
    val, (dx, dw) = jax.jit(
        lambda x, w: _grads(conv.conv_general_dilated, x, w, dn, strides, padding)
    )(x, w)
    np.testing.assert_allclose(val, ref_val, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(dw, ref_dw, rtol=1e-5, atol=1e-4)
    assert dw.dtype == w.dtype and dw.shape == w.shape


@pytest.mark.parametrize("case", CASES, ids=str)
def test_2d_gradients_match_lax(case):
    _check(*case, DN2)


@pytest.mark.parametrize("case", CASES_1D, ids=str)
def test_1d_gradients_match_lax(case):
    _check(*case, DN1)


def test_kernel_grad_is_used_and_matches_xla_mode():
    # Forward, input gradient and kernel gradient: the matmul path traces two
    # convolutions and a dot, XLA's path three convolutions.
    x = jnp.ones((2, 6, 6, 4))
    w = jnp.ones((1, 1, 4, 3))

    def hlo():
        # A fresh function per mode: jit caches traces by function.
        def loss(x, w):
            y = conv.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=DN2)
            return y.sum()

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(x, w).as_text()

    before = conv.get_weight_grad()
    with conv.weight_grad("matmul"):
        assert conv.get_weight_grad() == "matmul"
        text = hlo()
    assert text.count("convolution") == 2 and "dot_general" in text
    with conv.weight_grad("xla"):
        text = hlo()
    assert conv.get_weight_grad() == before
    assert text.count("convolution") == 3 and "dot_general" not in text


def test_unsupported_arguments_fall_back_to_lax():
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 8, 8))
    w = jax.random.normal(jax.random.PRNGKey(2), (4, 3, 1, 1))
    # NCHW (the lax default), dilation and grouping go to lax unchanged.
    for kwargs in ({}, {"rhs_dilation": (2, 2)}):

        def total(w, fn, kwargs=kwargs):
            return fn(x, w, (1, 1), "SAME", **kwargs).sum()

        got = jax.grad(total)(w, conv.conv_general_dilated)
        ref = jax.grad(total)(w, lax.conv_general_dilated)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    xg = jnp.ones((1, 5, 5, 4))
    wg = jnp.ones((1, 1, 2, 6))
    y = conv.conv_general_dilated(
        xg, wg, (1, 1), "SAME", dimension_numbers=DN2, feature_group_count=2
    )
    assert y.shape == (1, 5, 5, 6)


def test_flax_conv_keeps_its_parameter_tree():
    x = jnp.ones((2, 9, 9, 3))
    plain = nn.Conv(8, (1, 1), strides=2)
    ours = nn.Conv(8, (1, 1), strides=2, conv_general_dilated=conv.conv_general_dilated)
    params = plain.init(jax.random.PRNGKey(0), x)
    assert jax.tree.structure(
        ours.init(jax.random.PRNGKey(0), x)
    ) == jax.tree.structure(params)
    g_plain = jax.grad(lambda p: plain.apply(p, x).sum())(params)
    g_ours = jax.grad(lambda p: ours.apply(p, x).sum())(params)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), g_ours, g_plain
    )


def test_bad_mode_and_shapes_raise():
    with pytest.raises(ValueError, match="mode"):
        conv.set_weight_grad("fast")
    with pytest.raises(ValueError, match="disagree"):
        conv.kernel_grad(
            jnp.ones((1, 4, 4, 2)),
            jnp.ones((1, 4, 4, 3)),
            (1, 1, 5, 3),
            (1, 1),
            ((0, 0), (0, 0)),
        )


@pytest.mark.parametrize("name", ["resnet_tiny", "vgg_tiny"])
def test_whole_model_gradients_match_xla_mode(name):
    # Inside a whole network (BatchNorm, residual adds, pooling) the matmul
    # kernel gradient gives XLA's gradients for every parameter.
    import models

    model = models.get_model(name)
    x = jax.random.normal(jax.random.PRNGKey(3), (2, *model.input_shape))
    variables = model.init(jax.random.PRNGKey(0), x, train=False)

    def loss(params):
        out, _ = model.apply(
            {**variables, "params": params}, x, train=True, mutable=["batch_stats"]
        )
        return jnp.sum(out * jnp.cos(jnp.arange(out.size).reshape(out.shape)))

    grads = {}
    for mode in conv.MODES:
        with conv.weight_grad(mode):
            # A fresh function per mode: jit caches traces by function.
            grads[mode] = jax.jit(lambda p: jax.grad(loss)(p))(variables["params"])
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
        grads["matmul"],
        grads["xla"],
    )
