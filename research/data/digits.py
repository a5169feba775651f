"""The UCI handwritten digits that scikit-learn ships inside its wheel: real data, no
download.

``sklearn.datasets.load_digits`` returns 1,797 grey 8x8 images of the digits 0-9
(about 180 per class), each pixel a count 0-16 of set pixels in a 4x4 block of the
original 32x32 bitmap (UCI "Optical Recognition of Handwritten Digits", its
preprocessed test part). scikit-learn is an optional dependency (the ``data``
group of ``pyproject.toml``); without it this loader raises one line naming the
package and the pip command.

The split is stratified and seeded: each class's images are shuffled with the
seed and the first ``test_fraction`` of them become the test set, so the same seed
gives the same split on every machine and every class is in both splits in the
same proportion. Images come as NHWC ``(8, 8, 1)``: ``cnn_small`` (two 2x2
pools, 8 -> 2) takes them as they are; ``image_size=16`` or ``32`` repeats every
pixel (nearest neighbour) for models that pool more often.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from research.data.base import DataError, Dataset, register

#: The optional dependency and how to get it (also in ``pyproject.toml``'s ``data``).
REQUIREMENT = "scikit-learn>=1.5,<2"
NATIVE_SIZE = 8
MAX_VALUE = 16.0  # pixel values are counts 0..16


def _load_sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    """``(images, labels)`` as scikit-learn ships them: float64 (1797, 8, 8), int."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DataError(
            "dataset 'digits' needs scikit-learn, which is not installed: "
            f"pip install '{REQUIREMENT}' (or pip install -e '.[data]')"
        ) from None
    bunch = load_digits()
    return np.asarray(bunch.images), np.asarray(bunch.target)


def stratified_split(
    labels: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded train and test indices holding ``test_fraction`` of every class.

    Args:
      labels: int labels of the whole set.
      test_fraction: share of each class that goes to the test split.
      seed: the shuffle's seed (numpy PCG64: the same on every machine).

    Returns:
      ``(train_idx, test_idx)``, each sorted, disjoint, covering every index.
    """
    rng = np.random.default_rng([seed, 13])
    train, test = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        k = int(round(test_fraction * idx.size))
        test.append(idx[:k])
        train.append(idx[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


@register("digits")
def load_digits_dataset(
    *,
    path: str | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
    image_size: int = NATIVE_SIZE,
    normalize: bool = True,
) -> Dataset:
    """Loads the scikit-learn digits as NHWC float32 with a seeded stratified split.

    Args:
      path: ignored (the data are inside scikit-learn's wheel).
      seed: seed of the split.
      test_fraction: share of each class in the test split, in (0, 1).
      image_size: 8 (native) or a multiple of 8: each pixel repeated
        ``image_size // 8`` times per axis, for models that need larger inputs.
      normalize: subtract the mean and divide by the std of the training pixels
        (else values are in ``[0, 1]``, the counts divided by 16).

    Returns:
      The dataset, ``input_shape`` ``(image_size, image_size, 1)``, 10 classes.

    Raises:
      DataError: scikit-learn is not installed, or an option is out of range.
    """
    del path
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"digits: test_fraction must be in (0, 1), got {test_fraction}")
    if image_size < NATIVE_SIZE or image_size % NATIVE_SIZE:
        raise DataError(
            f"digits: image_size must be a multiple of {NATIVE_SIZE}, got {image_size}"
        )
    images, labels = _load_sklearn_digits()
    x = (images / MAX_VALUE).astype(np.float32)[..., None]  # (N, 8, 8, 1) in [0, 1]
    factor = image_size // NATIVE_SIZE
    if factor > 1:
        x = x.repeat(factor, axis=1).repeat(factor, axis=2)
    train_idx, test_idx = stratified_split(labels, test_fraction, seed)
    train_x, test_x = x[train_idx], x[test_idx]
    meta: dict[str, Any] = {
        "source": "sklearn.datasets.load_digits (UCI optdigits)",
        "seed": seed,
        "test_fraction": test_fraction,
        "normalize": normalize,
        "upsample": factor,
    }
    if normalize:
        # One mean and std over all training pixels (one channel); the test set
        # is scaled with the training statistics, never its own.
        mean = np.float32(train_x.mean(dtype=np.float64))
        std = np.float32(train_x.std(dtype=np.float64)) or np.float32(1.0)
        train_x = (train_x - mean) / std
        test_x = (test_x - mean) / std
        meta.update(mean=float(mean), std=float(std))
    return Dataset(
        train_x,
        labels[train_idx],
        test_x,
        labels[test_idx],
        10,
        "digits",
        (image_size, image_size, 1),
        meta=meta,
    )
