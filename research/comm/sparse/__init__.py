"""Sparse allreduce of heterogeneous sparse vectors (SparCML), with quantization.

Renggli, Ashkboos, Aghagolzadeh, Alistarh, Hoefler, *SparCML: High-Performance
Sparse Communication for Machine Learning*, SC19. Ranks contribute sparse vectors
of different sizes; the sum switches to dense when merges fill it in; values may
travel at low precision; the collective may run in the background.

Usage::

    v = SparseVector(indices, values, dim)        # sorted, unique indices
    out = sparse_allreduce(comm, v)               # algorithm="auto"
    h = isparse_allreduce(comm, v, bits=4, rng=rng); ...; out = h.wait()

Message format (``wire``): a count n and items; n == range length means dense
values, otherwise (index, value) pairs sorted by index. Indices are int32 below
2**31 and int64 from there on; counts are 64-bit everywhere. A merge of n1 and n2
entries goes dense when ``(n1 + n2) * (index bytes + value bytes) >= dim * value
bytes`` (``goes_dense``); a split piece is judged the same way on its range.

Algorithms and their cost (alpha latency, beta seconds per byte, gamma per merged
element, c = ib + vb bytes per pair, k entries per rank, d = dim, P ranks):

* ``ssar_rd`` recursive doubling: ranks beyond the largest power of two p fold
  into a partner first, then log2 p rounds of pairwise exchange and merge, then
  the folded ranks get the result. Round t moves the union of 2**t inputs:
  ``sum_t (alpha + beta * c * min(k_t, d vb / c) + gamma * 2 k_t)``. Best for few
  entries (log P latency), worst when unions fill up (bytes grow each round).
* ``ssar_sag`` split-allgather, sparse: index space cut in P ranges
  ``[r d / P, (r+1) d / P)`` (any d, also d < P); each range goes to its owner
  (alltoallv), owners sum in source-rank order (sparse below the switch, dense
  above it), then an allgatherv of the disjoint pieces:
  ``2 (P-1) alpha + beta c (k + K) (P-1)/P + gamma k`` with K the size of the
  final union. Bytes do not grow with P.
* ``dsar_sag`` split-allgather, dense result: as above but owners sum into dense
  ranges and the allgather is dense: ``... + beta vb d (P-1)/P``. For results
  that are dense anyway.
* ``dense`` MPI_Allreduce of the densified vector: ``ar_alpha + ar_beta d vb``.
* ``auto`` allgathers every rank's nnz (it does so anyway to check that all ranks
  agree on dim, dtype, bits and algorithm), walks each algorithm through the cost
  model with expected union sizes (``cost``) and takes the cheapest; the model's
  parameters are measured on first use (``calibrate``: briefly, cached per
  machine, MPI and rank count) and broadcast from rank 0, so every rank picks
  the same algorithm.

Quantization (``bits=2|4|8``, see ``quant``): each rank stochastically quantizes
its own values once (buckets of 512, QSGD-style, unbiased); the result is the sum
of these dequantized contributions, identical to the unquantized collective run
on them. Quantized bytes travel on the first hop only, where a message carries
one rank's contribution (the fold and first round of ``ssar_rd``, the pieces sent
to owners in the split algorithms, sparse or dense-form inputs); merged sums are
never re-quantized (no noise compounding per round, and bit-identical results),
and a sparse input that the dense switch densifies travels at full precision.
``dense`` gets the same numbers but no byte savings.

Determinism: the result is the same bytes on every rank and from run to run.
Nothing is summed in arrival order: recursive-doubling partners both compute
``merge(lower rank's data, higher rank's data)``, owners add pieces in source-rank
order, and every representation decision is taken from numbers both sides hold
(counts, never timing). The dense algorithm relies on MPI_Allreduce giving all
ranks the same bytes, which MPICH does for a fixed P and size.

Pitfalls of the authors' and peers' code avoided here: every Isend is completed
(and collectives are non-blocking requests completed before returning); counts
are 64-bit, never ``int``; no summation in arrival order; indices are never packed
into float32 (exact only up to 2**24); a receive is sized by a matched probe
(``Mprobe``), not by a dense-sized buffer, so a huge ``dim`` allocates nothing
dense unless the data is dense. ``isparse_allreduce`` runs on the rank's progress
thread on a duplicated communicator and waits by sleeping, not spinning.
"""

from typing import Any

#: Where each name lives: loaded when first named, so that importing the
#: package (``research.comm.sparse.select`` for the strategies' options before
#: launch) imports no MPI.
_FROM = {
    "algorithms": ("ALGORITHMS", "SparseHandle", "SparseStats"),
    "calibration": ("calibrate", "load_model"),
    "cost": ("DEFAULTS", "CostModel", "choose", "predicted_bytes", "predicted_time"),
    "quant": ("QuantizedValues", "dequantize", "quantize"),
    "vector": ("SparseVector", "goes_dense", "index_dtype"),
}
_FROM["algorithms"] += ("isparse_allreduce", "sparse_allreduce")
_WHERE = {name: module for module, names in _FROM.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        from research.comm.sparse import algorithms, calibration, cost, quant, vector

        modules = {"algorithms": algorithms, "calibration": calibration}
        modules |= {"cost": cost, "quant": quant, "vector": vector}
        return getattr(modules[_WHERE[name]], name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
