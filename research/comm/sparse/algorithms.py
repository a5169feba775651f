"""The sparse allreduce collectives: ssar_rd, ssar_sag, dsar_sag, dense, auto.

See the package docstring for the algorithms, their cost and their guarantees.
Every MPI call is a buffer-based (uppercase) call on numpy arrays; collectives
are started non-blocking and completed by a waiter (``Waitall`` in the caller's
thread, the sleeping ``progress.wait_all`` on the progress thread), so every
request is completed on every path that returns.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np
from mpi4py import MPI

from research.comm.asynchronous.progress import get_progress, wait_all
from research.comm.faults import watchdog
from research.comm.sparse import calibration, cost, wire
from research.comm.sparse.quant import QuantizedValues, dequantize, quantize
from research.comm.sparse.vector import (
    SparseVector,
    goes_dense,
    index_dtype,
    merge,
    sum_sorted_runs,
)

ALGORITHMS = ("ssar_rd", "ssar_sag", "dsar_sag", "dense")
_CODES = {name: i for i, name in enumerate((*ALGORITHMS, "auto"))}
_DTYPES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1}
_TAG_FOLD, _TAG_RESULT, _TAG_ROUND = 1, 2, 16


@dataclasses.dataclass
class SparseStats:
    """What one call did on this rank.

    ``bytes_sent`` counts payload this rank handed to MPI for other ranks:
    point-to-point messages exactly; an alltoallv its send counts to others; an
    allgather(v) its own piece times P - 1; the dense allreduce the volume of a
    bandwidth-optimal one, 2 (P - 1) / P x vector bytes (MPI's internal traffic is
    not observable). ``cost.predicted_bytes`` models the same quantity.
    """

    algorithm: str
    bytes_sent: int = 0
    messages: int = 0
    result_nnz: int = 0
    result_dense: bool = False
    seconds: float = 0.0
    #: Of ``seconds``, those spent waiting for messages (the network's part;
    #: the rest is encoding and merging, the CPU's).
    transfer_s: float = 0.0


class _Call:
    """The state of one collective call on one rank."""

    def __init__(self, comm: MPI.Intracomm, background: bool) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.background = background
        self.stats = SparseStats("")

    def wait(self, reqs: list[MPI.Request]) -> None:
        t0 = time.perf_counter()
        if self.background:
            wait_all(reqs, what="sparse allreduce")
        else:
            with watchdog.watch("sparse allreduce"):
                MPI.Request.Waitall(reqs)
        self.stats.transfer_s += time.perf_counter() - t0
        watchdog.progress()  # one step of a multi-step algorithm done

    def sent(self, nbytes: int, messages: int = 1) -> None:
        self.stats.bytes_sent += int(nbytes)
        self.stats.messages += messages if nbytes else 0

    def exchange(self, buf: np.ndarray | None, dest: int, source: int, tag: int):
        """Send ``buf`` to ``dest`` (None: nothing) and receive one message from
        ``source`` (-1: nothing), its size learned by a matched probe."""
        reqs = []
        if buf is not None:
            reqs.append(self.comm.Isend(buf, dest, tag))
            self.sent(buf.nbytes)
        out = None
        if source >= 0:
            t0 = time.perf_counter()
            status = MPI.Status()
            with watchdog.watch("sparse allreduce exchange", peers=[source]):
                if self.background:
                    sleep = 20e-6
                    while (msg := self.comm.Improbe(source, tag, status)) is None:
                        time.sleep(sleep)
                        sleep = min(2 * sleep, 1e-3)
                else:
                    msg = self.comm.Mprobe(source, tag, status)
            out = np.empty(status.Get_count(MPI.BYTE), np.uint8)
            msg.Recv(out)
            self.stats.transfer_s += time.perf_counter() - t0
        self.wait(reqs)
        return out


def _encode_vec(v: SparseVector, q: QuantizedValues | None) -> np.ndarray:
    return wire.encode(None if v.is_dense else v._indices, v.values, q)


def _decode_vec(buf: np.ndarray, dim: int, dtype: np.dtype) -> SparseVector:
    idx, val = wire.decode(buf, index_dtype(dim), dtype)
    return SparseVector(idx, val, dim, check=False)


def _rd(c: _Call, own: SparseVector, q: QuantizedValues | None) -> SparseVector:
    """Recursive doubling; ranks beyond the largest power of two fold in first."""
    dim, dtype, r = own.dim, own.dtype, c.rank
    p2 = 1 << (c.size.bit_length() - 1)
    extra = c.size - p2
    cur, first = own, q
    if r >= p2:
        c.exchange(_encode_vec(cur, first), r - p2, -1, _TAG_FOLD)
        return _decode_vec(c.exchange(None, -1, r - p2, _TAG_RESULT), dim, dtype)
    if r < extra:
        got = c.exchange(None, -1, r + p2, _TAG_FOLD)
        cur, first = merge(cur, _decode_vec(got, dim, dtype)), None
    for t in range(p2.bit_length() - 1):
        partner = r ^ (1 << t)
        buf = c.exchange(_encode_vec(cur, first), partner, partner, _TAG_ROUND + t)
        other = _decode_vec(buf, dim, dtype)
        # Both partners merge (lower rank, higher rank): the same bytes on both.
        cur = merge(cur, other) if r < partner else merge(other, cur)
        first = None
    if r < extra:
        c.exchange(_encode_vec(cur, None), r + p2, -1, _TAG_RESULT)
    return cur


def _bounds(dim: int, size: int) -> list[int]:
    """Owner ``d`` holds ``[b[d], b[d+1])``; works for any dim, also dim < P."""
    return [d * dim // size for d in range(size + 1)]


def _pieces(own: SparseVector, q: QuantizedValues | None, bounds: list[int]):
    """Per owner: (indices or None, values, quantized or None), split by range."""
    out = []
    codes = q.codes() if q is not None else None  # unpacked once for all pieces
    for d in range(len(bounds) - 1):
        lo, hi = bounds[d], bounds[d + 1]
        if own.is_dense:
            out.append((None, own.values[lo:hi], q.slice(lo, hi, codes) if q else None))
            continue
        a, b = np.searchsorted(own._indices, [lo, hi])
        idx, val = own._indices[a:b], own.values[a:b]
        if b == a:
            out.append((idx, val, None))
        elif goes_dense(b - a, hi - lo, own.index_bytes, own.values.itemsize):
            dense = np.zeros(hi - lo, own.dtype)
            dense[idx - lo] = val
            out.append((None, dense, None))
        else:
            out.append((idx, val, q.slice(a, b, codes) if q else None))
    return out


def _to_owners(c: _Call, own: SparseVector, q, bounds):
    """Phase 1 of the split algorithms: every range to its owner (alltoallv).

    Returns the pieces of this rank's range, in source rank order."""
    pieces = _pieces(own, q, bounds)
    bufs = [
        None if d == c.rank or p[1].shape[0] == 0 else wire.encode(*p)
        for d, p in enumerate(pieces)
    ]
    scounts = np.array([0 if b is None else b.nbytes for b in bufs], np.int64)
    rcounts = np.empty(c.size, np.int64)
    c.wait([c.comm.Ialltoall(scounts, rcounts)])
    c.sent(8 * (c.size - 1))
    sendbuf = np.concatenate(
        [b for b in bufs if b is not None] or [np.empty(0, np.uint8)]
    )
    recvbuf = np.empty(int(rcounts.sum()), np.uint8)
    sdispl = np.concatenate(([0], np.cumsum(scounts)[:-1]))
    rdispl = np.concatenate(([0], np.cumsum(rcounts)[:-1]))
    c.wait(
        [
            c.comm.Ialltoallv(
                [sendbuf, (scounts.tolist(), sdispl.tolist()), MPI.BYTE],
                [recvbuf, (rcounts.tolist(), rdispl.tolist()), MPI.BYTE],
            )
        ]
    )
    c.sent(int(scounts.sum()), int(np.count_nonzero(scounts)))
    mine = []
    for s in range(c.size):
        if s == c.rank:
            # Own values are the dequantized contribution already: the same
            # numbers the owner would decode from the quantized message.
            mine.append(pieces[s][:2])
        elif rcounts[s]:
            buf = recvbuf[rdispl[s] : rdispl[s] + rcounts[s]]
            mine.append(wire.decode(buf, index_dtype(own.dim), own.dtype))
    return mine


