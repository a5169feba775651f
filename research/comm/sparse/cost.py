"""The alpha-beta-gamma cost model behind ``algorithm="auto"``, and its calibration.

Parameters (all measured by ``calibrate`` on the machine at hand):
  alpha, beta   point-to-point message: ``alpha + beta * bytes`` (pairs exchanging
                at once, as in recursive doubling);
  gamma         per element entering a sparse merge (sort-based union and sum);
  delta         per element of a dense scatter-add / accumulate;
  copy          per byte of a plain copy (assembling the split algorithms'
                disjoint, ordered pieces is a concatenation, not a merge);
  ar_alpha, ar_beta  the dense ``MPI_Allreduce`` baseline: ``ar_alpha + ar_beta *
                vector bytes`` (MPI's own algorithm, measured rather than modelled).

The model walks each algorithm with *expected* counts: P ranks with ``k_i``
entries at independent uniform positions fill a union of ``dim * (1 - prod(1 -
k_i / dim))`` entries, so every message size and merge is predicted from the
nnz of every rank and ``dim``; representation switches follow the same rule as
the code. ``predicted_bytes`` gives the mean bytes sent per rank, counted the way
``SparseStats.bytes_sent`` counts them, and ``predicted_time`` the slowest rank's
time. Inputs that are not uniform (clustered indices) fill less than predicted.

Calibration (:mod:`research.comm.sparse.calibration`): measured on first use,
cached per machine, MPI library and rank count, and broadcast from rank 0, so
every rank decides with the same numbers; ``DEFAULTS`` where it cannot be.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from research.comm.sparse import wire
from research.comm.sparse.vector import goes_dense

ALGORITHMS = ("ssar_rd", "ssar_sag", "dsar_sag", "dense")


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Measured machine parameters in seconds (see the module docstring)."""

    alpha: float
    beta: float
    gamma: float
    delta: float
    ar_alpha: float
    ar_beta: float
    copy: float = 5.8e-11  # DEFAULTS'; calibration files older than this field lack it
    source: str = "defaults"


#: Used where no calibration can be had (see ``calibration.py``): measured
#: on this project's 2-core machine, 4 ranks of the mpich wheel over
#: shared memory (``scripts.calibrate_sparse``, 9 repetitions, nothing else
#: running), rounded.
DEFAULTS = CostModel(
    alpha=1.4e-5,
    beta=2.5e-10,
    gamma=2.7e-8,
    delta=1.6e-8,
    ar_alpha=2.2e-5,
    ar_beta=1.1e-9,
    copy=5.8e-11,
    source="defaults (measured 2026-11-26, 4 ranks, shared memory)",
)


def _union(ks: Sequence[float], dim: int) -> float:
    logp = sum(math.log1p(-min(k / dim, 1.0)) if k < dim else -math.inf for k in ks)
    return dim * -math.expm1(logp)


class _State:
    """Expected content of a rank's vector during recursive doubling."""

    def __init__(self, ks: list[float], count: float, dense: bool, own: bool):
        self.ks, self.count, self.dense, self.own = ks, count, dense, own


def _msg(
    st: _State, dim: int, ib: int, vb: int, bits: int | None, length: int | None = None
) -> float:
    length = dim if length is None else length
    if st.dense:
        if st.own and bits:
            return wire.nbytes(wire.QDENSE, length, 0, 0, bits)
        return wire.nbytes(wire.DENSE, length, ib, vb)
    if st.own and bits:
        return wire.nbytes(wire.QSPARSE, st.count, ib, vb, bits)
    return wire.nbytes(wire.SPARSE, st.count, ib, vb)


