"""The sparse mean over ranks of a flat gradient: SparCML's allreduce, decoded.

:class:`SparseMean` is the communication of top-k averaging (the ``sparse``
strategy, ``research.strategies.sparse``, and :class:`~research.comm.sparse.
topk.TopKAllreduce`): every rank contributes a :class:`SparseVector` over the
flattened parameters (its selected entries, or the whole gradient in a dense
warm-up step); :func:`sparse_allreduce` sums them (``algorithm="auto"`` picks
the cheapest SparCML algorithm from the calibrated cost model); the mean is the
sum over P. Values may travel stochastically quantized (``bits``: 2, 4, 8, QSGD
buckets of 512), drawn from ``seed`` per rank and step (a resumed run draws
alike).

On an emulated ``link`` (``research.comm.link``) the collective still runs on
the host in the calling thread, so after it the rank sleeps ``model = bytes
this rank really sent / payload rate + messages x latency`` (the call's
``SparseStats``; ``Link.sparse``): on top of the call's own time, since its
merges are CPU work between the transfers (measured over TCP:
``docs/results/network.md``). Each rank sleeps for its own traffic; the next
collective makes everyone wait for the slowest, as on a network. There
``auto`` is decided once per (k, dim) by the cost model with the link's
latency and bandwidth put in (:func:`link_model`), since the bytes really
cross shared memory.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from research.comm.info import CommInfo
from research.comm.link import Link
from research.comm.sparse.algorithms import ALGORITHMS, sparse_allreduce
from research.comm.sparse.calibration import agreed_model
from research.comm.sparse.cost import CostModel, choose
from research.comm.sparse.vector import SparseVector
from research.comm.world import as_world
from research.trace import get_tracer


def link_model(model: CostModel, link: Link, P: int) -> CostModel:
    """``model`` with an emulated ``link``'s latency and bandwidth put in.

    Point-to-point: alpha + latency, beta = max(beta, 1 / payload rate); the
    dense allreduce: a ring's 2 (P - 1) latencies and 2 (P - 1) / P / payload
    rate per vector byte (or the measured figures, where slower). The real link
    returns ``model`` itself.
    """
    if not link.emulated:
        return model
    per_byte = 1.0 / link.bytes_per_s
    return dataclasses.replace(
        model,
        alpha=model.alpha + link.latency_s,
        beta=max(model.beta, per_byte),
        ar_alpha=model.ar_alpha + 2 * (P - 1) * link.latency_s,
        ar_beta=max(model.ar_beta, 2 * (P - 1) / P * per_byte),
    )


class SparseMean:
    """The mean over ranks of every rank's sparse (or dense) flat vector.

    Args:
      world: a World or an mpi4py intracommunicator.
      bits: 0 (full precision) or 2, 4, 8 (quantized values).
      algorithm: the sparse allreduce algorithm, or ``"auto"``.
      seed: base seed of the quantization draws.
      link: an emulated link spec, or ``"real"``.
    """

    def __init__(
        self,
        world: Any,
        *,
        bits: int = 0,
        algorithm: str = "auto",
        seed: int = 0,
        link: str = "real",
    ) -> None:
        if bits not in (0, 2, 4, 8):
            raise ValueError(f"bits must be 0, 2, 4 or 8, got {bits}")
        if algorithm not in (*ALGORITHMS, "auto"):
            valid = ", ".join((*ALGORITHMS, "auto"))
            raise ValueError(f"unknown algorithm {algorithm!r}; valid: {valid}")
        self.world = world = as_world(world)
        self.comm = world.comm
        self.size = world.size
        self.rank = world.rank
        self.bits = int(bits)
        self.algorithm = algorithm
        self.seed = int(seed)
        self.link = Link.parse(link)
        self._picked: dict[tuple[int, int], str] = {}

    def summary(self) -> dict[str, Any]:
        """The cost model ``auto`` chose with, and where it came from (None:
        no algorithm was chosen by the model)."""
        from research.comm.sparse.calibration import cached_model, record

        model = cached_model(self.comm)
        return {"sparse_cost_model": None if model is None else record(model)}

    def reduce_dense(self, flat: np.ndarray, step: int) -> tuple[np.ndarray, CommInfo]:
        """Mean over ranks of the whole flat gradient (a warm-up step)."""
        vec = SparseVector.dense(np.ascontiguousarray(flat, dtype=np.float32))
        return self._run(vec, step, algorithm="dense", bits=None, warmup=True)

    def reduce_sparse(
        self, indices: np.ndarray, values: np.ndarray, dim: int, step: int
    ) -> tuple[np.ndarray, CommInfo]:
        """Mean over ranks of the selected entries, as a dense float32 vector.

        Args:
          indices: strictly increasing positions in the flat gradient.
          values: their values (float32).
          dim: the flat gradient's length.
          step: the global step (seeds the quantization draws).
        """
        vec = SparseVector(
            np.asarray(indices), np.asarray(values, dtype=np.float32), int(dim)
        )
        return self._run(
            vec, step, algorithm=self._pick(vec), bits=self.bits or None, warmup=False
        )

    def reduce_sparse_sum(
        self, indices: np.ndarray, values: np.ndarray, dim: int, step: int
    ) -> tuple[SparseVector, CommInfo]:
        """Like :meth:`reduce_sparse` but the sum over ranks as it arrives
        (sparse or dense form), for a caller that decodes it into its own
        buffer (:class:`~research.comm.sparse.vector.MeanBuffer`) instead of a
        fresh dense vector."""
        vec = SparseVector(
            np.asarray(indices), np.asarray(values, dtype=np.float32), int(dim)
        )
        return self._run(
            vec,
            step,
            algorithm=self._pick(vec),
            bits=self.bits or None,
            warmup=False,
            decode=False,
        )

    def _pick(self, vec: SparseVector) -> str:
        # On an emulated link, "auto" must judge by that link, not by the
        # calibrated shared memory the collective really runs on. Every rank
        # sends exactly k entries, so the counts are known without a collective
        # and the choice (cached per k and dim) is the same on every rank.
        if self.algorithm != "auto" or not self.link.emulated:
            return self.algorithm
        key = (vec.nnz, vec.dim)
        if key not in self._picked:
            model = link_model(agreed_model(self.comm), self.link, self.size)
            self._picked[key] = choose(
                model,
                [vec.nnz] * self.size,
                vec.dim,
                vec.index_bytes,
                4,
                self.bits or None,
            )
        return self._picked[key]

    def _run(
        self,
        vec: SparseVector,
        step: int,
        *,
        algorithm: str,
        bits: int | None,
        warmup: bool,
        decode: bool = True,
    ) -> tuple[Any, CommInfo]:
        rng = None
        if bits is not None:
            # Own stream per rank and step: reproducible, and the same after a
            # restart from a checkpoint.
            rng = np.random.default_rng([self.seed, self.rank, int(step)])
        with get_tracer().span(
            "sparse-allreduce", track="comm", nnz=vec.nnz, step=step
        ) as span:
            t0 = time.perf_counter()
            out, stats = sparse_allreduce(
                self.comm, vec, algorithm, bits=bits, rng=rng, return_stats=True
            )
            emulated = 0.0
            if self.link.emulated:
                # The link's time comes on top of the call's own: the merges are
                # CPU work between the steps' transfers (research.comm.link).
                emulated = self.link.sparse(stats.bytes_sent, stats.messages)
                time.sleep(emulated)
            span.set(
                algorithm=stats.algorithm, bytes=stats.bytes_sent, emulated_s=emulated
            )
        info = CommInfo(
            bytes=int(stats.bytes_sent),
            contributors=self.size,
            wait_s=time.perf_counter() - t0,
            round=int(step) + 1,
            extra={
                "density": vec.nnz / vec.dim,  # of what this rank sent
                "sent_nnz": int(vec.nnz),
                "result_nnz": int(stats.result_nnz),
                "result_dense": int(stats.result_dense),
                "dense_step": int(warmup),
                "emulated_s": emulated,
                "transfer_s": stats.transfer_s + emulated,  # the network's part
            },
        )
        if not decode:
            return out, info
        mean = out.to_dense().astype(np.float32, copy=False) / np.float32(self.size)
        return mean, info
