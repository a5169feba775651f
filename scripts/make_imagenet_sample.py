"""An ImageNet-format sample: JPEGs a small model learns, and ImageNet's odd files.

    python -m scripts.make_imagenet_sample DIR --classes C --per-class N
    python -m scripts.make_imagenet_sample DIR --classes 10 --per-class 40 \\
        --val-per-class 10 --val-layout flat --sizes 48:96 --seed 0

Writes ``DIR/train/<wnid>/<wnid>_<i>.JPEG`` and either ``DIR/val/<wnid>/...``
(``--val-layout folders``) or a flat ``DIR/val/ILSVRC2012_val_<n>.JPEG`` with
``DIR/val_labels.txt`` (one ``FILE WNID`` line per image: the layout
``--dataset imagenet`` reads, ``research/data/imagenet/layout.py``), and
``DIR/sample.json`` (classes, counts, the odd files and what each should do).
Class ``k``'s wnid is ``n{k:08d}``, so sorted wnids are the class order.

The images look like photographs to a JPEG codec, not like flat test patterns:
a 1/f ("pink") noise field at about 64 px, upsampled (natural images have that
spectrum), mixing two colours, with a faint oriented grating, a few ellipses
and sensor-like noise; quality 90, 4:2:0. Their sides are drawn from
``--sizes`` (default 300:640, the range of most ImageNet training images, with
aspect ratios from 1:1 to 5:3, a quarter portrait): 70 KB on average at the
default sizes, as ImageNet's are. A class is its two colours' hues (evenly spaced
around the colour wheel), its grating's orientation and its ellipses' colour,
each jittered per image, so a random crop of any scale still shows the class:
``cnn_small`` at 32x32 learns 10 classes to well above chance in a few epochs.

With ``--odd`` (the default) the train split also holds one of each kind of
odd file ImageNet's train set has: a grayscale JPEG, a CMYK JPEG, a PNG named
``.JPEG``, a JPEG cut short in its image data (decodable in part): all four
are decoded; and two undecodable files (a JPEG cut inside its header, and a
JPEG marker followed by garbage), which training skips and counts. The val
split gets one undecodable file too.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

import numpy as np

#: What each odd file is and what reading it must give ("decoded": an image;
#: "undecodable": skipped and counted).
ODD_KINDS = {
    "grayscale": "decoded",
    "cmyk": "decoded",
    "png": "decoded",
    "truncated_data": "decoded",
    "truncated_header": "undecodable",
    "garbage": "undecodable",
}
VAL_ODD = "garbage"
QUALITY = 90


def wnid(k: int) -> str:
    """Class ``k``'s synset id: ``n`` and 8 digits, as ImageNet's."""
    return f"n{k:08d}"


def _pink_noise(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A 1/f noise field ``(h, w)`` in [0, 1]."""
    fy = np.fft.fftfreq(h)[:, None]
    fx = np.fft.rfftfreq(w)[None, :]
    f = np.sqrt(fx**2 + fy**2)
    f[0, 0] = 1.0
    spectrum = (rng.normal(size=f.shape) + 1j * rng.normal(size=f.shape)) / f**1.1
    spectrum[0, 0] = 0.0
    field = np.fft.irfft2(spectrum, s=(h, w))
    lo, hi = field.min(), field.max()
    return ((field - lo) / max(hi - lo, 1e-9)).astype(np.float32)


def _hsv_to_rgb(h: float, s: float, v: float) -> np.ndarray:
    import colorsys

    return np.array(colorsys.hsv_to_rgb(h % 1.0, s, v), np.float32) * 255.0


def _size(rng: np.random.Generator, lo: int, hi: int) -> tuple[int, int]:
    """``(height, width)``: the long side in [lo, hi], aspect 1 to 5:3."""
    long = int(rng.integers(max(lo, int(0.6 * hi)), hi + 1))
    short = int(np.clip(round(long * rng.uniform(0.6, 1.0)), lo, long))
    return (long, short) if rng.random() < 0.25 else (short, long)