def _simulate(alg, counts, dim, ib, vb, bits, m: CostModel):
    """(bytes sent per rank, predicted time of the slowest rank)."""
    P = len(counts)
    sent = [0.0] * P
    if P == 1:
        return sent, 0.0
    lat = math.ceil(math.log2(P)) * m.alpha  # a small allgather / alltoall
    t = lat
    for r in range(P):
        sent[r] += 40 * (P - 1)  # the agreement allgather
    if alg == "dense":
        for r in range(P):
            sent[r] += 2 * (P - 1) * dim * vb // P
        return sent, t + m.ar_alpha + m.ar_beta * dim * vb
    if alg == "ssar_rd":
        st = []
        for k in counts:
            if k >= dim:  # dense input: travels dense, quantized if asked
                st.append(_State([k], dim, True, True))
            elif goes_dense(k, dim, ib, vb):  # densified first, full precision
                st.append(_State([k], dim, True, False))
            else:
                st.append(_State([k], k, False, True))

        def merged(a: _State, b: _State) -> tuple[_State, float]:
            ks, n = a.ks + b.ks, a.count + b.count
            if a.dense and b.dense:  # a vector add: two reads and a write
                return _State(ks, dim, True, False), 3 * m.copy * dim * vb
            if a.dense or b.dense:  # the sparse one scattered into the dense
                return _State(ks, dim, True, False), m.delta * min(a.count, b.count)
            if goes_dense(n, dim, ib, vb):  # zeros, then both scattered in
                return _State(ks, dim, True, False), m.copy * dim * vb + m.delta * n
            return _State(ks, _union(ks, dim), False, False), m.gamma * n

        p2 = 1 << (P.bit_length() - 1)
        phases = [[(r, r - p2) for r in range(p2, P)]]
        phases += [
            [(r, r ^ (1 << i)) for r in range(p2)] for i in range(p2.bit_length() - 1)
        ]
        for pairs in phases:
            if not pairs:
                continue
            worst = 0.0
            new = list(st)
            for src, dst in pairs:
                b = _msg(st[src], dim, ib, vb, bits)
                sent[src] += b
                lo, hi = sorted((src, dst))
                res, tm = merged(st[lo], st[hi])
                new[dst] = res
                worst = max(worst, m.alpha + m.beta * b + tm)
            st = new
            t += worst
        back = 0.0
        for r in range(P - p2):
            b = _msg(st[r], dim, ib, vb, bits)
            sent[r] += b
            back = max(back, m.alpha + m.beta * b)
        return sent, t + back
    # Split algorithms.
    bounds = [d * dim // P for d in range(P + 1)]
    lens = [bounds[d + 1] - bounds[d] for d in range(P)]
    recv = [0.0] * P
    got = [0.0] * P  # entries arriving at each owner
    for r, k in enumerate(counts):
        sent[r] += 8 * (P - 1)
        for d in range(P):
            e = lens[d] if k >= dim else k * lens[d] / dim
            got[d] += e
            if d == r or e == 0:
                continue
            if k >= dim:
                kind = wire.QDENSE if bits else wire.DENSE
            elif goes_dense(e, lens[d], ib, vb):
                kind = wire.DENSE
                e = lens[d]
            else:
                kind = wire.QSPARSE if bits else wire.SPARSE
            b = wire.nbytes(kind, e, ib, vb, bits or 0)
            sent[r] += b
            recv[d] += b
    t += lat + (P - 1) * m.alpha + m.beta * max(max(sent), max(recv))
    piece, work = [], []
    for d in range(P):
        dense = alg == "dsar_sag" or goes_dense(got[d], lens[d], ib, vb)
        if dense:
            piece.append(
                lens[d] * vb
                if alg == "dsar_sag"
                else wire.nbytes(wire.DENSE, lens[d], ib, vb)
            )
            # Zeros for the range, then every piece added in (dense pieces at
            # copy speed, sparse ones scattered; judged as scattered).
            work.append(m.copy * vb * lens[d] + m.delta * got[d])
        else:
            u = lens[d] / dim * _union(counts, dim)
            piece.append(wire.nbytes(wire.SPARSE, u, ib, vb) if u else 0.0)
            work.append(m.gamma * got[d])
    t += max(work)
    for r in range(P):
        sent[r] += piece[r] * (P - 1) + (0 if alg == "dsar_sag" else 8 * (P - 1))
    total = sum(piece)
    t += lat + (P - 1) * m.alpha + m.beta * max(total - p for p in piece)
    # Assembling the result: a dense allgather lands in place; disjoint ordered
    # sparse pieces are decoded and concatenated (copies), unless together they
    # go dense, when they are scattered into a dense vector.
    if alg == "dsar_sag":
        return sent, t
    entries = sum(p / (ib + vb) for p in piece)
    if goes_dense(entries, dim, ib, vb):
        return sent, t + m.delta * min(dim, entries)
    return sent, t + 2 * m.copy * total


def _args(nnz_per_rank, P, dim, index_bytes):
    counts = (
        [float(nnz_per_rank)] * P
        if np.isscalar(nnz_per_rank)
        else [float(k) for k in nnz_per_rank]
    )
    if len(counts) != P:
        raise ValueError(f"{len(counts)} nnz values for P={P}")
    ib = index_bytes or (4 if dim < 2**31 else 8)
    return counts, ib


def predicted_bytes(
    algorithm: str,
    nnz_per_rank: float | Sequence[float],
    dim: int,
    P: int,
    *,
    index_bytes: int | None = None,
    value_bytes: int = 4,
    bits: int | None = None,
    per_rank: bool = False,
) -> float | list[float]:
    """Expected bytes sent per rank (mean, or each rank's with ``per_rank``)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    counts, ib = _args(nnz_per_rank, P, dim, index_bytes)
    sent, _ = _simulate(algorithm, counts, dim, ib, value_bytes, bits, DEFAULTS)
    return sent if per_rank else sum(sent) / P


def predicted_time(
    model: CostModel,
    algorithm: str,
    nnz_per_rank: float | Sequence[float],
    dim: int,
    P: int,
    *,
    index_bytes: int | None = None,
    value_bytes: int = 4,
    bits: int | None = None,
) -> float:
    """Predicted seconds of the slowest rank."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    counts, ib = _args(nnz_per_rank, P, dim, index_bytes)
    return _simulate(algorithm, counts, dim, ib, value_bytes, bits, model)[1]


def choose(
    model: CostModel,
    counts: Sequence[int],
    dim: int,
    index_bytes: int,
    value_bytes: int,
    bits: int | None = None,
) -> str:
    """The algorithm of least predicted time (ties: the order of ``ALGORITHMS``).

    A deterministic function of its arguments: called with allgathered counts and
    a broadcast model, it picks the same algorithm on every rank.
    """
    times = [
        _simulate(
            a, [float(k) for k in counts], dim, index_bytes, value_bytes, bits, model
        )[1]
        for a in ALGORITHMS
    ]
    return ALGORITHMS[int(np.argmin(times))]
