"""VGG-16 and small VGG-style CNNs in Flax linen.

Paper: Simonyan, Zisserman, *Very Deep Convolutional Networks for Large-Scale Image
Recognition* (ICLR 2015), configuration D. VGG-16 is the communication-heavy CNN of
data-parallel studies (138M parameters, most in the first fc layer), used by the
SC18 overlap paper.

The layout follows torchvision's ``vgg16``: 13 3x3 convolutions with bias and ReLU
in five stages, each closed by a 2x2 max-pool; adaptive average pooling of the
feature map to ``pooled_size`` x ``pooled_size``; fc 4096-4096 with ReLU and
dropout; the classifier. With the default ``pooled_size=7`` the first fc layer has
the same 25,088 inputs at any image size (at 224x224 the pooling is the identity),
so VGG-16 has 138,357,544 parameters at 1000 classes. For small images set
``pooled_size=1`` (global average pooling, the usual CIFAR variant): the first fc
layer then has 512 inputs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from models.conv import conv_general_dilated
from models.inputs import prepare
from models.pool import max_pool
from models.staging import TappedDense, run_stages

VGG16_STAGES = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512,) * 3)

# torchvision's VGG initialisation (untruncated normals, which also compile fast).
conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
dense_init = nn.initializers.normal(0.01)


def adaptive_avg_pool(x: jnp.ndarray, size: int) -> jnp.ndarray:
    """Average-pools ``(N, H, W, C)`` to ``(N, size, size, C)`` like PyTorch.

    Bin ``i`` covers rows ``floor(i*H/size)`` to ``ceil((i+1)*H/size)``, so bins
    overlap (or repeat, when ``H < size``) where ``size`` does not divide ``H``.

    Args:
        x: feature map, channels last.
        size: output height and width.

    Returns:
        The pooled feature map.
    """
    _, h, w, _ = x.shape
    if h == size and w == size:
        return x
    if h % size == 0 and w % size == 0:
        n, _, _, c = x.shape
        x = x.reshape(n, size, h // size, size, w // size, c)
        return x.mean(axis=(2, 4))

    def bins(n: int) -> list[tuple[int, int]]:
        return [(i * n // size, math.ceil((i + 1) * n / size)) for i in range(size)]

    rows = [
        jnp.stack([x[:, r0:r1, c0:c1].mean(axis=(1, 2)) for c0, c1 in bins(w)], 1)
        for r0, r1 in bins(h)
    ]
    return jnp.stack(rows, axis=1)


class VGG(nn.Module):
    """VGG-style CNN: conv stages with max-pools, then an fc head.

    Attributes:
        stages: conv widths per stage; every stage ends with a 2x2 max-pool.
        num_classes: size of the classifier output.
        fc: widths of the hidden fc layers (ReLU, then dropout).
        pooled_size: spatial size the last feature map is average-pooled to
            before flattening (7 as in torchvision; 1 for small images).
        dropout_rate: dropout after each hidden fc layer; needs the
            ``"dropout"`` rng when ``train=True`` and the rate is positive.
        image_size: expected input height and width; it only feeds
            ``input_shape`` (the network accepts any size of at least
            ``2**len(stages)``).
        channels: expected input channels; it only feeds ``input_shape``.
        dtype: computation dtype; parameters stay float32, logits are float32.
    """

    stages: Sequence[Sequence[int]] = VGG16_STAGES
    num_classes: int = 1000
    fc: Sequence[int] = (4096, 4096)
    pooled_size: int = 7
    dropout_rate: float = 0.5
    image_size: int = 224
    channels: int = 3
    dtype: Any = jnp.float32

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Per-example input shape ``(H, W, C)``."""
        return (self.image_size, self.image_size, self.channels)

    @property
    def stage_names(self) -> tuple[str, ...]:
        """Stages for ``research.steps.stages``: each conv stage with its pool,
        each hidden fc layer (the first also pools and flattens), the classifier."""
        convs = [f"conv{i + 1}" for i in range(len(self.stages))]
        fcs = [f"fc{i + 1}" for i in range(len(self.fc))]
        return (*convs, *fcs, "head")

    @nn.compact
    def __call__(
        self, x: jnp.ndarray, train: bool, stages: tuple[int, int] | None = None
    ) -> jnp.ndarray:
        """Logits ``(N, num_classes)`` for images ``(N, H, W, C)``.

        ``stages=(i, j)`` runs only stages ``i..j-1`` of ``stage_names`` (see
        ``models.staging``); every submodule is named as Flax would auto-name it.
        """

        def conv_stage(first, widths, cast):
            def run(x):
                if cast:  # uint8 images: normalised here (models.inputs)
                    x = prepare(x, self.dtype)
                for k, filters in enumerate(widths, first):
                    x = nn.Conv(
                        filters,
                        (3, 3),
                        dtype=self.dtype,
                        kernel_init=conv_init,
                        conv_general_dilated=conv_general_dilated,
                        name=f"Conv_{k}",
                    )(x)
                    x = nn.relu(x)
                return max_pool(x, (2, 2), strides=(2, 2))

            return run

        def flatten(x):
            x = adaptive_avg_pool(jnp.asarray(x, self.dtype), self.pooled_size)
            return x.reshape(x.shape[0], -1)

        def fc_stage(k, features):
            def run(x):
                if k == 0:
                    x = flatten(x)
                x = TappedDense(
                    features,
                    dtype=self.dtype,
                    kernel_init=dense_init,
                    name=f"Dense_{k}",
                )(x)
                x = nn.relu(x)
                return nn.Dropout(
                    self.dropout_rate, deterministic=not train, name=f"Dropout_{k}"
                )(x)

            return run

        def head(x):
            if not self.fc:
                x = flatten(x)
            x = TappedDense(
                self.num_classes,
                dtype=self.dtype,
                kernel_init=dense_init,
                name=f"Dense_{len(self.fc)}",
            )(x)
            return jnp.asarray(x, jnp.float32)

        fns, first = [], 0
        for i, widths in enumerate(self.stages):
            fns.append(conv_stage(first, widths, cast=i == 0))
            first += len(widths)
        fns += [fc_stage(k, features) for k, features in enumerate(self.fc)]
        fns.append(head)
        return run_stages(x, fns, self.stage_names, stages)


VGG16 = functools.partial(VGG, stages=VGG16_STAGES)
# Three stages of one conv each, global pooling, no dropout: about 30k parameters.
VGGTiny = functools.partial(
    VGG,
    stages=((16,), (32,), (64,)),
    fc=(64,),
    pooled_size=1,
    dropout_rate=0.0,
    image_size=32,
    num_classes=10,
)
# The default laptop model: two conv stages, a 4x4 feature map, one fc layer.
CNNSmall = functools.partial(
    VGG,
    stages=((32,), (64,)),
    fc=(128,),
    pooled_size=4,
    dropout_rate=0.0,
    image_size=32,
    num_classes=10,
)
