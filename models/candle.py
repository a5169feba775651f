"""CANDLE Pilot-1 benchmarks P1B2 (MLP) and NT3 (1-D CNN) in Flax linen.

Source: the ECP-CANDLE benchmark suite (github.com/ECP-CANDLE/Benchmarks,
Pilot1/P1B2 and Pilot1/NT3). NT3 is the CANDLE application of the SC19 scalability
study (Li, Nicolae, Wozniak, Bosilca, MLHPC@SC19) and of DeepFreeze (CCGrid'20).

P1B2 classifies cancer type from somatic SNPs: 28,204 inputs, dense 1024-512-256
and a 10-way classifier; 29,540,618 parameters. CANDLE's default activation is
sigmoid and its default dropout 0; here ReLU is the default, sigmoid an option.

NT3 tells normal from tumour tissue from 60,483 RNA-seq values: two valid
Conv1D(128) with kernels 20 and 10, MaxPool(10), dense 200 and 20 with dropout 0.1,
a 2-way classifier; 154,922,918 parameters.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

P1B2_FEATURES = 28_204
NT3_FEATURES = 60_483

_ACTIVATIONS = {"relu": nn.relu, "sigmoid": nn.sigmoid}

# Keras' default and CANDLE's ``initialization='glorot_uniform'``.
kernel_init = nn.initializers.glorot_uniform()


class P1B2(nn.Module):
    """CANDLE P1B2 multilayer perceptron.

    Attributes:
        num_classes: size of the classifier output.
        features: input features per example.
        dense: widths of the hidden layers.
        activation: ``"relu"`` or ``"sigmoid"`` (the CANDLE default).
        dropout_rate: dropout after each hidden layer; needs the ``"dropout"``
            rng when ``train=True`` and the rate is positive.
        dtype: computation dtype; parameters stay float32, logits are float32.
    """

    num_classes: int = 10
    features: int = P1B2_FEATURES
    dense: Sequence[int] = (1024, 512, 256)
    activation: str = "relu"
    dropout_rate: float = 0.0
    dtype: Any = jnp.float32

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Per-example input shape ``(features,)``."""
        return (self.features,)

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
        """Logits ``(N, num_classes)`` for inputs ``(N, features)``."""
        if self.activation not in _ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(_ACTIVATIONS)}, "
                f"got {self.activation!r}"
            )
        act = _ACTIVATIONS[self.activation]
        x = jnp.asarray(x, self.dtype).reshape(x.shape[0], -1)
        for width in self.dense:
            x = act(nn.Dense(width, dtype=self.dtype, kernel_init=kernel_init)(x))
            x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
        x = nn.Dense(self.num_classes, dtype=self.dtype, kernel_init=kernel_init)(x)
        return jnp.asarray(x, jnp.float32)


class NT3(nn.Module):
    """CANDLE NT3 one-dimensional CNN.

    Attributes:
        num_classes: size of the classifier output.
        features: sequence length of the ``(features, 1)`` input.
        filters: output channels of each valid Conv1D.
        kernel_sizes: kernel size of each Conv1D.
        pool_size: window and stride of the max-pool after the convolutions.
        dense: widths of the hidden dense layers (ReLU, then dropout).
        dropout_rate: dropout after each hidden dense layer; needs the
            ``"dropout"`` rng when ``train=True``.
        dtype: computation dtype; parameters stay float32, logits are float32.
    """

    num_classes: int = 2
    features: int = NT3_FEATURES
    filters: Sequence[int] = (128, 128)
    kernel_sizes: Sequence[int] = (20, 10)
    pool_size: int = 10
    dense: Sequence[int] = (200, 20)
    dropout_rate: float = 0.1
    dtype: Any = jnp.float32

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Per-example input shape ``(features, 1)``."""
        return (self.features, 1)

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
        """Logits ``(N, num_classes)`` for inputs ``(N, features, 1)``."""
        x = jnp.asarray(x, self.dtype)
        if x.ndim == 2:  # (N, features): CSV rows without the channel axis
            x = x[..., None]
        for filters, kernel in zip(self.filters, self.kernel_sizes, strict=True):
            x = nn.relu(
                nn.Conv(
                    filters,
                    (kernel,),
                    padding="VALID",
                    dtype=self.dtype,
                    kernel_init=kernel_init,
                )(x)
            )
        x = nn.max_pool(x, (self.pool_size,), strides=(self.pool_size,))
        x = x.reshape(x.shape[0], -1)
        for width in self.dense:
            x = nn.relu(nn.Dense(width, dtype=self.dtype, kernel_init=kernel_init)(x))
            x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
        x = nn.Dense(self.num_classes, dtype=self.dtype, kernel_init=kernel_init)(x)
        return jnp.asarray(x, jnp.float32)


P1B2Tiny = functools.partial(P1B2, features=256, dense=(64, 32, 16))
NT3Tiny = functools.partial(
    NT3, features=512, filters=(16, 16), dense=(32, 16), kernel_sizes=(20, 10)
)
