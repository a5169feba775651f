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

from models.conv import conv_general_dilated
from models.pool import max_pool
from models.staging import TappedDense, run_stages

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

    @property
    def stage_names(self) -> tuple[str, ...]:
        """Stages for ``research.steps.stages``: each hidden layer, the classifier."""
        return (*(f"dense{i + 1}" for i in range(len(self.dense))), "head")

    @nn.compact
    def __call__(
        self, x: jnp.ndarray, train: bool, stages: tuple[int, int] | None = None
    ) -> jnp.ndarray:
        """Logits ``(N, num_classes)`` for inputs ``(N, features)``.

        ``stages=(i, j)`` runs only stages ``i..j-1`` of ``stage_names`` (see
        ``models.staging``); every submodule is named as Flax would auto-name it.
        """
        if self.activation not in _ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(_ACTIVATIONS)}, "
                f"got {self.activation!r}"
            )
        act = _ACTIVATIONS[self.activation]

        def hidden(k, width):
            def run(x):
                if k == 0:
                    x = jnp.asarray(x, self.dtype).reshape(x.shape[0], -1)
                x = TappedDense(
                    width, dtype=self.dtype, kernel_init=kernel_init, name=f"Dense_{k}"
                )(x)
                return nn.Dropout(
                    self.dropout_rate, deterministic=not train, name=f"Dropout_{k}"
                )(act(x))

            return run

        def head(x):
            x = jnp.asarray(x, self.dtype).reshape(x.shape[0], -1)
            x = TappedDense(
                self.num_classes,
                dtype=self.dtype,
                kernel_init=kernel_init,
                name=f"Dense_{len(self.dense)}",
            )(x)
            return jnp.asarray(x, jnp.float32)

        fns = [hidden(k, width) for k, width in enumerate(self.dense)] + [head]
        return run_stages(x, fns, self.stage_names, stages)


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

    @property
    def stage_names(self) -> tuple[str, ...]:
        """Stages for ``research.steps.stages``: each convolution (the last with
        the pool), each hidden dense layer (the first flattens), the classifier."""
        convs = [f"conv{i + 1}" for i in range(len(self.filters))]
        dense = [f"dense{i + 1}" for i in range(len(self.dense))]
        return (*convs, *dense, "head")

    @nn.compact
    def __call__(
        self, x: jnp.ndarray, train: bool, stages: tuple[int, int] | None = None
    ) -> jnp.ndarray:
        """Logits ``(N, num_classes)`` for inputs ``(N, features, 1)``.

        ``stages=(i, j)`` runs only stages ``i..j-1`` of ``stage_names`` (see
        ``models.staging``); every submodule is named as Flax would auto-name it.
        """
        layers = list(zip(self.filters, self.kernel_sizes, strict=True))

        def conv(k, filters, kernel):
            def run(x):
                if k == 0:
                    x = jnp.asarray(x, self.dtype)
                    if x.ndim == 2:  # (N, features): CSV rows without the channel axis
                        x = x[..., None]
                x = nn.Conv(
                    filters,
                    (kernel,),
                    padding="VALID",
                    dtype=self.dtype,
                    kernel_init=kernel_init,
                    conv_general_dilated=conv_general_dilated,
                    name=f"Conv_{k}",
                )(x)
                x = nn.relu(x)
                if k == len(layers) - 1:
                    x = max_pool(x, (self.pool_size,), strides=(self.pool_size,))
                return x

            return run

        def flatten(x):
            return jnp.asarray(x, self.dtype).reshape(x.shape[0], -1)

        def hidden(k, width):
            def run(x):
                x = TappedDense(
                    width, dtype=self.dtype, kernel_init=kernel_init, name=f"Dense_{k}"
                )(flatten(x))
                return nn.Dropout(
                    self.dropout_rate, deterministic=not train, name=f"Dropout_{k}"
                )(nn.relu(x))

            return run

        def head(x):
            x = TappedDense(
                self.num_classes,
                dtype=self.dtype,
                kernel_init=kernel_init,
                name=f"Dense_{len(self.dense)}",
            )(flatten(x))
            return jnp.asarray(x, jnp.float32)

        fns = [conv(k, f, ks) for k, (f, ks) in enumerate(layers)]
        fns += [hidden(k, width) for k, width in enumerate(self.dense)] + [head]
        return run_stages(x, fns, self.stage_names, stages)


P1B2Tiny = functools.partial(P1B2, features=256, dense=(64, 32, 16))
NT3Tiny = functools.partial(
    NT3, features=512, filters=(16, 16), dense=(32, 16), kernel_sizes=(20, 10)
)
