"""Stochastic quantization of values (QSGD-style), 2, 4 or 8 bits, buckets of 512.

Alistarh et al.'s QSGD as SparCML uses it for low-precision values: per bucket of
``BUCKET`` consecutive values a scale (max |v|, float32) and per value a sign and
a level ``l`` in ``0..s`` with ``s = 2**(bits-1) - 1`` (1, 7 or 127), so that the
value decodes to ``sign * l * step`` with ``step = scale / s``. The level is drawn
between the two nearest ones, ``floor(r)`` or ``floor(r) + 1`` for ``r = |v| /
step``, going up with probability ``r - floor(r)``: the expectation of the
decoded value is the value (unbiased). A value within 4 float32 ulps of a level
(every decoded value, re-quantized) maps to that level with certainty, so
quantization is idempotent; the bias this admits is below float32 rounding.

On the wire each value costs ``bits`` bits (code ``sign * l + s`` in
``0..2s``, packed ``8 // bits`` to a byte) plus 4 bytes per bucket for the scale.
"""

from __future__ import annotations

import dataclasses

import numpy as np

BUCKET = 512
BITS = (2, 4, 8)
# Relative distance to a level below which a value counts as on the level.
_SNAP = 2.0**-22


def levels(bits: int) -> int:
    """Number of nonzero magnitude levels ``s`` for ``bits`` bits with sign."""
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits}")
    return 2 ** (bits - 1) - 1


@dataclasses.dataclass(frozen=True)
class QuantizedValues:
    """Quantized values: packed codes and per-bucket scales.

    Attributes:
      packed: uint8, ``ceil(n * bits / 8)`` bytes of codes.
      scales: float32 scale of each bucket the values touch.
      n: number of values.
      bits: 2, 4 or 8.
      dtype: dtype the values decode to.
      offset: position of the first value within its bucket (nonzero only for a
        slice of a longer quantized array, so the slice decodes bit-identically).
    """

    packed: np.ndarray
    scales: np.ndarray
    n: int
    bits: int
    dtype: np.dtype
    offset: int = 0

    @property
    def nbytes(self) -> int:
        return int(self.packed.nbytes + self.scales.nbytes)

    def codes(self) -> np.ndarray:
        """The unpacked codes, one uint8 per value."""
        return unpack(self.packed, self.bits, self.n)

    def slice(
        self, start: int, stop: int, codes: np.ndarray | None = None
    ) -> QuantizedValues:
        """Values ``start:stop`` with their buckets' scales (decode unchanged).

        ``codes``: ``self.codes()`` if the caller has them (slicing many pieces).
        """
        first = self.offset + start
        b0, b1 = first // BUCKET, -(-(self.offset + stop) // BUCKET)
        codes = (self.codes() if codes is None else codes)[start:stop]
        return QuantizedValues(
            pack(codes, self.bits),
            self.scales[b0:b1] if stop > start else self.scales[:0],
            stop - start,
            self.bits,
            self.dtype,
            first % BUCKET,
        )


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack uint8 codes below ``2**bits`` into ``ceil(n * bits / 8)`` bytes."""
    levels(bits)
    if bits == 8:
        return np.ascontiguousarray(codes, np.uint8)
    per = 8 // bits
    n = codes.shape[0]
    padded = np.zeros(-(-n // per) * per, np.uint8)
    padded[:n] = codes
    grid = padded.reshape(-1, per)
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    return np.bitwise_or.reduce(grid << shifts, axis=1).astype(np.uint8)


def unpack(packed: np.ndarray, bits: int, n: int) -> np.ndarray:
    """Inverse of ``pack``: ``n`` uint8 codes."""
    levels(bits)
    if bits == 8:
        return np.asarray(packed[:n], np.uint8)
    per = 8 // bits
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    mask = np.uint8((1 << bits) - 1)
    return ((packed[:, None] >> shifts) & mask).reshape(-1)[:n]


def quantize(
    values: np.ndarray, bits: int, rng: np.random.Generator
) -> QuantizedValues:
    """Stochastically quantize a 1-D float array (unbiased), buckets of 512.

    Args:
      values: float32 or float64 values.
      bits: 2, 4 or 8 bits per value, sign included.
      rng: source of the rounding draws (one uniform per value, in order).
    """
    s = levels(bits)
    values = np.asarray(values)
    if values.ndim != 1 or values.dtype not in (np.float32, np.float64):
        raise TypeError(f"values must be 1-D float32/float64, got {values.dtype}")
    if not np.all(np.isfinite(values)):
        raise ValueError("cannot quantize NaN or infinite values")
    n = values.shape[0]
    nb = -(-n // BUCKET)
    mag = np.abs(values)
    padded = np.zeros(nb * BUCKET, values.dtype)
    padded[:n] = mag
    maxima = padded.reshape(nb, BUCKET).max(axis=1) if n else padded[:0]
    scales = maxima.astype(np.float32)
    # A float64 maximum rounded down to float32 would put the largest value
    # above the top level; round such scales up instead.
    low = scales.astype(values.dtype) < maxima
    scales[low] = np.nextafter(scales[low], np.float32(np.inf))
    scale = np.repeat(scales.astype(np.float64), BUCKET)[:n]
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(scale > 0, mag.astype(np.float64) * s / scale, 0.0)
    base = np.rint(r)
    on_level = np.abs(r - base) <= base * _SNAP
    low_level = np.floor(r)
    up = rng.random(n) < (r - low_level)
    level = np.where(on_level, base, low_level + up)
    level = np.clip(level, 0, s).astype(np.int16)
    signed = np.where(values < 0, -level, level)
    codes = (signed + s).astype(np.uint8)
    return QuantizedValues(pack(codes, bits), scales, n, bits, values.dtype)


def dequantize(q: QuantizedValues) -> np.ndarray:
    """Decode to ``q.dtype``: ``(code - s) * scale / s`` per value.

    Computed in float64, where ``level * scale`` is exact (a float32 scale times at
    most 127), so the top level decodes to the scale itself and re-quantizing a
    decoded vector finds the same scales and levels.
    """
    s = levels(q.bits)
    signed = (q.codes().astype(np.int16) - s).astype(np.float64)
    scale = q.scales.astype(np.float64)[(np.arange(q.n) + q.offset) // BUCKET]
    return (signed * scale / s).astype(q.dtype)
