"""``SparseVector`` and the local pieces of the collectives: dense switch and merges.

Also :class:`MeanBuffer`: a sum over ranks decoded into a reused dense mean.

A vector of length ``dim`` is held either sparse (sorted, unique indices and their
values) or dense (``indices is None`` and ``values`` of length ``dim``), exactly
like a SparCML message. Indices are int32 while ``dim < 2**31`` and int64 from
there on, so no index ever overflows and no caller has to pick.

Every merge here is a deterministic function of its inputs and of their order
(the caller passes the lower rank's data first); nothing depends on arrival order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

INT32_LIMIT = 2**31


def index_dtype(dim: int) -> np.dtype:
    """int32 for ``dim < 2**31``, else int64 (the only two index types used)."""
    return np.dtype(np.int32 if dim < INT32_LIMIT else np.int64)


def goes_dense(n: int, length: int, index_bytes: int, value_bytes: int) -> bool:
    """SparCML's switch: ``n`` (index, value) pairs cost at least ``length`` values.

    Applied to a merge with ``n = n1 + n2`` (judged before merging, so both
    partners of an exchange decide alike without looking at the union) and to
    each split partition with ``length`` its range length. It also bounds every
    sparse message below the dense size, which is why dense-sized receive buffers
    always suffice in the authors' code.
    """
    return n * (index_bytes + value_bytes) >= length * value_bytes


class SparseVector:
    """A vector of length ``dim``: sorted unique ``indices`` and their ``values``.

    ``indices=None`` means dense form: ``values`` holds all ``dim`` entries. Entries
    whose value is zero may be stored (a sum that cancels keeps its index).

    Args:
      indices: integer array, strictly increasing, in ``[0, dim)``; converted to
        ``index_dtype(dim)``. None for the dense form.
      values: float32 or float64 array, same length as ``indices`` (``dim`` when
        dense).
      dim: the vector's length, a positive integer (any size; only the stored
        entries are allocated).
      check: verify order and range (O(nnz)); internal callers that built the
        arrays themselves pass False.
    """

    __slots__ = ("_indices", "values", "dim")

    def __init__(
        self,
        indices: np.ndarray | Sequence[int] | None,
        values: np.ndarray | Sequence[float],
        dim: int,
        *,
        check: bool = True,
    ) -> None:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
            raise TypeError(f"dim must be an integer, got {type(dim).__name__}")
        dim = int(dim)
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        values = np.asarray(values)
        if values.dtype not in (np.float32, np.float64):
            raise TypeError(f"values must be float32 or float64, got {values.dtype}")
        if values.ndim != 1:
            raise ValueError(f"values must be 1-D, got shape {values.shape}")
        if indices is None:
            if values.shape[0] != dim:
                raise ValueError(
                    f"dense form needs {dim} values, got {values.shape[0]}"
                )
        else:
            indices = np.asarray(indices)
            if indices.ndim != 1:
                raise ValueError(f"indices must be 1-D, got shape {indices.shape}")
            if indices.size and not np.issubdtype(indices.dtype, np.integer):
                raise TypeError(f"indices must be integers, got {indices.dtype}")
            if indices.shape != values.shape:
                raise ValueError(
                    f"{indices.shape[0]} indices but {values.shape[0]} values"
                )
            if check and indices.size:
                if indices[0] < 0 or indices[-1] >= dim:
                    raise ValueError(
                        f"indices must lie in [0, {dim}), got "
                        f"[{indices.min()}, {indices.max()}]"
                    )
                if indices.size > 1 and not np.all(indices[1:] > indices[:-1]):
                    raise ValueError("indices must be strictly increasing (unique)")
            indices = indices.astype(index_dtype(dim), copy=False)
        self._indices = indices
        self.values = values
        self.dim = dim

    @classmethod
    def from_dense(cls, x: np.ndarray) -> SparseVector:
        """The nonzero entries of a 1-D float array, sparse form."""
        x = np.asarray(x)
        if x.ndim != 1:
            raise ValueError(f"from_dense needs a 1-D array, got shape {x.shape}")
        idx = np.flatnonzero(x)
        return cls(idx, x[idx], x.shape[0], check=False)

    @classmethod
    def dense(cls, values: np.ndarray) -> SparseVector:
        """The dense form holding ``values`` (no copy)."""
        values = np.asarray(values)
        return cls(None, values, values.shape[0])

    @classmethod
    def empty(cls, dim: int, dtype: np.dtype | type = np.float32) -> SparseVector:
        return cls(np.empty(0, index_dtype(dim)), np.empty(0, dtype), dim, check=False)

    @property
    def is_dense(self) -> bool:
        return self._indices is None

    @property
    def indices(self) -> np.ndarray:
        """The stored indices (``arange(dim)`` materialised for the dense form)."""
        if self._indices is None:
            return np.arange(self.dim, dtype=index_dtype(self.dim))
        return self._indices

    @property
    def nnz(self) -> int:
        """Stored entries (``dim`` for the dense form)."""
        return int(self.values.shape[0])

    @property
    def density(self) -> float:
        return self.nnz / self.dim

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    @property
    def index_bytes(self) -> int:
        return index_dtype(self.dim).itemsize

    def to_dense(self) -> np.ndarray:
        """A new dense array of length ``dim``."""
        if self._indices is None:
            return self.values.copy()
        out = np.zeros(self.dim, self.values.dtype)
        out[self._indices] = self.values
        return out

    def __repr__(self) -> str:
        form = "dense" if self.is_dense else f"nnz={self.nnz}"
        return f"SparseVector(dim={self.dim}, {form}, dtype={self.dtype})"


def add_into(acc: np.ndarray, v: SparseVector, lo: int = 0) -> None:
    """``acc += v`` over the range starting at ``lo`` (``acc`` dense)."""
    if v.is_dense:
        acc += v.values
    elif v.nnz:
        # Indices are unique, so fancy-index += is an exact scatter-add.
        acc[v._indices - lo if lo else v._indices] += v.values


def merge(lo: SparseVector, hi: SparseVector) -> SparseVector:
    """``lo + hi``; ``lo`` is the lower rank's data (its values come first).

    Dense when ``goes_dense(lo.nnz + hi.nnz, dim)``; else the sorted union. IEEE
    addition is commutative, so partners of a pairwise exchange that both call
    ``merge(lower, higher)`` hold the same bytes afterwards.
    """
    dim, vb = lo.dim, lo.values.itemsize
    if goes_dense(lo.nnz + hi.nnz, dim, lo.index_bytes, vb):
        acc = lo.to_dense()
        add_into(acc, hi)
        return SparseVector(None, acc, dim, check=False)
    if hi.nnz == 0:
        return lo
    if lo.nnz == 0:
        return hi
    return sum_sorted_runs([lo._indices, hi._indices], [lo.values, hi.values], dim)


def sum_sorted_runs(
    indices: Sequence[np.ndarray], values: Sequence[np.ndarray], dim: int
) -> SparseVector:
    """Sum of several sparse runs (each sorted, unique) as one sparse vector.

    Runs are concatenated in the given (rank) order and stably sorted, so equal
    indices stay in that order and each index's values are added left to right:
    the result depends only on the inputs, never on timing.
    """
    idx = np.concatenate(indices)
    val = np.concatenate(values)
    if idx.size == 0:
        return SparseVector(idx, val, dim, check=False)
    # Stable: timsort finds the presorted runs, so this is close to a k-way merge.
    order = np.argsort(idx, kind="stable")
    idx = idx[order]
    val = val[order]
    starts = np.flatnonzero(np.concatenate(([True], idx[1:] != idx[:-1])))
    if starts.size == idx.size:
        return SparseVector(idx, val, dim, check=False)
    # reduceat adds each segment's values in order (segments are at most one
    # entry per run long).
    return SparseVector(idx[starts], np.add.reduceat(val, starts), dim, check=False)


class MeanBuffer:
    """The mean over ``P`` ranks of a sparse-allreduce sum, in one reused buffer.

    ``set(total)`` writes ``total / P`` into a float32 vector of length ``dim``
    that it keeps: a sparse sum zeroes only the entries the previous one set
    and scatters its own (O(nnz), no pass over ``dim``), a dense one divides
    into it (one pass). The values are those of ``total.to_dense() / P``. The
    returned array is overwritten by the next ``set``.
    """

    def __init__(self, dim: int, size: int) -> None:
        self.buf = np.zeros(int(dim), np.float32)
        self.size = np.float32(size)
        self._last: np.ndarray | None = np.empty(0, np.int64)  # None: all set

    def set(self, total: SparseVector) -> np.ndarray:
        """``total / P`` as a dense float32 vector (this buffer)."""
        buf = self.buf
        if total.is_dense:
            np.divide(total.values, self.size, out=buf, casting="unsafe")
            self._last = None
            return buf
        if self._last is None:
            buf.fill(0.0)
        else:
            buf[self._last] = 0.0
        idx = total.indices
        buf[idx] = total.values.astype(np.float32, copy=False) / self.size
        self._last = idx
        return buf
