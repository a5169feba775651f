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

Calibration: ``python -m scripts.calibrate_sparse`` under mpiexec (a few seconds)
writes ``$RESEARCH_SPARSE_COST`` or ``~/.cache/research/sparse_cost_<P>.json``.
Without such a file ``auto`` uses ``DEFAULTS`` (a 10 Gb/s-class network link
and a slow CPU, which lean towards the sparse algorithms) and warns once. Rank 0
loads the file and broadcasts it, so every rank decides with the same numbers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

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
    copy: float = 2e-10  # 5 GB/s; calibration files older than this field lack it
    source: str = "defaults"


DEFAULTS = CostModel(
    alpha=5e-6,
    beta=8e-10,
    gamma=2e-8,
    delta=2e-9,
    ar_alpha=2e-5,
    ar_beta=2e-9,
    copy=2e-10,
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


_ENV = "RESEARCH_SPARSE_COST"


def default_path(size: int) -> Path:
    """``$RESEARCH_SPARSE_COST``, else ``~/.cache/research/sparse_cost_<size>.json``."""
    env = os.environ.get(_ENV)
    if env:
        return Path(env)
    return Path.home() / ".cache" / "research" / f"sparse_cost_{size}.json"


_warned = False


def load_model(size: int, path: str | os.PathLike | None = None) -> CostModel:
    """The calibrated model for ``size`` ranks, or ``DEFAULTS`` (warns once)."""
    global _warned
    p = Path(path) if path is not None else default_path(size)
    if p.exists():
        data = json.loads(p.read_text())
        fields = {f.name for f in dataclasses.fields(CostModel)} - {"source"}
        known = {k: float(data[k]) for k in fields if k in data}
        return CostModel(**known, source=str(p))
    if not _warned:
        _warned = True
        warnings.warn(
            f"sparse_allreduce(auto): no calibration at {p}; using conservative "
            "defaults (run `mpiexec -n P python -m scripts.calibrate_sparse`)",
            stacklevel=3,
        )
    return DEFAULTS


def ensure_calibrated(comm, say=None) -> Path:
    """Calibrate for ``comm``'s size unless a calibration exists (collective).

    Rank 0 looks for :func:`default_path`; where there is none, every rank of
    ``comm`` calibrates (a few seconds) and rank 0 saves it, saying so through
    ``say`` (a print-like function, None: silent). Returns the path.
    """
    path = default_path(comm.Get_size())
    missing = comm.bcast(not path.exists() if comm.Get_rank() == 0 else None)
    if missing:
        if say is not None and comm.Get_rank() == 0:
            say(
                f"sparse cost model: no calibration for {comm.Get_size()} ranks at "
                f"{path}; calibrating now (a few seconds)"
            )
        calibrate(comm, path)
    return path


_agreed: dict[tuple[int, int], CostModel] = {}
_agreed_lock = threading.Lock()


def agreed_model(comm) -> CostModel:
    """Rank 0's model, broadcast once per communicator (collective on first use)."""
    key = (comm.py2f(), comm.Get_size())
    with _agreed_lock:
        if key not in _agreed:
            model = load_model(comm.Get_size()) if comm.Get_rank() == 0 else None
            _agreed[key] = comm.bcast(model, root=0)
        return _agreed[key]


def _fit(sizes: Sequence[float], times: Sequence[float]) -> tuple[float, float]:
    # Latency from the smallest message; per-byte cost from a least-squares
    # slope through it (an unconstrained intercept is mostly noise).
    alpha = max(float(times[0]), 1e-7)
    x = np.asarray(sizes, float) - sizes[0]
    y = np.asarray(times, float) - times[0]
    return alpha, max(float(x @ y / (x @ x)), 1e-13)


def _best_time(fn, reps: int, sync=None) -> float:
    """The fastest of ``reps`` timed calls. Not the median: on a shared machine
    noise only ever adds time (a partner not yet scheduled made a 64-byte
    exchange's median 1.3 ms here under load, 29 us in a calmer calibration), and
    the model must rank algorithms by what the link and the CPU can do."""
    fn()  # warm-up: first-touch pages, connections
    ts = []
    for _ in range(reps):
        if sync is not None:
            sync()  # start together, outside the timed region
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.min(ts))


def calibrate(
    comm, path: str | os.PathLike | None = None, *, reps: int = 9, save: bool = True
) -> CostModel:
    """Measure the model's parameters on ``comm`` (collective, a few seconds).

    Every rank measures; the slowest rank's figure of each parameter is kept
    (bulk-synchronous collectives wait for it), so all ranks return the same
    model. Rank 0 writes it to ``path`` (default ``default_path(size)``).
    """
    from mpi4py import MPI

    from research.comm.sparse.vector import SparseVector, merge

    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(rank)
    partner = rank ^ 1
    sizes = [64, 2**14, 2**18, 2**21, 2**23]
    p2p = []
    for nbytes in sizes:
        buf, out = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)

        def exchange(buf=buf, out=out):
            if partner < size:
                comm.Sendrecv(buf, partner, 7, out, partner, 7)

        p2p.append(_best_time(exchange, reps, comm.Barrier) if size > 1 else 0.0)
    # Up to 64 MB: per byte, large allreduces cost more than small ones here
    # (a 102 MB one took 3x what a line through 16 MB predicted).
    ar_sizes = [2, 2**16, 2**20, 2**22, 2**24]
    ar = []
    for n in ar_sizes:
        x = np.ones(n, np.float32)

        def allreduce(x=x):
            comm.Allreduce(MPI.IN_PLACE, x, MPI.SUM)

        ar.append(_best_time(allreduce, reps, comm.Barrier))
    # Float32 and sorted indices, as gradients arrive; the scatter at 1/8
    # density, where the choice between dense and split algorithms is made
    # (sparser scatters touch a cache line per element and cost more each).
    dim, n = 2**22, 2**17

    def sparse(k: int) -> SparseVector:
        idx = np.sort(rng.choice(dim, k, replace=False))
        return SparseVector(idx, rng.random(k, dtype=np.float32), dim)

    a, b = sparse(n), sparse(n)
    gamma = _best_time(lambda: merge(a, b), reps) / (2 * n)
    acc, c = np.zeros(dim, np.float32), sparse(dim // 8)

    def scatter_add():
        acc[c._indices] += c.values

    delta = _best_time(scatter_add, reps) / c.nnz
    big = np.ones(2**23, np.uint8)
    copy = _best_time(lambda: np.concatenate([big, big]), reps) / (2 * big.nbytes)
    alpha, beta = _fit(sizes, p2p) if size > 1 else (DEFAULTS.alpha, DEFAULTS.beta)
    ar_alpha, ar_beta = _fit([4 * n for n in ar_sizes], ar)
    mine = np.array([alpha, beta, gamma, delta, ar_alpha, ar_beta, copy])
    comm.Allreduce(MPI.IN_PLACE, mine, MPI.MAX)
    p = Path(path) if path is not None else default_path(size)
    model = CostModel(*(float(v) for v in mine), source=str(p))
    if save and rank == 0:
        p.parent.mkdir(parents=True, exist_ok=True)
        record = dataclasses.asdict(model) | {
            "size": size,
            "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(p)
    comm.Barrier()
    return model
