"""Seeded synthetic tasks, the embedded default: no download, learnable, deterministic.

Each task has the shape of a real dataset the papers use, and labels that depend on
the inputs in a way the matching model learns within a few hundred SGD steps, so an
accuracy curve means something even on a laptop. The same seed gives the same arrays
on every machine (numpy's PCG64 stream is platform independent).

=================  ==========================  ======================  ===============
name               example shape (default)     default n_train/n_test  float32 size
=================  ==========================  ======================  ===============
synthetic_images   (16, 16, 3), 10 classes     8192 / 2048             30 MiB
synthetic_tabular  (28204,), 10 classes        3000 / 1000             430 MiB
synthetic_nt3      (60483, 1), 2 classes       1120 / 280              323 MiB
=================  ==========================  ======================  ===============

The tabular and NT3 defaults match the real CANDLE sizes; pass ``features=512`` (or
similar) for laptop runs, which also makes generation take milliseconds.
"""

from __future__ import annotations

import numpy as np

from research.data.base import Dataset, register


def _split(x: np.ndarray, y: np.ndarray, n_train: int) -> tuple[np.ndarray, ...]:
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def _check_sizes(name: str, n_train: int, n_test: int, num_classes: int) -> None:
    if n_train < 1 or n_test < 1:
        raise ValueError(f"{name}: n_train and n_test must be >= 1")
    if num_classes < 2:
        raise ValueError(f"{name}: num_classes must be >= 2")


