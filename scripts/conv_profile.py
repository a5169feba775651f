"""``scripts.bench_compute --profile``: one step's convolutions, by kind.

Every convolution layer of a model (found by intercepting its Flax ``Conv``
calls) is grouped by input shape, kernel, strides and padding; for each kind
its forward, input gradient, XLA's kernel gradient and ``models.conv``'s kernel
gradient are each jitted alone and timed (median of ``steps`` after two
warm-ups), times the number of such layers. ``scripts.profile_step`` profiles
the whole jitted step op by op instead.
"""

from __future__ import annotations

import collections
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import models
from models import conv


def _median_ms(fn: Callable[[], Any], steps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _conv_kinds(name: str, size: dict[str, Any]) -> collections.Counter:
    """``(input shape, kernel shape, strides, padding)`` of every conv, counted."""
    model = models.get_model(name, **size["options"])
    x = jnp.zeros((size["batch"], *model.input_shape))
    seen: collections.Counter = collections.Counter()

    def record(next_fun, args, kwargs, context):
        module = context.module
        if isinstance(module, nn.Conv) and context.method_name == "__call__":
            (inputs,) = args
            window = tuple(module.kernel_size)
            kernel = (*window, inputs.shape[-1], module.features)
            strides = module.strides or 1
            strides = (strides,) * len(window) if isinstance(strides, int) else strides
            padding = module.padding
            if not isinstance(padding, str):
                padding = tuple(tuple(p) for p in padding)
            seen[(inputs.shape, kernel, tuple(strides), padding)] += 1
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        jax.eval_shape(lambda x: model.init(jax.random.PRNGKey(0), x, train=False), x)
    return seen


def _profile_one(rows, shape, kernel, strides, padding, count, dn, steps) -> None:
    """Adds one conv layer's fwd, dx, XLA dw and new dw times (x count) to rows."""
    x = jax.random.normal(jax.random.PRNGKey(0), shape)
    w = jax.random.normal(jax.random.PRNGKey(1), kernel) * 0.05
    pads = padding if isinstance(padding, str) else list(padding)

    def fwd(x, w, fn=lax.conv_general_dilated, pads=pads, strides=strides):
        return fn(x, w, strides, pads, dimension_numbers=dn)

    dy = jax.jit(fwd)(x, w)
    parts = [
        jax.jit(fwd),
        jax.jit(lambda x, w, dy: jax.vjp(lambda x: fwd(x, w), x)[1](dy)),
        jax.jit(lambda x, w, dy: jax.vjp(lambda w: fwd(x, w), w)[1](dy)),
    ]
    c = conv.conv_general_dilated
    parts.append(
        jax.jit(lambda x, w, dy, c=c: jax.vjp(lambda w: fwd(x, w, c), w)[1](dy))
    )
    ms = [_median_ms(functools.partial(parts[0], x, w), steps)]
    ms += [_median_ms(functools.partial(f, x, w, dy), steps) for f in parts[1:]]
    kind = "x".join(map(str, kernel[:2])) + f" s{strides[0]}"
    rows[kind] += np.array([count, *(m * count for m in ms)])


def profile(name: str, steps: int, size: dict[str, Any]) -> None:
    """Per-kind convolution time of one training step, each part jitted alone.

    ``size``: the model's batch and options (``scripts.bench_compute.SIZES``).
    """
    dn = ("NHWC", "HWIO", "NHWC")
    rows: dict[str, np.ndarray] = collections.defaultdict(lambda: np.zeros(5))
    kinds = _conv_kinds(name, size)
    with conv.weight_grad("matmul"):  # "dw new": traced on its first call below
        for key, count in kinds.items():
            _profile_one(rows, *key, count, dn, steps)
    print(f"\nconvolutions of one {name} step, ms (each part jitted alone, x count)")
    print(f"{'kind':<10}{'n':>4}{'fwd':>9}{'dx':>9}{'dw xla':>9}{'dw new':>9}")
    total = np.zeros(5)
    for kind, row in sorted(rows.items()):
        total += row
        print(f"{kind:<10}{int(row[0]):>4}" + "".join(f"{v:>9.1f}" for v in row[1:]))
    print(f"{'total':<10}{int(total[0]):>4}" + "".join(f"{v:>9.1f}" for v in total[1:]))
