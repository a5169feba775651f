"""ImageNet's training and evaluation transforms, uint8 in and out, crop before decode.

Training: RandomResizedCrop (area 8-100% of the image, aspect ratio 3/4 to 4/3,
torchvision's sampling: ten tries, then the centre crop of the clamped ratio)
and a horizontal flip with probability 1/2. Evaluation: the shorter side
resized to ``size / 0.875`` (256 for 224), the centre ``size x size``. Both
give ``(size, size, 3)`` uint8 RGB: normalising (ImageNet's mean and std) and
the cast to the model's dtype happen on the device, in the model's stem
(``models/inputs.py``), inside the jitted step.

Per sample, in this order: the crop box is drawn from the JPEG's header size
(:func:`crop_box`), the JPEG is decoded at the smallest DCT scale that keeps
the box at least ``size`` wide and high (``research/data/imagenet/decode.py``),
the box is cut from it and resized by OpenCV. Its randomness comes from
:func:`sample_rng` of (seed, epoch, example index) alone, never from a stream,
so a sample's crop is the same whatever rank, worker or resume reads it.

The issue's measurement (torchvision's CPU path at about 400 images/s a core,
490 with uint8 out and no normalise) is why the host stays uint8 and crops
before it resizes; this path's own figures against torchvision's, on the same
files in the same run, are ``python -m scripts.bench_input``'s (``decode.py``
quotes them).
"""

from __future__ import annotations

import math

import numpy as np

from research.data.imagenet.decode import Image, scale_for

SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)
#: Evaluation's crop: the centre ``size`` of the image resized to ``size / CROP``.
CROP = 0.875
#: Tag mixed into every sample's seed, so it differs from other streams' seeds.
_TAG = 0x1A6E


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of one sample's augmentation: a function of
    ``(seed, epoch, index)`` only."""
    return np.random.default_rng([_TAG, seed, epoch, index])


def crop_box(
    rng: np.random.Generator,
    height: int,
    width: int,
    scale: tuple[float, float] = SCALE,
    ratio: tuple[float, float] = RATIO,
) -> tuple[int, int, int, int]:
    """``(top, left, h, w)`` of a random crop, as torchvision's
    ``RandomResizedCrop.get_params`` draws it."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    in_ratio = width / height  # the fallback: the whole image, ratio clamped
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        h, w = height, round(height * ratio[1])
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def centre_box(height: int, width: int, size: int, crop: float = CROP):
    """``(top, left, h, w)`` of evaluation's centre crop at full scale: the
    square that is ``size`` of the shorter side resized to ``size / crop``."""
    side = max(1, min(height, width, round(min(height, width) * crop)))
    return (height - side) // 2, (width - side) // 2, side, side


def cut_and_resize(
    image: Image, box: tuple[int, int, int, int], size: int
) -> np.ndarray:
    """``box`` (full-scale coordinates) of ``image`` as ``(size, size, 3)``
    uint8, decoded at the smallest scale that keeps the box ``size`` wide."""
    import cv2

    top, left, h, w = box
    px = image.pixels(scale_for(image.height, h, size), scale_for(image.width, w, size))
    sy, sx = px.shape[0] / image.height, px.shape[1] / image.width
    y0, x0 = int(top * sy), int(left * sx)
    y1 = min(px.shape[0], max(y0 + 1, round((top + h) * sy)))
    x1 = min(px.shape[1], max(x0 + 1, round((left + w) * sx)))
    part = px[y0:y1, x0:x1]
    if part.shape[0] == size and part.shape[1] == size:
        return np.ascontiguousarray(part)
    # Below half size a linear resize skips pixels (aliasing); area averages.
    shrink = min(part.shape[0], part.shape[1]) >= 2 * size
    how = cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
    return cv2.resize(part, (size, size), interpolation=how)


def train_transform(image: Image, size: int, rng: np.random.Generator) -> np.ndarray:
    """RandomResizedCrop to ``size`` and a random horizontal flip, uint8."""
    box = crop_box(rng, image.height, image.width)
    flip = rng.random() < 0.5
    out = cut_and_resize(image, box, size)
    return np.ascontiguousarray(out[:, ::-1]) if flip else out


def eval_transform(image: Image, size: int) -> np.ndarray:
    """Resize the shorter side to ``size / 0.875``, centre crop ``size``, uint8."""
    return cut_and_resize(image, centre_box(image.height, image.width, size), size)
