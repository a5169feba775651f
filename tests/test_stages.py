"""Tests for ``research.steps.stages``: the model run stage by stage.

The reference is the monolithic step, ``research.steps.jitted.grad_step``: the same
loss, gradients, statistics and metrics must come out of the staged forward and
backward, for every model family, with dropout active where the model has it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import models
from research.steps.jitted import grad_step
from research.steps.stages import (
    StagedGrad,
    dense_grads,
    group_stages,
    split_model,
)
from research.steps.state import TrainState

# Small but structurally whole: every block of ResNet-18/50 and every conv of
# VGG-16 is there; only widths, input sizes and fc widths shrink.
CASES = {
    "resnet_tiny": {},
    "resnet18": {"width": 4, "image_size": 32},
    "resnet50": {"width": 4, "image_size": 32},
    "vgg_tiny": {"dropout_rate": 0.5},
    "vgg16": {"image_size": 32, "pooled_size": 1, "fc": (32, 32)},
    "cnn_small": {},
    "candle_p1b2": {"features": 64, "dense": (32, 16, 8), "dropout_rate": 0.2},
    "candle_nt3": {"features": 120, "filters": (4, 4), "dense": (16, 8)},
}


def _state(model, batch=4, seed=0):
    """A TrainState and a batch, filled with numpy draws (no RNG compile)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, 3, size=batch).astype(np.int32)
    shapes = jax.eval_shape(
        lambda x: model.init({"params": jax.random.key(0)}, x, train=False), x
    )

    def fill(path, leaf):
        # Fan-in scaled kernels keep a deep ResNet's activations near unit size.
        key = jax.tree_util.keystr(path)
        if key.endswith("['var']"):
            return jnp.asarray(rng.uniform(0.5, 1.5, leaf.shape), leaf.dtype)
        if key.endswith("['scale']"):
            return jnp.asarray(rng.uniform(0.5, 1.5, leaf.shape), leaf.dtype)
        scale = 0.2
        if key.endswith("['kernel']"):
            scale = 1.0 / np.sqrt(np.prod(leaf.shape[:-1]))
        return jnp.asarray(scale * rng.normal(size=leaf.shape), leaf.dtype)

    variables = jax.tree_util.tree_map_with_path(fill, shapes)
    state = TrainState.create(
        apply_fn=model.apply,
        params=variables["params"],
        tx=optax.sgd(0.1),
        batch_stats=variables.get("batch_stats", {}),
        rng=jax.random.PRNGKey(seed + 7),
    )
    # A nonzero step: the dropout key is fold_in(rng, step) in both paths.
    return state.replace(step=jnp.asarray(3, jnp.int32)), x, y


def _close(actual, expected):
    """rtol 1e-4, atol 1e-5 times the leaf's largest magnitude.

    The two paths are compiled apart, so XLA sums in different orders; a
    rounding error is relative to the largest terms summed, so an entry that
    cancels to nearly zero next to entries of size 10 differs by ~1e-6 * 10.
    """
    assert jax.tree_util.tree_structure(actual) == jax.tree_util.tree_structure(
        expected
    )

    def check(a, e):
        scale = max(1.0, float(np.max(np.abs(e), initial=0.0)))
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5 * scale)

    jax.tree_util.tree_map(check, actual, expected)


@pytest.mark.parametrize("name", models.list_models())
def test_stages_partition_the_whole_tree(name):
    # Full-size models: split_model only traces shapes, nothing is allocated.
    model = models.get_model(name)
    stages = split_model(model)
    assert [s.name for s in stages] == list(model.stage_names)
    assert [s.index for s in stages] == list(range(len(stages)))
    whole = jax.eval_shape(
        lambda x: model.init({"params": jax.random.key(0)}, x, train=False),
        jax.ShapeDtypeStruct((1, *model.input_shape), jnp.float32),
    )
    for collection, attr in (("params", "param_keys"), ("batch_stats", "stat_keys")):
        owned = [k for s in stages for k in getattr(s, attr)]
        assert len(owned) == len(set(owned)), "stages share a subtree"
        assert set(owned) == set(whole.get(collection, {}))
    assert all(s.param_keys for s in stages), "every stage owns parameters"


