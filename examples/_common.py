"""What every example shares: a user's own model, data and loss, nothing of ours.

A small Flax CNN on scikit-learn's handwritten digits (1,797 8x8 images, shipped
inside the scikit-learn wheel), each rank training on its own slice, in the
style of Flax's MNIST example. The examples add one primitive of this project
each to a loop like this one.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(16, (3, 3))(x))
        x = nn.avg_pool(x, (2, 2), (2, 2))
        x = nn.relu(nn.Conv(32, (3, 3))(x))
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(10)(nn.relu(nn.Dense(64)(x)))


def digits(rank: int, size: int):
    """This rank's training slice and the common test set, as float32 NHWC."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[..., None]
    y = d.target.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order], y[order]
    train_x, train_y, test_x, test_y = x[:1500], y[:1500], x[1500:], y[1500:]
    return (train_x[rank::size], train_y[rank::size]), (test_x, test_y)


def batches(x, y, batch: int, step: int):
    """The ``step``-th batch of this rank's slice (cycling)."""
    start = (step * batch) % (len(y) - batch)
    return x[start : start + batch], y[start : start + batch]


def init(seed: int = 0, lr: float = 0.1):
    """Parameters (the same on every rank: the same seed) and an optimizer."""
    model = CNN()
    params = model.init(jax.random.PRNGKey(seed), jnp.ones((1, 8, 8, 1)))["params"]
    tx = optax.sgd(lr, momentum=0.9)
    return model, params, tx, tx.init(params)


def loss_fn(model, params, x, y):
    logits = model.apply({"params": params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def digest(params) -> str:
    """SHA-256 of every parameter's bytes: equal on every rank iff replicas are."""
    import hashlib

    leaves = jax.tree.leaves(params)
    return hashlib.sha256(b"".join(np.asarray(p).tobytes() for p in leaves)).hexdigest()


def accuracy(model, params, x, y) -> float:
    logits = model.apply({"params": params}, x)
    return float(jnp.mean(jnp.argmax(logits, -1) == y))


def host_step(model, tx):
    """The two jitted halves of a step around a host-side average:
    ``grad(params, x, y)`` and ``apply(params, opt, grads) -> (params, opt)``."""
    grad = jax.jit(jax.grad(lambda p, xb, yb: loss_fn(model, p, xb, yb)))

    @jax.jit
    def apply(params, opt, grads):
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt

    return grad, apply


def tested(world, model, params, test) -> float:
    """Test accuracy, once every rank is checked to hold the same parameters."""
    assert len(set(world.allgather(digest(params)))) == 1, "replicas differ"
    return accuracy(model, params, *test)
