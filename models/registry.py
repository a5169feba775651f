"""Model registry: build a Flax module by name, ask its input shape and size.

The models are those of the five reproduced papers (ResNet-50, VGG-16, CANDLE NT3
and P1B2, plus ResNet-18) and small variants that train in seconds on a laptop
CPU. Options are the module's dataclass fields, so the same ``options`` dict
serves ``get_model``, ``input_shape`` and ``count_params``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import flax.linen as nn

#: Every model by name: the module that defines it and the factory's name there.
#: Names are known without importing them, so ``list_models`` needs neither JAX
#: nor Flax: a launcher checks a ``--model`` before it starts any rank, and
#: importing JAX and Flax was most of its start (0.7 of about 1 CPU-s).
_MODELS: dict[str, tuple[str, str]] = {
    "resnet18": ("models.resnet", "ResNet18"),
    "resnet50": ("models.resnet", "ResNet50"),
    "resnet_tiny": ("models.resnet", "ResNetTiny"),
    "vgg16": ("models.vgg", "VGG16"),
    "vgg_tiny": ("models.vgg", "VGGTiny"),
    "cnn_small": ("models.vgg", "CNNSmall"),
    "candle_p1b2": ("models.candle", "P1B2"),
    "candle_p1b2_tiny": ("models.candle", "P1B2Tiny"),
    "candle_nt3": ("models.candle", "NT3"),
    "candle_nt3_tiny": ("models.candle", "NT3Tiny"),
}


def _factory(name: str) -> Callable[..., nn.Module]:
    from models import candle, resnet, vgg

    modules = {"models.candle": candle, "models.resnet": resnet, "models.vgg": vgg}
    module, attr = _MODELS[name]
    return getattr(modules[module], attr)


# Fields every linen Module has that are not model options.
_NOT_OPTIONS = {"parent", "name"}


def list_models() -> list[str]:
    """Names accepted by ``get_model``, sorted."""
    return sorted(_MODELS)


def _options_of(factory: Callable[..., nn.Module]) -> list[str]:
    cls = getattr(factory, "func", factory)
    return sorted(f.name for f in dataclasses.fields(cls) if f.name not in _NOT_OPTIONS)


def get_model(name: str, num_classes: int | None = None, **options: Any) -> nn.Module:
    """Builds a registered model.

    Args:
        name: one of ``list_models()``.
        num_classes: classifier size; ``None`` keeps the model's default (1000
            for ImageNet models, 10 for P1B2 and the small image models, 2 for
            NT3).
        **options: module fields, e.g. ``width=32, stem="cifar"`` for ResNets,
            ``pooled_size=1, dropout_rate=0.0`` for VGG, ``features=2000`` for
            CANDLE, ``image_size`` for image models, ``dtype`` (a dtype or its
            name, e.g. ``"bfloat16"``) for all.

    Returns:
        An unbound ``flax.linen.Module``; call it as ``model.apply(variables, x,
        train=...)``. Its ``input_shape`` attribute is the per-example shape.

    Raises:
        ValueError: for an unknown name or option; the message lists valid ones.
    """
    if name not in _MODELS:
        raise ValueError(
            f"unknown model {name!r}; valid models: {', '.join(list_models())}"
        )
    factory = _factory(name)
    valid = _options_of(factory)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for model {name!r}; "
            f"valid options: {', '.join(valid)}"
        )
    if isinstance(options.get("dtype"), str):
        import jax.numpy as jnp

        options["dtype"] = jnp.dtype(options["dtype"])
    if num_classes is not None:
        options["num_classes"] = num_classes
    return factory(**options)


def input_shape(name: str, **options: Any) -> tuple[int, ...]:
    """Per-example input shape of a model, e.g. ``(224, 224, 3)`` or ``(28204,)``.

    Args:
        name: one of ``list_models()``.
        **options: the options given to ``get_model`` (``image_size``,
            ``channels`` or ``features`` change the shape; others are ignored).

    Returns:
        The shape without the batch axis.
    """
    options.pop("num_classes", None)
    return tuple(get_model(name, **options).input_shape)


def count_params(model: nn.Module, shape: tuple[int, ...] | None = None) -> int:
    """Number of scalars in the ``params`` collection, without allocating them.

    Args:
        model: a module from ``get_model``.
        shape: per-example input shape; defaults to ``model.input_shape``.

    Returns:
        The parameter count (batch statistics excluded).
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    shape = tuple(shape or model.input_shape)
    x = jax.ShapeDtypeStruct((1, *shape), jnp.float32)
    rngs = {"params": jax.random.key(0), "dropout": jax.random.key(1)}
    variables = jax.eval_shape(lambda x: model.init(rngs, x, train=False), x)
    leaves = jax.tree_util.tree_leaves(variables["params"])
    return int(sum(np.prod(leaf.shape) for leaf in leaves))
