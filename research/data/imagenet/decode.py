"""Image bytes to RGB pixels: JPEGs at reduced scale in the DCT domain, others whole.

:func:`open_image` reads only a JPEG's header (its size), so a transform can
choose its crop first and then decode at the smallest of libjpeg-turbo's
scales (n/8, n = 1..8) that still gives the crop at least the output's size
(:meth:`Image.pixels`): a 500x375 photo cropped to 40% of its area and resized
to 224 decodes at 5/8 scale, about 40% of the full decode's work. JPEGs go
through simplejpeg (libjpeg-turbo), which also converts grayscale and CMYK
(Adobe) JPEGs to RGB and, with ``strict=False``, decodes a file cut short in
its image data as far as it goes (the rest grey), as ImageNet's few truncated
files are usually read. What is not a JPEG (ImageNet's train set holds PNGs
and a CMYK TIFF-in-JPEG or two under ``.JPEG`` names) is decoded whole by
OpenCV, else Pillow. What none of them can read raises :class:`Undecodable`,
which the pipeline counts and replaces (``research/data/imagenet/pipeline.py``).

Why these: ``python -m scripts.bench_input`` (one core, 400 generated JPEGs of
333-640 px, 53 KB on average; the medians of four runs on this project's
2-core machine, whose speed varied 2x from run to run): full decode alone ran
at 588-1021 images/s with simplejpeg and 364-673 with Pillow; this module plus
``transforms.py`` (crop, scaled decode, resize, flip) at 321-693 against
torchvision's Pillow path at 161-323 (float normalised) and 194-397 (uint8),
1.8-2.2x the float path within every run. At
224 px from ImageNet's sizes most crops need the full scale; the scaled decode
pays off on larger photos and smaller outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: A JPEG file starts with the SOI marker.
JPEG_SOI = b"\xff\xd8"


class Undecodable(ValueError):
    """Bytes that no decoder here turns into an image; the message says why."""


@dataclass
class Image:
    """An image whose size is known and whose pixels are decoded on demand.

    Attributes:
      height: full-scale height in pixels.
      width: full-scale width in pixels.
      data: the file's bytes (a JPEG, decoded at reduced scale on demand).
      array: the pixels when already decoded (not a JPEG), ``(H, W, 3)`` uint8.
    """

    height: int
    width: int
    data: bytes
    array: np.ndarray | None = None

    def pixels(self, min_height: int = 0, min_width: int = 0) -> np.ndarray:
        """RGB uint8 ``(h, w, 3)``: the whole image at the smallest scale with
        ``h >= min_height`` and ``w >= min_width`` (full scale at most; 0: no
        bound). A non-JPEG comes at full scale.

        Raises:
          Undecodable: the image data cannot be decoded.
        """
        if self.array is not None:
            return self.array
        import simplejpeg

        try:
            return simplejpeg.decode_jpeg(
                self.data,
                colorspace="RGB",
                min_height=min(max(0, min_height), self.height),
                min_width=min(max(0, min_width), self.width),
                strict=False,
            )
        except Exception as e:  # simplejpeg raises ValueError and others
            raise Undecodable(f"JPEG data: {e}") from None


def open_image(data: bytes) -> Image:
    """The image in ``data``: a JPEG's header only, anything else decoded.

    Raises:
      Undecodable: empty, unreadable, or in no format OpenCV or Pillow knows.
    """
    if not data:
        raise Undecodable("empty file")
    if data[:2] == JPEG_SOI:
        import simplejpeg

        try:
            h, w, _, _ = simplejpeg.decode_jpeg_header(data, strict=False)
        except Exception as e:  # KeyError for some broken headers
            # A JPEG name on a file libjpeg-turbo cannot read: Pillow may.
            array = _decode_other(data)
            if array is None:
                raise Undecodable(f"JPEG header: {e!r}") from None
            return Image(array.shape[0], array.shape[1], data, array)
        return Image(int(h), int(w), data)
    array = _decode_other(data)
    if array is None:
        raise Undecodable(f"not a JPEG, and neither OpenCV nor Pillow reads it "
                          f"(starts {data[:8]!r})")  # fmt: skip
    return Image(array.shape[0], array.shape[1], data, array)


def _decode_other(data: bytes) -> np.ndarray | None:
    """RGB uint8 pixels of ``data`` by OpenCV, else Pillow; None if neither."""
    import cv2

    buf = np.frombuffer(data, np.uint8)
    try:
        bgr = cv2.imdecode(buf, cv2.IMREAD_COLOR)
    except cv2.error:
        bgr = None
    if bgr is not None and bgr.ndim == 3 and min(bgr.shape[:2]) > 0:
        return np.ascontiguousarray(bgr[..., ::-1])
    import io

    from PIL import Image as PILImage

    try:
        with PILImage.open(io.BytesIO(data)) as im:
            rgb = np.asarray(im.convert("RGB"))
    except Exception:  # Pillow raises many kinds on bad input
        return None
    return rgb if rgb.ndim == 3 and min(rgb.shape[:2]) > 0 else None


def decode(data: bytes) -> np.ndarray:
    """The whole image at full scale, RGB uint8 (the benchmark's floor).

    Raises:
      Undecodable: as :func:`open_image`.
    """
    return open_image(data).pixels()


def scale_for(full: int, part: int, out: int) -> int:
    """The smallest decoded length of a ``full``-long side whose ``part`` is
    still at least ``out`` long (``full`` when ``part`` is shorter than
    ``out``: never decode above full scale)."""
    if part <= 0:
        return full
    return min(full, math.ceil(out * full / part))