def _owner_sum(pieces, lo: int, hi: int, dim: int, dtype, force_dense: bool):
    """Sum of the pieces of range [lo, hi) in source order: (indices|None, values)."""
    ib, vb = index_dtype(dim).itemsize, np.dtype(dtype).itemsize
    total = sum(v.shape[0] for _, v in pieces)
    if force_dense or goes_dense(total, hi - lo, ib, vb):
        acc = np.zeros(hi - lo, dtype)
        for idx, val in pieces:
            if idx is None:
                acc += val
            elif val.shape[0]:
                acc[idx - lo] += val
        return None, acc
    s = sum_sorted_runs([i for i, _ in pieces], [v for _, v in pieces], dim)
    return s._indices, s.values


def _sag(c: _Call, own: SparseVector, q, dense_result: bool) -> SparseVector:
    """Split-allgather: owners sum their range, then (sparse or dense) allgather."""
    dim, dtype, P = own.dim, own.dtype, c.size
    bounds = _bounds(dim, P)
    lo, hi = bounds[c.rank], bounds[c.rank + 1]
    mine = _to_owners(c, own, q, bounds)
    idx, val = _owner_sum(mine, lo, hi, dim, dtype, dense_result)
    if dense_result:
        out = np.empty(dim, dtype)
        lens = [bounds[d + 1] - bounds[d] for d in range(P)]
        spec = [
            out,
            (lens, bounds[:-1]),
            MPI.FLOAT if dtype == np.float32 else MPI.DOUBLE,
        ]
        c.wait([c.comm.Iallgatherv(val, spec)])
        c.sent(val.nbytes * (P - 1), P - 1)
        return SparseVector(None, out, dim, check=False)
    buf = wire.encode(idx, val) if val.shape[0] else np.empty(0, np.uint8)
    sizes = np.empty(P, np.int64)
    c.wait([c.comm.Iallgather(np.array([buf.nbytes], np.int64), sizes)])
    c.sent(8 * (P - 1))
    displ = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    allbuf = np.empty(int(sizes.sum()), np.uint8)
    spec = [allbuf, (sizes.tolist(), displ.tolist()), MPI.BYTE]
    c.wait([c.comm.Iallgatherv(buf, spec)])
    c.sent(buf.nbytes * (P - 1), P - 1)
    parts = [
        wire.decode(allbuf[displ[d] : displ[d] + sizes[d]], index_dtype(dim), dtype)
        for d in range(P)
        if sizes[d]
    ]
    owners = [d for d in range(P) if sizes[d]]
    total = sum(v.shape[0] for _, v in parts)
    if goes_dense(total, dim, index_dtype(dim).itemsize, dtype.itemsize):
        out = np.zeros(dim, dtype)
        for d, (i, v) in zip(owners, parts):
            if i is None:
                out[bounds[d] : bounds[d + 1]] = v
            else:
                out[i] = v
        return SparseVector(None, out, dim, check=False)
    idt = index_dtype(dim)
    all_idx = [
        np.arange(bounds[d], bounds[d + 1], dtype=idt) if i is None else i
        for d, (i, _) in zip(owners, parts)
    ]
    if not parts:
        return SparseVector.empty(dim, dtype)
    # Owners' ranges are disjoint and ordered: concatenation is sorted.
    return SparseVector(
        np.concatenate(all_idx), np.concatenate([v for _, v in parts]), dim, check=False
    )


