"""Flax models of the reproduced papers and a registry to build them by name.

``get_model(name, num_classes=None, **options)`` builds one of ``list_models()``;
``input_shape(name, **options)`` (or ``model.input_shape``) gives the per-example
input shape for dummy inputs; ``count_params(model)`` counts parameters without
allocating them. Every module is called as ``model.apply(variables, x,
train=...)``; ResNets keep BatchNorm statistics in the mutable ``batch_stats``
collection, and models with dropout want a ``"dropout"`` rng when ``train=True``.

=================  ===========================================  ===============
name               model                                        input (default)
=================  ===========================================  ===============
resnet18           ResNet-18, basic blocks [2, 2, 2, 2]          (224, 224, 3)
resnet50           ResNet-50 v1.5, bottlenecks [3, 4, 6, 3]      (224, 224, 3)
resnet_tiny        basic blocks [1, 1, 1, 1], width 8, cifar     (32, 32, 3)
vgg16              VGG-16, fc 4096-4096, dropout 0.5             (224, 224, 3)
vgg_tiny           3 conv stages (16-32-64), global pool, fc 64  (32, 32, 3)
cnn_small          2 conv stages (32-64), fc 128: laptop default (32, 32, 3)
candle_p1b2        CANDLE P1B2 MLP 1024-512-256                  (28204,)
candle_p1b2_tiny   MLP 64-32-16                                  (256,)
candle_nt3         CANDLE NT3 Conv1D x2, dense 200-20            (60483, 1)
candle_nt3_tiny    NT3 with 16 filters, dense 32-16              (512, 1)
=================  ===========================================  ===============

Importing the package changes nothing in the process, and imports neither JAX
nor Flax: the model classes load when first used (``models.ResNet50``,
``get_model``), so a launcher can check a model's name quickly. The XLA:CPU flag its
models train faster with (``models.xla_cpu``: convolutions on Eigen's thread
pool instead of single-threaded YNNPACK) is set by the project's launchers and
experiments for their own ranks; in your own program call
``models.xla_cpu.apply()`` before the first JAX computation to get it.

This package imports nothing from ``research`` or ``experiments``.
"""

from models import xla_cpu  # noqa: F401 - models.xla_cpu.apply() for users
from models.registry import count_params, get_model, input_shape, list_models

#: The model classes, imported on first use (PEP 562): each module imports Flax.
_CLASSES = {
    "NT3": "models.candle",
    "P1B2": "models.candle",
    "ResNet": "models.resnet",
    "ResNet18": "models.resnet",
    "ResNet50": "models.resnet",
    "ResNetTiny": "models.resnet",
    "VGG": "models.vgg",
    "VGG16": "models.vgg",
}


def __getattr__(name: str):
    if name in _CLASSES:
        from models import candle, resnet, vgg

        modules = {"models.candle": candle, "models.resnet": resnet, "models.vgg": vgg}
        return getattr(modules[_CLASSES[name]], name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")


__all__ = [
    "NT3",
    "P1B2",
    "VGG",
    "VGG16",
    "ResNet",
    "ResNet18",
    "ResNet50",
    "ResNetTiny",
    "count_params",
    "get_model",
    "input_shape",
    "list_models",
]
