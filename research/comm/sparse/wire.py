"""Byte layout of the messages of the sparse collectives.

A message is one contiguous uint8 buffer: a 32-byte header of four int64 (kind,
n, bits, offset) and the payload, values first so they sit 8-byte aligned:

* ``SPARSE``  n pairs: values (n x value bytes), then indices (n x index bytes);
* ``DENSE``   n = the range length: values only;
* ``QSPARSE`` n pairs with quantized values: scales (float32 per bucket touched),
  indices, packed codes (see ``quant``); ``offset`` places the first value in
  its bucket;
* ``QDENSE``  as QSPARSE without indices (a quantized dense range).

An empty piece is sent as zero bytes (no header). Counts are int64 in the header
and Python ints everywhere else, so nothing is capped at 2 GiB.
"""

from __future__ import annotations

import numpy as np

from research.comm.sparse.quant import BUCKET, QuantizedValues, dequantize

SPARSE, DENSE, QSPARSE, QDENSE = 0, 1, 2, 3
HEADER = 32


def _buffer(kind: int, n: int, bits: int, offset: int, nbytes: int) -> np.ndarray:
    buf = np.empty(HEADER + nbytes, np.uint8)
    buf[:HEADER].view(np.int64)[:] = (kind, n, bits, offset)
    return buf


def encode(
    indices: np.ndarray | None,
    values: np.ndarray | None,
    q: QuantizedValues | None = None,
) -> np.ndarray:
    """One message from a piece: ``indices`` None means dense.

    With ``q`` the values travel quantized (``values`` is then ignored).
    """
    if q is not None:
        n = q.n
        ib = 0 if indices is None else indices.itemsize * n
        kind = QDENSE if indices is None else QSPARSE
        sb = q.scales.nbytes
        buf = _buffer(kind, n, q.bits, q.offset, sb + ib + q.packed.nbytes)
        body = buf[HEADER:]
        body[:sb] = q.scales.view(np.uint8)
        if indices is not None:
            body[sb : sb + ib] = indices.view(np.uint8)
        body[sb + ib :] = q.packed
        return buf
    n = values.shape[0]
    vb = values.nbytes
    if indices is None:
        buf = _buffer(DENSE, n, 0, 0, vb)
        buf[HEADER:] = values.view(np.uint8)
        return buf
    buf = _buffer(SPARSE, n, 0, 0, vb + indices.nbytes)
    buf[HEADER : HEADER + vb] = values.view(np.uint8)
    buf[HEADER + vb :] = indices.view(np.uint8)
    return buf


def decode(
    buf: np.ndarray, index_dtype: np.dtype, dtype: np.dtype
) -> tuple[np.ndarray | None, np.ndarray]:
    """``(indices or None, values)`` of one message (views into ``buf`` where
    possible; quantized values are decoded)."""
    kind, n, bits, offset = (int(x) for x in buf[:HEADER].view(np.int64))
    body = buf[HEADER:]
    if kind in (SPARSE, DENSE):
        vb = n * dtype.itemsize
        values = body[:vb].view(dtype)
        if kind == DENSE:
            return None, values
        return body[vb : vb + n * index_dtype.itemsize].view(index_dtype), values
    if kind not in (QSPARSE, QDENSE):
        raise ValueError(f"corrupt message: kind {kind}")
    nb = -(-(offset + n) // BUCKET) if n else 0
    sb = 4 * nb
    scales = body[:sb].view(np.float32)
    ib = n * index_dtype.itemsize if kind == QSPARSE else 0
    indices = body[sb : sb + ib].view(index_dtype) if kind == QSPARSE else None
    packed = body[sb + ib : sb + ib + -(-n * bits // 8)]
    q = QuantizedValues(packed, scales, n, bits, dtype, offset)
    return indices, dequantize(q)


def nbytes(kind: int, n: int, index_bytes: int, value_bytes: int, bits: int = 0) -> int:
    """Size of a message (header included) of ``n`` entries; the byte model.

    ``n`` may be an expected (fractional) count. An empty point-to-point message
    is a bare header; empty split pieces are not sent at all (callers skip them).
    """
    if kind == SPARSE:
        return HEADER + n * (index_bytes + value_bytes)
    if kind == DENSE:
        return HEADER + n * value_bytes
    qb = 4 * -(-n // BUCKET) + -(-n * bits // 8)
    return HEADER + qb + (n * index_bytes if kind == QSPARSE else 0)