def _smooth_templates(
    rng: np.random.Generator, k: int, h: int, w: int, c: int, max_freq: int = 2
) -> np.ndarray:
    """``k`` random low-frequency patterns of shape (h, w, c), each of unit std."""
    # A sum of a few sinusoids whose wavelength is at least half the image: smooth
    # enough that a shift of a pixel or two barely changes a pattern, so shifting
    # is a nuisance a CNN absorbs rather than a change of class.
    fy, fx = np.meshgrid(
        np.arange(-max_freq, max_freq + 1), np.arange(-max_freq, max_freq + 1)
    )
    fy, fx = fy.ravel(), fx.ravel()
    yy = np.arange(h)[:, None, None] / h
    xx = np.arange(w)[None, :, None] / w
    phase = 2 * np.pi * (yy * fy + xx * fx)  # (h, w, F)
    coef = rng.normal(size=(k, c, fy.size))
    offs = rng.uniform(0, 2 * np.pi, size=(k, c, fy.size))
    # sum_f coef * cos(phase + off) = cos(phase) @ (coef cos off) - sin(phase) @
    # (coef sin off): two matrix products instead of h*w*k*c*F cosines (4e9 at
    # 224x224 and 1000 classes, where the direct tensor alone is 29 GiB).
    cos_p = np.cos(phase).reshape(h * w, fy.size)
    sin_p = np.sin(phase).reshape(h * w, fy.size)
    out = np.empty((k, h, w, c), np.float32)
    step = max(1, int(64e6 // (h * w * c * 8)))  # classes per ~64 MB product
    for i in range(0, k, step):
        a = (coef[i : i + step] * np.cos(offs[i : i + step])).reshape(-1, fy.size)
        b = (coef[i : i + step] * np.sin(offs[i : i + step])).reshape(-1, fy.size)
        t = (cos_p @ a.T - sin_p @ b.T).reshape(h, w, -1, c).transpose(2, 0, 1, 3)
        t -= t.mean(axis=(1, 2, 3), keepdims=True)
        t /= t.std(axis=(1, 2, 3), keepdims=True)
        out[i : i + step] = t
    return out


@register("synthetic_images")
def synthetic_images(
    *,
    path: str | None = None,
    seed: int = 0,
    n_train: int = 8192,
    n_test: int = 2048,
    num_classes: int = 10,
    image_size: int = 16,
    channels: int = 3,
    noise: float = 1.0,
    max_shift: int = 2,
) -> Dataset:
    """Images whose class is a smooth random template, seen shifted, scaled and noisy.

    Each example is ``a * T[y]`` cropped at a random offset of up to ``max_shift``
    pixels, plus ``b * T[other]`` for a random other class (a distractor that makes
    the task less than trivial), a per-channel brightness offset and Gaussian pixel
    noise of std ``noise``; ``a ~ U(0.6, 1.4)``, ``b ~ U(0, 0.9)``. The few examples
    whose distractor outweighs their class leave a Bayes error of a few percent, so
    accuracy keeps improving for a while instead of saturating at once; a two-layer
    CNN reaches about 89% test accuracy after 300 SGD steps of batch 64 (defaults).

    Args:
      path: ignored (synthetic).
      seed: generation seed; the same seed gives the same arrays.
      n_train: training examples.
      n_test: test examples.
      num_classes: number of classes (templates).
      image_size: height and width.
      channels: channels per pixel.
      noise: std of the per-pixel Gaussian noise (templates have std 1).
      max_shift: largest random shift, in pixels, per axis.

    Returns:
      NHWC images, zero mean and about unit std.
    """
    del path
    _check_sizes("synthetic_images", n_train, n_test, num_classes)
    rng = np.random.default_rng([seed, 1])
    n, s, hw = n_train + n_test, max_shift, image_size
    big = _smooth_templates(rng, num_classes, hw + 2 * s, hw + 2 * s, channels)
    y = rng.integers(0, num_classes, size=n)
    other = (y + rng.integers(1, num_classes, size=n)) % num_classes
    a = rng.uniform(0.6, 1.4, size=(n, 1, 1, 1)).astype(np.float32)
    b = rng.uniform(0.0, 0.9, size=(n, 1, 1, 1)).astype(np.float32)

    def crops(labels: np.ndarray) -> np.ndarray:
        # One gather for all examples: rows/cols index the padded template at a
        # random offset per example, which is a shift without wrap-around.
        oy = rng.integers(0, 2 * s + 1, size=n)[:, None] + np.arange(hw)
        ox = rng.integers(0, 2 * s + 1, size=n)[:, None] + np.arange(hw)
        return big[labels[:, None, None], oy[:, :, None], ox[:, None, :]]

    x = a * crops(y) + b * crops(other)
    x += rng.normal(0, 0.3, size=(n, 1, 1, channels)).astype(np.float32)
    x += noise * rng.standard_normal(size=x.shape, dtype=np.float32)
    x /= np.float32(np.sqrt(1.0 + noise**2))
    tx, ty, vx, vy = _split(x, y, n_train)
    return Dataset(
        tx, ty, vx, vy, num_classes, "synthetic_images", (hw, hw, channels),
        meta={"seed": seed, "noise": noise, "max_shift": max_shift},
    )  # fmt: skip


@register("synthetic_tabular")
def synthetic_tabular(
    *,
    path: str | None = None,
    seed: int = 0,
    n_train: int = 3000,
    n_test: int = 1000,
    num_classes: int = 10,
    features: int = 28204,
    density: float = 0.01,
    drivers: int = 16,
    hit_rate: float = 0.2,
) -> Dataset:
    """Sparse mutation-profile-like vectors shaped like CANDLE P1B2 (28204 genes).

    Every example carries background "mutations": each feature is non-zero with
    probability ``density``. Each class has ``drivers`` random driver features, and
    an example of that class also hits each of its class's drivers with probability
    ``hit_rate``. Non-zero values are impact scores in ``[0.5, 1.5)``. With the
    defaults about 97% of examples hit at least one driver; the P1B2 MLP
    (1024-512-256) reaches about 90% test accuracy after 300 SGD steps of batch 64
    at ``features=512``. Raise ``density`` or lower ``hit_rate`` for harder.

    Args:
      path: ignored (synthetic).
      seed: generation seed.
      n_train: training examples (real P1B2: 3000 incl. validation).
      n_test: test examples (real P1B2: 1000).
      num_classes: number of classes.
      features: input width; 28204 as the real data, 512 or so on a laptop.
      density: background fraction of non-zero features.
      drivers: driver features per class.
      hit_rate: probability that an example hits each driver of its class.

    Returns:
      Inputs of shape ``(features,)``, non-negative and mostly zero.
    """
    del path
    _check_sizes("synthetic_tabular", n_train, n_test, num_classes)
    if drivers < 1 or drivers * num_classes > features:
        raise ValueError("synthetic_tabular: need 1 <= drivers * classes <= features")
    rng = np.random.default_rng([seed, 2])
    n = n_train + n_test
    y = rng.integers(0, num_classes, size=n)
    x = np.zeros((n, features), dtype=np.float32)
    # Scatter the non-zeros instead of drawing a dense (n, features) random matrix:
    # that keeps the real 28204-wide default at ~0.1 s instead of several seconds.
    nnz = rng.binomial(features, density, size=n)
    rows = np.repeat(np.arange(n), nnz)
    cols = rng.integers(0, features, size=rows.size)
    x[rows, cols] = rng.uniform(0.5, 1.5, size=rows.size)
    driver_cols = rng.permutation(features)[: num_classes * drivers]
    driver_cols = driver_cols.reshape(num_classes, drivers)
    hit = rng.random((n, drivers)) < hit_rate
    r, j = np.nonzero(hit)
    x[r, driver_cols[y[r], j]] = rng.uniform(0.5, 1.5, size=r.size)
    tx, ty, vx, vy = _split(x, y, n_train)
    return Dataset(
        tx, ty, vx, vy, num_classes, "synthetic_tabular", (features,),
        meta={"seed": seed, "density": density, "drivers": drivers,
              "hit_rate": hit_rate},
    )  # fmt: skip


@register("synthetic_nt3")
def synthetic_nt3(
    *,
    path: str | None = None,
    seed: int = 0,
    n_train: int = 1120,
    n_test: int = 280,
    features: int = 60483,
    sites: int = 8,
    motif_len: int = 32,
    jitter: int = 8,
    noise: float = 0.5,
) -> Dataset:
    """Expression-profile-like sequences shaped like CANDLE NT3: (features, 1).

    Background is uniform noise in ``[0, noise)``. At ``sites`` fixed random places
    ("genes") every example carries a localized motif of length ``motif_len``,
    displaced by up to ``jitter`` positions and scaled by ``U(0.5, 1.5)``; normal
    (class 0) and tumor (class 1) samples carry a different motif shape at each
    site. Telling the shapes apart is what NT3's Conv1D layers do, so the network
    learns it quickly (a narrowed NT3 net is near 100% after 300 steps of batch 20
    at ``features=1024``); the presence of a motif alone says nothing of the class.

    Args:
      path: ignored (synthetic).
      seed: generation seed.
      n_train: training examples (real NT3: 1120).
      n_test: test examples (real NT3: 280).
      features: sequence length; 60483 as the real data, 1024 or so on a laptop.
      sites: motif sites per sequence.
      motif_len: motif length in positions.
      jitter: largest displacement of a motif from its site.
      noise: amplitude of the uniform background.

    Returns:
      Inputs of shape ``(features, 1)``, non-negative, max about 1 like
      max-abs-scaled NT3 data.
    """
    del path
    _check_sizes("synthetic_nt3", n_train, n_test, 2)
    span = motif_len + 2 * jitter
    if sites < 1 or sites * span > features:
        raise ValueError(
            f"synthetic_nt3: {sites} sites of {span} positions do not fit in "
            f"{features} features; lower sites/motif_len/jitter or raise features"
        )
    rng = np.random.default_rng([seed, 3])
    n = n_train + n_test
    y = rng.integers(0, 2, size=n)
    x = rng.random((n, features), dtype=np.float32)
    x *= np.float32(noise)
    # Sites sit in disjoint slots so motifs never overlap and every site counts.
    slots = rng.permutation(features // span)[:sites]
    starts = slots * span + jitter
    # Motifs: positive smooth bumps (a few Gaussians) so that they resemble peaks
    # of expression; each class gets its own shape at each site.
    t = np.arange(motif_len)
    centers = rng.uniform(0, motif_len, size=(2, sites, 3, 1))
    widths = rng.uniform(1.5, 4.0, size=(2, sites, 3, 1))
    heights = rng.uniform(0.3, 1.0, size=(2, sites, 3, 1))
    motifs = (heights * np.exp(-0.5 * ((t - centers) / widths) ** 2)).sum(axis=2)
    motifs /= motifs.max(axis=-1, keepdims=True)
    rows = np.arange(n)[:, None]
    for k in range(sites):
        pos = starts[k] + rng.integers(-jitter, jitter + 1, size=n)
        amp = rng.uniform(0.5, 1.5, size=(n, 1))
        x[rows, pos[:, None] + t] += (amp * motifs[y, k]).astype(np.float32)
    x /= np.float32(noise + 1.5)
    x = x[:, :, None]
    tx, ty, vx, vy = _split(x, y, n_train)
    return Dataset(
        tx, ty, vx, vy, 2, "synthetic_nt3", (features, 1),
        meta={"seed": seed, "sites": sites, "motif_len": motif_len,
              "jitter": jitter, "noise": noise},
    )  # fmt: skip