def _dense(c: _Call, own: SparseVector) -> SparseVector:
    out = own.to_dense()
    c.wait([c.comm.Iallreduce(MPI.IN_PLACE, out, MPI.SUM)])
    c.sent(2 * (c.size - 1) * out.nbytes // c.size, 2 * (c.size - 1))
    return SparseVector(None, out, own.dim, check=False)


def _agree(c: _Call, vec: SparseVector, algorithm: str, bits: int | None):
    """Allgather (nnz, dim, dtype, bits, algorithm) and check they agree."""
    mine = np.array(
        [vec.nnz, vec.dim, _DTYPES[vec.dtype], bits or 0, _CODES[algorithm]], np.int64
    )
    table = np.empty((c.size, 5), np.int64)
    c.wait([c.comm.Iallgather(mine, table)])
    c.sent(mine.nbytes * (c.size - 1))
    for col, what in ((1, "dim"), (2, "dtype"), (3, "bits"), (4, "algorithm")):
        if np.any(table[:, col] != table[0, col]):
            raise ValueError(f"sparse_allreduce: ranks disagree on {what}: {table}")
    return table[:, 0]


def _contribution(vec: SparseVector, bits: int | None, rng) -> tuple:
    """This rank's (possibly quantized) contribution and its quantized form."""
    if bits is None:
        return vec, None
    q = quantize(vec.values, bits, rng)
    return SparseVector(vec._indices, dequantize(q), vec.dim, check=False), q


def _run(c: _Call, vec, q, algorithm: str, bits) -> tuple[SparseVector, SparseStats]:
    start = time.perf_counter()
    counts = _agree(c, vec, algorithm, bits)
    if algorithm == "auto":
        model = calibration.agreed_model(c.comm)
        algorithm = cost.choose(
            model, counts.tolist(), vec.dim, vec.index_bytes, vec.values.itemsize, bits
        )
    c.stats.algorithm = algorithm
    ib, vb = vec.index_bytes, vec.values.itemsize
    if c.size == 1:
        out = vec
    elif algorithm == "dense":
        out = _dense(c, vec)
    elif algorithm == "ssar_rd":
        # A contribution already past the switch travels (and is kept) dense, so
        # the sender's copy and the receiver's decoded copy have the same form.
        if not vec.is_dense and goes_dense(vec.nnz, vec.dim, ib, vb):
            vec, q = SparseVector(None, vec.to_dense(), vec.dim, check=False), None
        out = _rd(c, vec, q)
    else:
        out = _sag(c, vec, q, dense_result=algorithm == "dsar_sag")
    if not out.is_dense and goes_dense(out.nnz, out.dim, ib, vb):
        out = SparseVector(None, out.to_dense(), out.dim, check=False)
    c.stats.result_nnz, c.stats.result_dense = out.nnz, out.is_dense
    c.stats.seconds = time.perf_counter() - start
    return out, c.stats


def _check(comm, vec, algorithm: str, bits, rng) -> None:
    if not isinstance(comm, MPI.Intracomm):
        raise TypeError(f"comm must be an MPI.Intracomm, got {type(comm).__name__}")
    if not isinstance(vec, SparseVector):
        raise TypeError(f"vec must be a SparseVector, got {type(vec).__name__}")
    if algorithm not in _CODES:
        raise ValueError(f"algorithm must be one of {tuple(_CODES)}, got {algorithm!r}")
    if bits is not None and rng is None:
        raise ValueError("bits= needs rng= (a numpy Generator, distinct per rank)")


def sparse_allreduce(
    comm: MPI.Intracomm,
    vec: SparseVector,
    algorithm: str = "auto",
    *,
    bits: int | None = None,
    rng: np.random.Generator | None = None,
    return_stats: bool = False,
) -> SparseVector | tuple[SparseVector, SparseStats]:
    """Sum of every rank's ``vec``, the same bytes on every rank.

    Args:
      comm: the ranks taking part (collective: all call it, in the same order).
      vec: this rank's contribution; ``dim`` and dtype equal on every rank.
      algorithm: "ssar_rd", "ssar_sag", "dsar_sag", "dense" or "auto" (the cost
        model picks one from the allgathered nnz of every rank).
      bits: quantize this rank's values to 2, 4 or 8 bits first (stochastic,
        unbiased; the result is the exact sum of the dequantized contributions).
      rng: the quantization draws; give each rank its own stream.
      return_stats: also return a ``SparseStats``.
    """
    _check(comm, vec, algorithm, bits, rng)
    own, q = _contribution(vec, bits, rng)
    out, stats = _run(_Call(comm, background=False), own, q, algorithm, bits)
    return (out, stats) if return_stats else out


class SparseHandle:
    """A sparse allreduce running on the progress thread; ``wait()`` for it."""

    def __init__(self, future: Future) -> None:
        self._future = future
        self.stats: SparseStats | None = None

    def done(self) -> bool:
        return self._future.done()

    def wait(self, timeout: float | None = None) -> SparseVector:
        with watchdog.watch("sparse allreduce (progress thread)"):
            out, self.stats = self._future.result(timeout)
        return out


_dups: dict[int, MPI.Intracomm] = {}
_dups_lock = threading.Lock()


def _dedicated(comm: MPI.Intracomm) -> MPI.Intracomm:
    # Created on first use by each rank at the same call (collective Dup), so the
    # background collectives never match messages of the caller's own traffic.
    with _dups_lock:
        key = comm.py2f()
        if key not in _dups:
            _dups[key] = comm.Dup()
            _dups[key].Set_name("research.sparse")
        return _dups[key]


def isparse_allreduce(
    comm: MPI.Intracomm,
    vec: SparseVector,
    algorithm: str = "auto",
    *,
    bits: int | None = None,
    rng: np.random.Generator | None = None,
) -> SparseHandle:
    """Start ``sparse_allreduce`` on the rank's progress thread; returns a handle.

    Runs on a duplicate of ``comm`` made on the first call (collective: every rank
    makes its first call at the same point). Calls run one at a time in the order
    they are started, which must be the same on every rank; quantization draws
    happen here, in the caller's thread.
    """
    _check(comm, vec, algorithm, bits, rng)
    own, q = _contribution(vec, bits, rng)
    call = _Call(_dedicated(comm), background=True)
    fn: Callable = _run
    return SparseHandle(get_progress().submit(fn, call, own, q, algorithm, bits))