def test_split_sizes_follow_the_architecture():
    assert len(split_model(models.get_model("resnet50"))) == 1 + 16 + 1
    assert len(split_model(models.get_model("resnet18"))) == 1 + 8 + 1
    assert len(split_model(models.get_model("vgg16"))) == 5 + 2 + 1
    assert len(split_model(models.get_model("candle_nt3"))) == 2 + 2 + 1
    stem = split_model(models.get_model("resnet50"))[0]
    assert stem.param_keys == ("Conv_0", "bn_init") and stem.stat_keys == ("bn_init",)


@pytest.mark.parametrize("name", sorted(CASES))
def test_staged_gradient_equals_monolithic(name):
    model = models.get_model(name, num_classes=3, **CASES[name])
    state, x, y = _state(model)
    grads, stats, metrics = grad_step(state, x, y)

    staged = StagedGrad(model)
    got_metrics = staged.forward(state, x, y)
    order, got = [], {}
    for i, g in staged.backward():
        assert set(g) == set(staged.stages[i].param_keys)
        order.append(i)
        got.update(g)
    assert order == list(reversed(range(len(staged.stages))))
    _close(got, grads)
    _close(staged.batch_stats, stats)
    _close(got_metrics, metrics)
    if jax.tree_util.tree_leaves(stats):
        # The statistics really moved, so their equality means something.
        moved = jax.tree_util.tree_map(
            lambda a, b: not np.allclose(a, b), stats, state.batch_stats
        )
        assert any(jax.tree_util.tree_leaves(moved))


@pytest.mark.parametrize(
    "name", ["vgg_tiny", "vgg16", "candle_p1b2", "candle_nt3", "resnet_tiny"]
)
def test_tapped_dense_stages_give_the_same_gradient(name):
    """The FC-activation exchange's pieces: a tapped stage's inputs and output
    errors make the monolithic gradient (dropout active where the model has it)."""
    model = models.get_model(name, num_classes=3, **CASES[name])
    state, x, y = _state(model, seed=3)
    grads, stats, metrics = grad_step(state, x, y)
    stages = split_model(model)
    tapped = [s.index for s in stages if s.exchangeable]
    if name.startswith("resnet"):
        assert tapped == [len(stages) - 1]  # the classifier only
    else:
        fcs = [s for s in stages if s.param_keys[0].startswith("Dense_")]
        assert tapped == [s.index for s in fcs] and len(tapped) >= 2
    staged = StagedGrad(model, stages, exchange=tapped)
    _close(staged.grad(state, x, y), (grads, stats, metrics))
    # Stacking two "ranks" (the same batch twice) gives the same mean gradient.
    staged.forward(state, x, y)
    errors = dict(staged.backward())
    for i in tapped:
        params = stages[i].params(state.params)
        two = dense_grads(
            params,
            [jnp.concatenate([a, a]) for a in staged.taps[i]],
            [jnp.concatenate([e, e]) for e in errors[i]],
            2,
        )
        _close(two, {k: grads[k] for k in params})
    bad = next((s.index for s in stages if not s.exchangeable), len(stages))
    with pytest.raises(ValueError, match="tapped dense"):
        StagedGrad(model, stages, exchange=[bad])


def test_dropout_masks_match_and_follow_the_step():
    model = models.get_model("vgg_tiny", num_classes=3, dropout_rate=0.5)
    state, x, y = _state(model, seed=1)
    staged = StagedGrad(model)
    a = staged.grad(state, x, y)
    _close(a, grad_step(state, x, y))
    later = state.replace(step=state.step + 1)
    b = staged.grad(later, x, y)
    _close(b, grad_step(later, x, y))
    # A new step draws a new mask, so the comparison above is not vacuous.
    assert not np.allclose(a[0]["Dense_0"]["kernel"], b[0]["Dense_0"]["kernel"])


