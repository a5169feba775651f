"""Tests for ``models``: exact parameter counts, forward passes, the registry."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from models.vgg import adaptive_avg_pool

# Published counts (torchvision for the CNNs, the CANDLE Keras models for NT3/P1B2).
EXACT_COUNTS = {
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "vgg16": 138_357_544,
    "candle_p1b2": 29_540_618,
    "candle_nt3": 154_922_918,
}

TINY = ["resnet_tiny", "vgg_tiny", "cnn_small", "candle_p1b2_tiny", "candle_nt3_tiny"]


@pytest.mark.parametrize("name", sorted(EXACT_COUNTS))
def test_exact_parameter_counts(name):
    # count_params uses jax.eval_shape: nothing is allocated.
    model = models.get_model(name)
    assert models.count_params(model) == EXACT_COUNTS[name]


def test_default_input_shapes():
    assert models.input_shape("resnet50") == (224, 224, 3)
    assert models.input_shape("vgg16") == (224, 224, 3)
    assert models.input_shape("candle_p1b2") == (28_204,)
    assert models.input_shape("candle_nt3") == (60_483, 1)
    assert models.input_shape("candle_nt3", features=300) == (300, 1)
    assert models.input_shape("resnet18", image_size=32, num_classes=10) == (32, 32, 3)
    assert models.get_model("candle_p1b2", features=100).input_shape == (100,)


def test_every_model_has_an_input_shape():
    for name in models.list_models():
        shape = models.input_shape(name)
        assert shape and all(isinstance(d, int) and d > 0 for d in shape)


def test_vgg16_count_is_size_independent_with_adaptive_pooling():
    model = models.get_model("vgg16", image_size=64)
    assert models.count_params(model) == EXACT_COUNTS["vgg16"]
    small = models.get_model("vgg16", image_size=32, pooled_size=1, num_classes=10)
    # fc1 now has 512 inputs instead of 512 * 7 * 7.
    assert models.count_params(small) < 40_000_000


def test_resnet_options_change_structure():
    base = models.count_params(models.get_model("resnet18", num_classes=10))
    cifar = models.get_model("resnet18", num_classes=10, stem="cifar", image_size=32)
    # The 3x3 stem has fewer weights than the 7x7 one; nothing else changes.
    assert models.count_params(cifar) == base - 64 * 3 * (49 - 9)
    wide = models.get_model("resnet_tiny", width=16)
    assert models.count_params(wide) > models.count_params(
        models.get_model("resnet_tiny")
    )


def _init(model, batch=2, seed=0):
    """Input and variables of the right shapes, filled with numpy random values.

    ``model.init`` is traced (by ``eval_shape``) but not compiled: on CPU, XLA
    takes tens of seconds to compile the threefry draws of even a tiny ResNet.
    """
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, *model.input_shape)).astype(np.float32)
    rngs = {"params": jax.random.key(1), "dropout": jax.random.key(2)}
    shapes = jax.eval_shape(lambda x: model.init(rngs, x, train=False), x)

    def fill(path, leaf):
        if jax.tree_util.keystr(path).endswith("['var']"):
            return jnp.ones(leaf.shape, leaf.dtype)
        return jnp.asarray(0.1 * rng.normal(size=leaf.shape), leaf.dtype)

    return x, jax.tree_util.tree_map_with_path(fill, shapes)


@pytest.mark.parametrize("name", TINY)
def test_tiny_forward_train_and_eval(name):
    model = models.get_model(name, num_classes=5)
    x, variables = _init(model)
    mutable = [k for k in variables if k != "params"]

    @jax.jit
    def train_fwd(variables, x):
        return model.apply(
            variables,
            x,
            train=True,
            rngs={"dropout": jax.random.key(3)},
            mutable=mutable,
        )

    logits, updates = train_fwd(variables, x)
    assert logits.shape == (2, 5) and logits.dtype == jnp.float32
    assert np.isfinite(np.asarray(logits)).all()
    eval_logits = jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, x)
    assert eval_logits.shape == (2, 5)
    if "batch_stats" in variables:
        # Train mode moves the running statistics; eval mode leaves them alone.
        old = jax.tree_util.tree_leaves(variables["batch_stats"])
        new = jax.tree_util.tree_leaves(updates["batch_stats"])
        assert any(not np.allclose(a, b) for a, b in zip(old, new))


def test_resnet_has_batch_stats_and_vgg_candle_do_not():
    assert "batch_stats" in _init(models.get_model("resnet_tiny"))[1]
    for name in ["vgg_tiny", "candle_p1b2_tiny", "candle_nt3_tiny"]:
        assert set(_init(models.get_model(name))[1]) == {"params"}


def test_dropout_uses_the_dropout_rng():
    model = models.get_model("candle_nt3_tiny")
    x, variables = _init(model)

    @functools.partial(jax.jit, static_argnames="train")
    def fwd(key, train):
        return model.apply(variables, x, train=train, rngs={"dropout": key})

    a, b = fwd(jax.random.key(0), True), fwd(jax.random.key(1), True)
    assert not np.allclose(a, b)
    # Eval mode ignores the rng.
    np.testing.assert_array_equal(
        fwd(jax.random.key(0), False), fwd(jax.random.key(1), False)
    )


def test_dtype_option_computes_in_bfloat16_with_float32_params():
    model = models.get_model("resnet_tiny", dtype="bfloat16")
    x, variables = _init(model)
    leaves = jax.tree_util.tree_leaves(variables["params"])
    assert all(leaf.dtype == jnp.float32 for leaf in leaves)
    logits = jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, x)
    assert logits.dtype == jnp.float32 and np.isfinite(np.asarray(logits)).all()


def test_adaptive_avg_pool_matches_pytorch_bins():
    x = np.arange(2 * 5 * 5 * 1, dtype=np.float32).reshape(2, 5, 5, 1)
    out = jax.jit(adaptive_avg_pool, static_argnums=1)(x, 3)
    # PyTorch bins for 5 -> 3: [0, 2), [1, 4), [3, 5).
    bins = [(0, 2), (1, 4), (3, 5)]
    for i, (r0, r1) in enumerate(bins):
        for j, (c0, c1) in enumerate(bins):
            np.testing.assert_allclose(out[:, i, j], x[:, r0:r1, c0:c1].mean((1, 2)))
    assert adaptive_avg_pool(x[:, :1, :1], 7).shape == (2, 7, 7, 1)
    np.testing.assert_allclose(adaptive_avg_pool(x[:, :4, :4], 2)[0, 0, 0, 0], 3.0)


def test_unknown_model_lists_valid_names():
    with pytest.raises(ValueError, match="valid models") as info:
        models.get_model("resnet51")
    for name in models.list_models():
        assert name in str(info.value)


def test_unknown_option_lists_valid_options():
    with pytest.raises(ValueError, match="stem"):
        models.get_model("resnet50", stems="cifar")


def test_bad_stem_is_rejected():
    model = models.get_model("resnet_tiny", stem="mnist")
    with pytest.raises(ValueError, match="stem"):
        _init(model)


def test_names_are_known_without_jax_and_classes_load_on_use():
    """``import models`` and ``list_models()`` import neither JAX nor Flax (a
    launcher checks ``--model`` with them); a class loads when first used."""
    import subprocess
    import sys

    code = (
        "import sys, models\n"
        "names = models.list_models()\n"
        "assert 'resnet50' in names and len(names) == 10, names\n"
        "assert not {'jax', 'flax'} & set(sys.modules), 'imported too soon'\n"
        "from models.resnet import ResNet50\n"
        "assert models.ResNet50 is ResNet50\n"
        "try:\n"
        "    models.NoSuchModel\n"
        "except AttributeError as e:\n"
        "    assert 'NoSuchModel' in str(e)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
        "print('ok')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
