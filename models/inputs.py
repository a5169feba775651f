"""Model inputs as the stems take them: uint8 images normalised on the device.

Streamed image datasets hand the step uint8 ``(B, H, W, 3)`` batches (a
quarter of float32's bytes through host memory and to the device, and no
float work on the host: ``research/data/imagenet/``). The image models' stems
(ResNet, VGG and the small CNNs) pass their input through :func:`prepare`,
which turns uint8 into ``(x / 255 - mean) / std`` with ImageNet's mean and
std and casts to the model's computation dtype; a float input is only cast,
as before. So the normalisation runs inside the jitted step of every strategy,
staged ones included (the stem is stage 0, whose input gets no gradient).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

#: ImageNet's per-channel mean and std of RGB values in [0, 1] (torchvision's).
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def prepare(x: Any, dtype: Any) -> jnp.ndarray:
    """``x`` as the stem's input: uint8 images normalised, then cast to ``dtype``."""
    x = jnp.asarray(x)
    if x.dtype == jnp.uint8:
        mean = jnp.asarray(MEAN, jnp.float32) * 255.0
        inv = 1.0 / (jnp.asarray(STD, jnp.float32) * 255.0)
        x = (x.astype(jnp.float32) - mean) * inv
    return x.astype(dtype)