def test_loss_cotangent_scales_and_stage_params_are_used():
    model = models.get_model("resnet_tiny", num_classes=3)
    state, x, y = _state(model, seed=2)
    staged = StagedGrad(model)
    grads, _, _ = staged.grad(state, x, y)
    asked = []

    def stage_params(i):
        asked.append(i)
        return staged.stages[i].params(state.params)

    staged.forward(state, x, y, stage_params=stage_params)
    assert asked == list(range(len(staged.stages)))
    halves = {}
    for _, g in staged.backward(loss_cotangent=0.5):
        halves.update(g)
    _close(halves, jax.tree_util.tree_map(lambda g: 0.5 * g, grads))
    # Parameters handed in by stage_params are the ones differentiated at.
    zero_head = dict(staged.stages[-1].params(state.params))
    zero_head = jax.tree_util.tree_map(jnp.zeros_like, zero_head)
    last = len(staged.stages) - 1
    staged.forward(state, x, y, stage_params=lambda i: zero_head if i == last else None)
    got = dict(staged.backward())
    # With a zero classifier, no gradient reaches the body.
    assert not np.any(got[0]["Conv_0"]["kernel"])


def test_backward_needs_forward_and_runs_once():
    model = models.get_model("candle_p1b2_tiny", num_classes=3)
    state, x, y = _state(model)
    staged = StagedGrad(model)
    with pytest.raises(RuntimeError, match="forward"):
        next(staged.backward())
    staged.forward(state, x, y)
    list(staged.backward())
    with pytest.raises(RuntimeError, match="forward"):
        next(staged.backward())


def test_eval_logits_stage_by_stage():
    model = models.get_model("resnet_tiny", num_classes=3)
    state, x, _ = _state(model, seed=3)
    variables = {"params": state.params, "batch_stats": state.batch_stats}
    expected = jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, x)
    _close(StagedGrad(model).logits(variables, x), expected)


def test_grouped_stages_give_the_same_gradient():
    model = models.get_model("resnet_tiny", num_classes=3)
    state, x, y = _state(model, seed=4)
    stages = split_model(model)
    groups = group_stages(stages, [2, 3, 1])
    assert [g.span for g in groups] == [(0, 2), (2, 5), (5, 6)]
    assert groups[0].name == "stem..block1_0"
    assert groups[0].param_keys == ("Conv_0", "bn_init", "ResNetBlock_0")
    _close(StagedGrad(model, groups).grad(state, x, y), grad_step(state, x, y))
    with pytest.raises(ValueError, match="do not cover"):
        group_stages(stages, [2, 3])
    with pytest.raises(ValueError, match="do not cover"):
        group_stages(stages, [0, 6])


def test_post_packs_inside_the_backward_program():
    from research.steps.flat import ALIGN, FlatStage, aligned_empty

    model = models.get_model("resnet_tiny", num_classes=3)
    state, x, y = _state(model, seed=5)
    staged = StagedGrad(model)
    grads, _, _ = staged.grad(state, x, y)
    flats = [FlatStage(s, state.params, divisor=4.0) for s in staged.stages]
    staged.forward(state, x, y)
    for i, flat in staged.backward(post=flats.__getitem__):
        f = flats[i]
        assert flat.shape == (f.padded,) and all(o % ALIGN == 0 for o in f.offsets)
        # Views of an aligned host copy read back the gradient over 4, and the
        # padding between leaves is zero.
        host = aligned_empty(f.padded)
        host[:] = np.asarray(flat)
        expected = jax.tree_util.tree_map(
            lambda g: g / 4.0, staged.stages[i].params(grads)
        )
        _close(f.views(host), expected)
        used = np.zeros(f.padded, bool)
        for o, n in zip(f.offsets, f.sizes, strict=True):
            used[o : o + n] = True
        assert not np.any(host[~used])
