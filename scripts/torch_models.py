"""PyTorch twins of the benchmarked models, for ``scripts.bench_compute`` only.

The same architectures as ``models.resnet.ResNet50`` (v1.5, bias-free
convolutions, BatchNorm), ``models.vgg.VGG16`` (13 3x3 convolutions with bias,
adaptive average pooling, three fully connected layers with dropout) and
``models.candle.NT3`` (two valid Conv1D, max-pool, dense layers with dropout),
written here because torchvision is not a dependency. Parameter counts are
checked against the Flax models by the benchmark before timing. Importing this
module needs ``torch`` (the optional ``bench`` dependency group).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class Bottleneck(nn.Module):
    """1x1, 3x3 (strided, v1.5), 1x1 with 4x expansion; projection when needed."""

    def __init__(self, cin: int, filters: int, stride: int) -> None:
        super().__init__()
        out = filters * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, filters, 1, bias=False),
            nn.BatchNorm2d(filters),
            nn.ReLU(inplace=True),
            nn.Conv2d(filters, filters, 3, stride, 1, bias=False),
            nn.BatchNorm2d(filters),
            nn.ReLU(inplace=True),
            nn.Conv2d(filters, out, 1, bias=False),
            nn.BatchNorm2d(out),
        )
        self.proj = None
        if stride != 1 or cin != out:
            self.proj = nn.Sequential(
                nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x if self.proj is None else self.proj(x)
        return torch.relu(self.body(x) + residual)


def resnet50(num_classes: int = 1000) -> nn.Module:
    """ResNet-50 v1.5 with the ImageNet stem."""
    layers: list[nn.Module] = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = 64
    for i, blocks in enumerate((3, 4, 6, 3)):
        for j in range(blocks):
            stride = 2 if i > 0 and j == 0 else 1
            layers.append(Bottleneck(cin, 64 * 2**i, stride))
            cin = 64 * 2**i * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    return nn.Sequential(*layers)


def vgg16(num_classes: int = 1000, dropout: float = 0.5) -> nn.Module:
    """VGG-16 (configuration D) with 7x7 adaptive pooling, as torchvision's."""
    widths: Sequence[Sequence[int]] = (
        (64, 64),
        (128, 128),
        (256, 256, 256),
        (512, 512, 512),
        (512, 512, 512),
    )
    layers: list[nn.Module] = []
    cin = 3
    for stage in widths:
        for width in stage:
            layers += [nn.Conv2d(cin, width, 3, padding=1), nn.ReLU(inplace=True)]
            cin = width
        layers.append(nn.MaxPool2d(2, 2))
    layers += [nn.AdaptiveAvgPool2d(7), nn.Flatten()]
    features = cin * 49
    for width in (4096, 4096):
        layers += [nn.Linear(features, width), nn.ReLU(inplace=True)]
        layers.append(nn.Dropout(dropout))
        features = width
    layers.append(nn.Linear(features, num_classes))
    return nn.Sequential(*layers)


class _NT3(nn.Module):
    def __init__(self, features: int, num_classes: int) -> None:
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv1d(1, 128, 20),
            nn.ReLU(inplace=True),
            nn.Conv1d(128, 128, 10),
            nn.ReLU(inplace=True),
            nn.MaxPool1d(10),
            nn.Flatten(),
        )
        flat = (features - 19 - 9) // 10 * 128
        self.dense = nn.Sequential(
            nn.Linear(flat, 200),
            nn.ReLU(inplace=True),
            nn.Dropout(0.1),
            nn.Linear(200, 20),
            nn.ReLU(inplace=True),
            nn.Dropout(0.1),
            nn.Linear(20, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(self.convs(x))


def candle_nt3(features: int, num_classes: int = 2) -> nn.Module:
    """CANDLE NT3 on inputs ``(N, 1, features)``."""
    return _NT3(features, num_classes)


def param_count(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
