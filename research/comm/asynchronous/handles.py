"""Asynchronous collectives on numpy buffers: start one now, wait for it later.

Usage::

    comm = AsyncComm(world, link="10gbps:2us")   # collective: every rank
    h = comm.allreduce(grad_a)                    # returns at once
    g = comm.reduce_scatter(grad_b)
    ...                                           # compute meanwhile
    total = h.wait()                              # the result buffer
    shard = g.wait(timeout=5.0)
    comm.drain()                                  # nothing left in flight
    comm.close()

Contract:

* **Same order on every rank.** Every rank starts the collectives of one engine
  in the same order with matching arguments (MPI's rule for collectives on one
  communicator); start them from one thread. Waiting may happen in any order,
  different on every rank. Point-to-point ``sendrecv`` pairs by (peer, tag) and
  start order. Each engine owns a private duplicate of the communicator, so its
  messages never meet another subsystem's.
* **Buffers.** C-contiguous numpy arrays. Do not write a send buffer nor read a
  result buffer until ``wait`` returned. ``out`` reuses a result buffer;
  ``allreduce(buf, out=buf)`` sums in place. ``name=`` names the handle's span
  on the timeline (track ``comm-bg``; default: the collective's kind).
* **Many in flight.** A start hands the collective to the rank's progress thread
  (:mod:`research.comm.asynchronous.progress`), which issues the nonblocking MPI call
  (``Iallreduce``, ``Ireduce_scatter_block``, ``Iallgather``, ``Ialltoallv``...)
  in start order and tests every one in flight between sleeps. MPI advances all
  of them together; none waits for an earlier one to finish.
* **Waiting never spins.** ``wait`` blocks on a ``threading.Event``; the
  progress thread sleeps between tests. Why not blocking calls on that thread:
  a blocking MPICH call busy-polls a core for as long as the slowest rank is
  late (0.24-0.30 CPU s of a 0.3 s wait against ~0.02 s with sleeping tests; the
  table is in :mod:`research.comm.asynchronous.progress`), and it would run the
  collectives one at a time. The price is a thread hand-off per collective: a small
  allreduce takes a few hundred microseconds through a handle against tens
  directly (``python -m scripts.bench_handles``), so start many, then wait.
* **Errors.** Bad arguments raise at the start, in the caller, before anything
  reaches MPI. An error inside MPI is raised by ``wait`` of that handle (and of
  :meth:`AsyncComm.drain`); the engine then refuses new starts. Nothing here
  ever calls a collective on an error path: ``close`` after an exception is local.

Emulated link: with ``link`` other than ``"real"`` (:mod:`research.comm.link`),
each collective is also held on the progress thread, sleeping, until its
modelled time on that link has passed. The emulated link carries one collective
at a time in start order (one NIC per rank): collective k occupies it from
``max(its start, the end of k-1 on the link)`` for its modelled time, so k alone
in flight completes no earlier than ``start + model`` and concurrent ones share
the bandwidth instead of each getting all of it. Each :class:`Handle` records
the real time, the modelled time and the extra time the emulation added.

:class:`Handle` and its life on the progress thread (issue, test, emulate, hand
over) are in :mod:`research.comm.asynchronous.inflight`; this module starts collectives
and checks their arguments.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from mpi4py import MPI
from mpi4py.util.dtlib import from_numpy_dtype

from research.comm.asynchronous.inflight import Handle, _Op
from research.comm.asynchronous.progress import ProgressThread, get_progress
from research.comm.link import Link

#: Longest sleep between tests while a collective is in flight. A nonblocking
#: collective advances only inside a test on every rank; see the module
#: docstring of research.comm.partial for the 50 vs 250 us measurement.
DEFAULT_MAX_SLEEP = 50e-6


class AsyncComm:
    """Collectives on numpy buffers that return a :class:`Handle` at once.

    Args:
      comm: an ``MPI.Intracomm`` or a ``World``; duplicated here (collective), so
        every rank constructs its engines in the same order.
      link: an emulated link (a :class:`Link` or a spec such as ``"10gbps:2us"``;
        ``"real"``: none).
      name: the duplicate's name (``research.<name>``), for MPI tools.
      max_sleep: longest sleep between tests while a collective is in flight.
      progress: the thread to run on (default: the rank's shared one).
    """

    def __init__(
        self,
        comm: Any,
        *,
        link: Link | str | None = "real",
        name: str = "handles",
        max_sleep: float = DEFAULT_MAX_SLEEP,
        progress: ProgressThread | None = None,
    ) -> None:
        if not max_sleep > 0:
            raise ValueError(f"max_sleep must be > 0, got {max_sleep}")
        self.link = Link.parse(link)
        self.max_sleep = float(max_sleep)
        base = getattr(comm, "comm", comm)  # a World carries its communicator
        self._comm: MPI.Intracomm = base.Dup()
        self._comm.Set_name(f"research.{name}")
        self.rank, self.size = self._comm.Get_rank(), self._comm.Get_size()
        self._progress = progress or get_progress()
        self._inflight: list[Handle] = []
        self._error: BaseException | None = None
        self._link_free = 0.0  # progress thread only: when the emulated link frees
        self._closed = False

    # -- collectives -----------------------------------------------------------------
    def allreduce(
        self,
        buf: np.ndarray,
        *,
        op: MPI.Op = MPI.SUM,
        out: np.ndarray | None = None,
        name: str | None = None,
    ) -> Handle:
        """Element-wise reduction over ranks; the result has ``buf``'s shape.

        ``out=buf`` reduces in place (``MPI_IN_PLACE``).
        """
        _check_buf(buf)
        if out is buf:
            send = MPI.IN_PLACE
        else:
            out, send = _result(out, buf.shape, buf.dtype), buf
        cost = self.link.allreduce(buf.nbytes, self.size)
        issue = lambda c: [c.Iallreduce(send, out, op=op)]  # noqa: E731
        return self._start("allreduce", buf, out, cost, issue, name)

    def reduce_scatter(
        self,
        buf: np.ndarray,
        counts: Sequence[int] | None = None,
        *,
        op: MPI.Op = MPI.SUM,
        out: np.ndarray | None = None,
        name: str | None = None,
    ) -> Handle:
        """Reduce ``buf`` over ranks; rank i gets block i of the flat result.

        Args:
          buf: the whole vector on every rank.
          counts: block sizes (elements, one per rank, summing to ``buf.size``);
            None: ``size`` equal blocks (``buf.size`` must divide evenly).

        Returns:
          A handle whose result is this rank's block, flat.
        """
        _check_buf(buf)
        if counts is None:
            if buf.size % self.size:
                raise ValueError(
                    f"reduce_scatter of {buf.size} elements into {self.size} "
                    "equal blocks: give counts"
                )
            mine = buf.size // self.size
        else:
            counts = self._counts(counts, "counts", total=buf.size)
            mine = counts[self.rank]
        out = _result(out, (mine,), buf.dtype)
        cost = self.link.reduce_scatter(buf.nbytes, self.size)
        if counts is None:
            issue = lambda c: [c.Ireduce_scatter_block(buf, out, op=op)]  # noqa: E731
        else:
            issue = lambda c: [c.Ireduce_scatter(buf, out, counts, op=op)]  # noqa: E731
        return self._start("reduce_scatter", buf, out, cost, issue, name)

    def allgather(
        self, buf: np.ndarray, *, out: np.ndarray | None = None, name: str | None = None
    ) -> Handle:
        """Every rank's ``buf`` (same shape everywhere); result ``(size, *shape)``."""
        _check_buf(buf)
        out = _result(out, (self.size, *buf.shape), buf.dtype)
        cost = self.link.allgather(buf.nbytes * self.size, self.size)
        issue = lambda c: [c.Iallgather(buf, out)]  # noqa: E731
        return self._start("allgather", buf, out, cost, issue, name)

    def allgatherv(
        self,
        buf: np.ndarray,
        counts: Sequence[int],
        *,
        out: np.ndarray | None = None,
        name: str | None = None,
    ) -> Handle:
        """Concatenation of every rank's flat ``buf``; rank i gives ``counts[i]``."""
        _check_buf(buf)
        counts = self._counts(counts, "counts")
        if counts[self.rank] != buf.size:
            raise ValueError(
                f"allgatherv: counts[{self.rank}] = {counts[self.rank]} but this "
                f"rank's buffer has {buf.size} elements"
            )
        out = _result(out, (sum(counts),), buf.dtype)
        spec = [out, (counts, _displs(counts))]
        cost = self.link.allgather(out.nbytes, self.size)
        issue = lambda c: [c.Iallgatherv(buf, spec)]  # noqa: E731
        return self._start("allgatherv", buf, out, cost, issue, name)

    def alltoall(
        self, buf: np.ndarray, *, out: np.ndarray | None = None, name: str | None = None
    ) -> Handle:
        """Block i of flat ``buf`` goes to rank i; result block j came from rank j."""
        _check_buf(buf)
        if buf.size % self.size:
            raise ValueError(
                f"alltoall of {buf.size} elements into {self.size} equal blocks: "
                "use alltoallv"
            )
        out = _result(out, buf.shape, buf.dtype)
        sent = buf.nbytes - buf.nbytes // self.size  # the own block stays local
        cost = self.link.alltoall(sent, self.size)
        counts = [buf.size // self.size] * self.size
        issue = self._alltoallv_issue(buf.reshape(-1), out.reshape(-1), counts, counts)
        return self._start("alltoall", buf, out, cost, issue, name)

    def alltoallv(
        self,
        buf: np.ndarray,
        send_counts: Sequence[int],
        recv_counts: Sequence[int],
        *,
        out: np.ndarray | None = None,
        name: str | None = None,
    ) -> Handle:
        """Flat ``buf``'s consecutive blocks of ``send_counts[i]`` go to rank i.

        ``recv_counts[j]`` is what rank j sends here; the result is those blocks
        concatenated in rank order.
        """
        _check_buf(buf)
        send_counts = self._counts(send_counts, "send_counts", total=buf.size)
        recv_counts = self._counts(recv_counts, "recv_counts")
        if send_counts[self.rank] != recv_counts[self.rank]:
            raise ValueError(
                f"alltoallv: rank {self.rank} sends itself {send_counts[self.rank]} "
                f"elements but expects {recv_counts[self.rank]} from itself"
            )
        out = _result(out, (sum(recv_counts),), buf.dtype)
        sent = (sum(send_counts) - send_counts[self.rank]) * buf.itemsize
        cost = self.link.alltoall(sent, self.size)
        issue = self._alltoallv_issue(
            buf.reshape(-1), out.reshape(-1), send_counts, recv_counts
        )
        return self._start("alltoallv", buf, out, cost, issue, name)

    def _alltoallv_issue(
        self, buf: np.ndarray, out: np.ndarray, scounts: list[int], rcounts: list[int]
    ) -> Callable[[MPI.Intracomm], list[MPI.Request]]:
        """``Ialltoallv`` with the own block copied here, not sent to self.

        Over UCX's TCP transport MPICH moved a block sent to self one piece per
        test, and the progress thread sleeps between tests: 16 MB at 2 ranks
        took 1.1 s this way against 70 ms with the own block copied
        (``python -m scripts.bench_link``, 2 nodes at 1 Gb/s).
        """
        r = self.rank
        sdispls, rdispls = _displs(scounts), _displs(rcounts)
        own = scounts[r]
        scounts, rcounts = list(scounts), list(rcounts)
        scounts[r] = rcounts[r] = 0
        send = [buf, (scounts, sdispls)]
        recv = [out, (rcounts, rdispls)]

        def issue(c: MPI.Intracomm) -> list[MPI.Request]:
            out[rdispls[r] : rdispls[r] + own] = buf[sdispls[r] : sdispls[r] + own]
            return [c.Ialltoallv(send, recv)]

        return issue

    def sendrecv(
        self,
        buf: np.ndarray | None,
        dest: int | None,
        source: int | None,
        *,
        recv_shape: Sequence[int] | None = None,
        recv_dtype: Any = None,
        tag: int = 0,
        out: np.ndarray | None = None,
        name: str | None = None,
    ) -> Handle:
        """Send ``buf`` to ``dest`` and receive from ``source`` at the same time.

        ``dest=None`` only receives, ``source=None`` only sends (result: None).
        The received message defaults to ``buf``'s shape and dtype.
        """
        if dest is None and source is None:
            raise ValueError("sendrecv needs a dest, a source or both")
        if dest is not None:
            _check_buf(buf)
            self._check_rank(dest, "dest")
        if source is None:
            result = None
        else:
            self._check_rank(source, "source")
            shape = tuple(recv_shape) if recv_shape is not None else None
            dtype = np.dtype(recv_dtype) if recv_dtype is not None else None
            if shape is None or dtype is None:
                if buf is None:
                    raise ValueError("a receive-only sendrecv needs recv_shape/dtype")
                shape = buf.shape if shape is None else shape
                dtype = buf.dtype if dtype is None else dtype
            result = _result(out, shape, dtype)
        if not 0 <= tag <= 32767:
            raise ValueError(f"tag must be in 0..32767, got {tag}")
        sent = buf.nbytes if dest is not None else 0
        got = result.nbytes if result is not None else 0
        cost = self.link.p2p(max(sent, got))  # full duplex: both ways at once

        def issue(c: MPI.Intracomm) -> list[MPI.Request]:
            reqs = []
            if result is not None:
                reqs.append(c.Irecv(result, source, tag))
            if dest is not None:
                reqs.append(c.Isend(buf, dest, tag))
            return reqs

        return self._start(
            "sendrecv", buf if dest is not None else None, result, cost, issue, name
        )

    # -- lifetime --------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        """Handles started and not yet done."""
        self._inflight = [h for h in self._inflight if not h.done()]
        return len(self._inflight)

    def drain(self, timeout: float | None = None) -> None:
        """Wait for every handle still in flight; raise the first error met.

        Args:
          timeout: seconds for the whole drain (None: wait as long as it takes).
        """
        deadline = None if timeout is None else time.perf_counter() + timeout
        for h in list(self._inflight):
            left = (
                None if deadline is None else max(0.0, deadline - time.perf_counter())
            )
            h.wait(left)
        self._inflight = []

    def close(self) -> None:
        """Free the communicator. Idempotent; local when anything failed.

        Raises:
          RuntimeError: collectives are still in flight (drain first).
        """
        if self._closed:
            return
        if self.in_flight:
            raise RuntimeError(
                f"AsyncComm.close() with {self.in_flight} collectives in flight: "
                "wait for them or drain() first"
            )
        self._closed = True
        if self._error is None:
            self._comm.Free()

    def __enter__(self) -> AsyncComm:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:
            # Peers may be elsewhere: leave everything as is, no MPI call.
            self._closed = True

    # -- helpers ---------------------------------------------------------------------
    def _start(
        self,
        kind: str,
        buf: np.ndarray | None,
        result: np.ndarray | None,
        model_s: float,
        issue: Callable[[MPI.Intracomm], list[MPI.Request]],
        name: str | None = None,
    ) -> Handle:
        """Hand ``issue`` to the progress thread; ``buf`` is kept alive meanwhile."""
        if self._closed:
            raise RuntimeError("AsyncComm is closed")
        if self._error is not None:
            raise RuntimeError(
                f"AsyncComm failed earlier, no new collectives: {self._error!r}"
            ) from self._error
        handle = Handle(kind, 0 if buf is None else buf.nbytes, result, model_s, name)
        if len(self._inflight) > 64:
            self._inflight = [h for h in self._inflight if not h.done()]
        self._inflight.append(handle)
        self._progress.add(_Op(self, handle, issue, buf))
        return handle

    def _counts(
        self, counts: Sequence[int], name: str, total: int | None = None
    ) -> list[int]:
        out = [int(c) for c in counts]
        if len(out) != self.size or any(c < 0 for c in out):
            raise ValueError(
                f"{name} must be {self.size} non-negative integers, got {list(counts)}"
            )
        if total is not None and sum(out) != total:
            raise ValueError(f"{name} sum to {sum(out)}, the buffer has {total}")
        return out

    def _check_rank(self, r: int, name: str) -> None:
        if not 0 <= r < self.size:
            raise ValueError(f"{name} must be a rank in 0..{self.size - 1}, got {r}")


def _check_buf(buf: Any, name: str = "buf") -> None:
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(buf).__name__}")
    if not buf.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    try:
        from_numpy_dtype(buf.dtype)
    except (KeyError, ValueError) as exc:
        raise TypeError(
            f"{name} has dtype {buf.dtype}, which MPI cannot carry"
        ) from exc


def _result(out: np.ndarray | None, shape: Sequence[int], dtype: Any) -> np.ndarray:
    shape = tuple(int(s) for s in shape)
    if out is None:
        return np.empty(shape, dtype)
    _check_buf(out, "out")
    if out.dtype != np.dtype(dtype) or out.size != int(np.prod(shape)):
        raise ValueError(
            f"out has {out.size} x {out.dtype}, the result needs "
            f"{int(np.prod(shape))} x {np.dtype(dtype)}"
        )
    if not out.flags.writeable:
        raise ValueError("out must be writeable")
    return out


def _displs(counts: list[int]) -> list[int]:
    return [int(d) for d in np.concatenate([[0], np.cumsum(counts)[:-1]])]
