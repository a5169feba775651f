"""ResNet-18 and ResNet-50 (v1.5) in Flax linen.

Paper: He, Zhang, Ren, Sun, *Deep Residual Learning for Image Recognition*
(CVPR 2016). ResNet-50 on ImageNet is the image benchmark of eager-SGD (PPoPP'20),
the SC18 overlap study and the SC19 scalability study.

The layout follows the Flax ImageNet example (``examples/imagenet/models.py``):
convolutions without bias, BatchNorm with ``use_running_average=not train``,
momentum 0.9 and epsilon 1e-5, batch statistics in the mutable ``batch_stats``
collection, the last BatchNorm of every block zero-initialised, and named variants
built with ``functools.partial``. ResNet-50 is v1.5 (stride on the 3x3
convolution), which with 1000 classes has 25,557,032 parameters, the torchvision
count; ResNet-18 has 11,689,512.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from models.conv import conv_general_dilated
from models.inputs import prepare
from models.pool import max_pool
from models.staging import TappedDense, run_stages

ModuleDef = Any

# torchvision's initialisation: He normal on fan-out for convolutions, and the
# PyTorch Linear default (uniform, bound 1/sqrt(fan_in)) for the classifier. Plain
# normals also keep init cheap: truncated normals are slow to compile on CPU.
conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
dense_init = nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")


class ResNetBlock(nn.Module):
    """Basic block: two 3x3 convolutions (ResNet-18/34)."""

    filters: int
    conv: ModuleDef
    norm: ModuleDef
    act: Callable = nn.relu
    strides: tuple[int, int] = (1, 1)

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        residual = x
        y = self.conv(self.filters, (3, 3), self.strides)(x)
        y = self.act(self.norm()(y))
        y = self.conv(self.filters, (3, 3))(y)
        y = self.norm(scale_init=nn.initializers.zeros)(y)
        if residual.shape != y.shape:
            residual = self.conv(self.filters, (1, 1), self.strides, name="conv_proj")(
                residual
            )
            residual = self.norm(name="norm_proj")(residual)
        return self.act(residual + y)


class BottleneckResNetBlock(nn.Module):
    """Bottleneck block, v1.5: 1x1, 3x3 (strided), 1x1 with 4x expansion."""

    filters: int
    conv: ModuleDef
    norm: ModuleDef
    act: Callable = nn.relu
    strides: tuple[int, int] = (1, 1)

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        residual = x
        y = self.conv(self.filters, (1, 1))(x)
        y = self.act(self.norm()(y))
        y = self.conv(self.filters, (3, 3), self.strides)(y)
        y = self.act(self.norm()(y))
        y = self.conv(self.filters * 4, (1, 1))(y)
        y = self.norm(scale_init=nn.initializers.zeros)(y)
        if residual.shape != y.shape:
            residual = self.conv(
                self.filters * 4, (1, 1), self.strides, name="conv_proj"
            )(residual)
            residual = self.norm(name="norm_proj")(residual)
        return self.act(residual + y)


class ResNet(nn.Module):
    """ResNet with a configurable stem, width and stage sizes.

    Attributes:
        stage_sizes: blocks per stage; stage ``i`` has ``width * 2**i`` filters.
        block_cls: ``ResNetBlock`` or ``BottleneckResNetBlock``.
        num_classes: size of the classifier output.
        width: filters of the stem and of the first stage (64 in the paper).
        stem: ``"imagenet"`` (7x7 stride-2 conv, 3x3 stride-2 max-pool) or
            ``"cifar"`` (3x3 stride-1 conv, no pooling) for 32x32-class images.
        image_size: expected input height and width; it only feeds
            ``input_shape`` (the network itself accepts any size).
        channels: expected input channels; it only feeds ``input_shape``.
        dtype: computation dtype; parameters stay float32, logits are float32.
    """

    stage_sizes: Sequence[int]
    block_cls: ModuleDef
    num_classes: int = 1000
    width: int = 64
    stem: str = "imagenet"
    image_size: int = 224
    channels: int = 3
    dtype: Any = jnp.float32
    act: Callable = nn.relu

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Per-example input shape ``(H, W, C)``."""
        return (self.image_size, self.image_size, self.channels)

    @property
    def stage_names(self) -> tuple[str, ...]:
        """Stages for ``research.steps.stages``: stem, every block, head."""
        blocks = [
            f"block{i + 1}_{j}"
            for i, size in enumerate(self.stage_sizes)
            for j in range(size)
        ]
        return ("stem", *blocks, "head")

    @nn.compact
    def __call__(
        self, x: jnp.ndarray, train: bool, stages: tuple[int, int] | None = None
    ) -> jnp.ndarray:
        """Logits ``(N, num_classes)`` for images ``(N, H, W, C)``.

        ``stages=(i, j)`` runs only stages ``i..j-1`` of ``stage_names`` (see
        ``models.staging``); every submodule is named as Flax would auto-name it.
        """
        conv = functools.partial(
            nn.Conv,
            use_bias=False,
            dtype=self.dtype,
            kernel_init=conv_init,
            # Same parameters; kernel gradient selectable (models.conv).
            conv_general_dilated=conv_general_dilated,
        )
        norm = functools.partial(
            nn.BatchNorm,
            use_running_average=not train,
            momentum=0.9,
            epsilon=1e-5,
            dtype=self.dtype,
        )
        if self.stem not in ("imagenet", "cifar"):
            raise ValueError(f"stem must be 'imagenet' or 'cifar', got {self.stem!r}")

        def stem(x):
            x = prepare(x, self.dtype)  # uint8 images: normalised here
            if self.stem == "imagenet":
                x = conv(
                    self.width, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], name="Conv_0"
                )(x)
                x = self.act(norm(name="bn_init")(x))
                return max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
            x = conv(self.width, (3, 3), (1, 1), name="Conv_0")(x)
            return self.act(norm(name="bn_init")(x))

        def block(k, filters, strides):
            def run(x):
                return self.block_cls(
                    filters,
                    strides=strides,
                    conv=conv,
                    norm=norm,
                    act=self.act,
                    name=f"{self.block_cls.__name__}_{k}",
                )(x)

            return run

        def head(x):
            x = jnp.mean(x, axis=(1, 2))
            x = TappedDense(
                self.num_classes,
                dtype=self.dtype,
                kernel_init=dense_init,
                name="Dense_0",
            )(x)
            return jnp.asarray(x, jnp.float32)

        fns = [stem]
        for i, block_size in enumerate(self.stage_sizes):
            for j in range(block_size):
                strides = (2, 2) if i > 0 and j == 0 else (1, 1)
                fns.append(block(len(fns) - 1, self.width * 2**i, strides))
        fns.append(head)
        return run_stages(x, fns, self.stage_names, stages)


ResNet18 = functools.partial(ResNet, stage_sizes=(2, 2, 2, 2), block_cls=ResNetBlock)
ResNet50 = functools.partial(
    ResNet, stage_sizes=(3, 4, 6, 3), block_cls=BottleneckResNetBlock
)
# About 78k parameters; trains in seconds on a laptop CPU at 32x32.
ResNetTiny = functools.partial(
    ResNet,
    stage_sizes=(1, 1, 1, 1),
    block_cls=ResNetBlock,
    width=8,
    stem="cifar",
    image_size=32,
    num_classes=10,
)