def image(rng: np.random.Generator, cls: int, classes: int, h: int, w: int):
    """One RGB uint8 image ``(h, w, 3)`` of class ``cls`` of ``classes``."""
    import cv2

    def field(scale: int) -> np.ndarray:
        small = _pink_noise(rng, scale, max(8, round(scale * w / h)))
        return cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)

    base = cls / classes
    mix, detail = field(48), field(192)
    a = _hsv_to_rgb(
        base + rng.normal(0, 0.02), rng.uniform(0.5, 0.9), rng.uniform(0.5, 0.9)
    )
    b = _hsv_to_rgb(base + 0.5 / classes + rng.normal(0, 0.02), rng.uniform(0.3, 0.7),
                    rng.uniform(0.3, 0.95))  # fmt: skip
    img = a * (1.0 - mix[..., None]) + b * mix[..., None]
    theta = np.pi * cls / classes + rng.normal(0, 0.05)
    period = rng.uniform(0.04, 0.08) * max(h, w)
    ramp = np.arange(w, dtype=np.float32)[None, :] * np.float32(np.cos(theta))
    ramp = ramp + np.arange(h, dtype=np.float32)[:, None] * np.float32(np.sin(theta))
    shade = 0.7 + 0.6 * detail + 0.08 * np.sin(ramp * np.float32(2 * np.pi / period))
    mask = np.zeros((h, w), np.uint8)
    for _ in range(int(rng.integers(1, 4))):
        center = (int(rng.integers(0, w)), int(rng.integers(0, h)))
        axes = (
            int(rng.integers(w // 12, w // 4 + 2)),
            int(rng.integers(h // 12, h // 4 + 2)),
        )
        angle = float(rng.uniform(0, 180))
        cv2.ellipse(mask, center, axes, angle, 0, 360, 255, -1)
    mask = cv2.GaussianBlur(mask, (0, 0), 2.0).astype(np.float32)[..., None] / 255.0
    color = _hsv_to_rgb(base + 0.25 + rng.normal(0, 0.02), 0.7, 0.85)
    img = (img * (1.0 - mask) + color * mask) * shade[..., None]
    img += _grain(rng, h, w)
    return np.clip(img, 0, 255).astype(np.uint8)


_GRAIN: dict[int, np.ndarray] = {}


def _grain(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Sensor-like noise (sigma 5) ``(h, w, 3)``: a window of one tile drawn
    once per generator (drawing fresh normals took half of each image's time)."""
    tile = _GRAIN.get(id(rng))
    if tile is None or tile.shape[0] < 2 * h or tile.shape[1] < 2 * w:
        side = 2 * max(h, w, 640)
        tile = rng.standard_normal((side, side, 3), dtype=np.float32) * np.float32(5)
        _GRAIN.clear()
        _GRAIN[id(rng)] = tile
    y, x = (
        int(rng.integers(0, tile.shape[0] - h)),
        int(rng.integers(0, tile.shape[1] - w)),
    )
    return tile[y : y + h, x : x + w]


def jpeg(img: np.ndarray, quality: int = QUALITY) -> bytes:
    """``img`` (RGB or gray ``(h, w, 1)``) as JPEG bytes, 4:2:0 for colour."""
    import simplejpeg

    if img.ndim == 3 and img.shape[2] == 1:
        return simplejpeg.encode_jpeg(img, quality, colorspace="GRAY")
    return simplejpeg.encode_jpeg(
        img, quality, colorspace="RGB", colorsubsampling="420"
    )


def odd_file(kind: str, img: np.ndarray, rng: np.random.Generator) -> bytes:
    """The bytes of an odd file of ``kind`` (:data:`ODD_KINDS`) made from ``img``."""
    if kind == "grayscale":
        gray = img.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
        return jpeg(np.clip(gray, 0, 255).astype(np.uint8)[..., None])
    if kind == "cmyk":
        from PIL import Image

        out = io.BytesIO()
        Image.fromarray(img).convert("CMYK").save(out, "JPEG", quality=QUALITY)
        return out.getvalue()
    if kind == "png":
        import cv2

        ok, data = cv2.imencode(".png", img[..., ::-1])
        assert ok
        return data.tobytes()
    data = jpeg(img)
    if kind == "truncated_data":
        return data[: int(len(data) * 0.6)]
    if kind == "truncated_header":
        return data[:100]
    if kind == "garbage":
        return b"\xff\xd8" + rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()
    raise ValueError(f"unknown odd file kind {kind!r}")


def make_sample(
    root: str | Path,
    classes: int,
    per_class: int,
    *,
    val_per_class: int | None = None,
    val_layout: str = "folders",
    sizes: tuple[int, int] = (300, 640),
    odd: bool = True,
    seed: int = 0,
    quality: int = QUALITY,
) -> dict:
    """Writes the sample under ``root`` (see the module docstring); returns
    what ``sample.json`` holds."""
    if classes < 1 or per_class < 1:
        raise ValueError("--classes and --per-class must be >= 1")
    root = Path(root)
    val_n = max(1, per_class // 5) if val_per_class is None else val_per_class
    lo, hi = sizes
    rng = np.random.default_rng([seed, 50])
    wnids = [wnid(k) for k in range(classes)]
    odd_files: list[dict] = []
    kinds = list(ODD_KINDS) if odd else []
    val_labels: list[str] = []
    counts = {"train": 0, "val": 0}
    for split, n in (("train", per_class), ("val", val_n)):
        flat = split == "val" and val_layout == "flat"
        for k, w in enumerate(wnids):
            folder = root / split if flat else root / split / w
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                img = image(rng, k, classes, *_size(rng, lo, hi))
                if flat:
                    name = f"ILSVRC2012_val_{counts['val'] + 1:08d}.JPEG"
                    val_labels.append(f"{name} {w}")
                else:
                    name = f"{w}_{i}.JPEG"
                kind = None
                if split == "train" and kinds and i == 0:
                    kind = kinds.pop(0)
                elif split == "val" and odd and k == classes - 1 and i == n - 1:
                    kind = VAL_ODD
                data = jpeg(img, quality) if kind is None else odd_file(kind, img, rng)
                path = folder / name
                path.write_bytes(data)
                counts[split] += 1
                if kind is not None:
                    rel = path.relative_to(root).as_posix()
                    odd_files.append(
                        {"file": rel, "kind": kind, "expect": ODD_KINDS[kind]}
                    )
    if kinds:  # fewer classes than odd kinds: the rest go to class 0
        for j, kind in enumerate(kinds):
            path = root / "train" / wnids[0] / f"{wnids[0]}_odd{j}.JPEG"
            img = image(rng, 0, classes, *_size(rng, lo, hi))
            path.write_bytes(odd_file(kind, img, rng))
            counts["train"] += 1
            odd_files.append({"file": path.relative_to(root).as_posix(), "kind": kind,
                              "expect": ODD_KINDS[kind]})  # fmt: skip
    if val_layout == "flat":
        (root / "val_labels.txt").write_text("\n".join(val_labels) + "\n")
    record = {
        "classes": wnids,
        "train": counts["train"],
        "val": counts["val"],
        "val_layout": val_layout,
        "sizes": list(sizes),
        "seed": seed,
        "quality": quality,
        "odd_files": odd_files,
    }
    (root / "sample.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def _sizes(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    try:
        a, b = int(lo), int(hi if sep else lo)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected MIN:MAX in pixels, got {text!r}"
        ) from None
    if not 8 <= a <= b:
        raise argparse.ArgumentTypeError(f"need 8 <= MIN <= MAX, got {text!r}")
    return a, b


def main(argv: list[str] | None = None) -> int:
    from research.entry.cli import doc_parser

    p = doc_parser("python -m scripts.make_imagenet_sample", __doc__)
    p.add_argument("dir", type=Path, help="folder to write (created)")
    p.add_argument("--classes", type=int, default=10, help="default %(default)s")
    p.add_argument("--per-class", type=int, default=50, help="train images per class")
    p.add_argument("--val-per-class", type=int, help="default: per-class / 5")
    p.add_argument("--val-layout", choices=("folders", "flat"), default="folders")
    p.add_argument("--sizes", type=_sizes, default=(300, 640), metavar="MIN:MAX",
                   help="image sides in pixels; default 300:640")  # fmt: skip
    p.add_argument("--no-odd", dest="odd", action="store_false",
                   help="no odd files (gray, CMYK, PNG, cut, garbage)")  # fmt: skip
    p.add_argument("--quality", type=int, default=QUALITY, help="default %(default)s")
    p.add_argument("--seed", type=int, default=0, help="default %(default)s")
    args = p.parse_args(argv)
    if args.dir.exists() and any(args.dir.iterdir()):
        p.error(f"{args.dir} exists and is not empty; give a new folder")
    t0 = time.perf_counter()
    try:
        rec = make_sample(
            args.dir, args.classes, args.per_class, val_per_class=args.val_per_class,
            val_layout=args.val_layout, sizes=args.sizes, odd=args.odd,
            seed=args.seed, quality=args.quality,
        )  # fmt: skip
    except ValueError as e:
        p.error(str(e))
    print(
        f"{args.dir}: {rec['train']} train and {rec['val']} val images of "
        f"{len(rec['classes'])} classes ({len(rec['odd_files'])} odd files) in "
        f"{time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
