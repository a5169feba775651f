"""The dense mean of a pytree over ranks: every rank gets the exact mean.

Two collectives, same values (to the last bit or so), under the strategies
``fused`` and ``host`` (``research.strategies``):

* :class:`FusedAllreduce`: inside a jitted program. Leaves of
  256 KiB or more are summed one by one, as they are; smaller ones are packed
  into buckets (:mod:`research.comm.dense.fusion`); the ring allreduce of
  :mod:`research.comm.dense.ring` sums each, the mean folded into its last step,
  mpi4jax's ``MPI_Allreduce``, or the hierarchical allreduce of
  :mod:`research.comm.dense.hierarchical` (across nodes), whichever the first call
  measured fastest on every rank (``allreduce``, :mod:`research.comm.dense.choose`).
* :class:`HostAllreduce`: on the host, the same ring (or mpi4py's
  ``Allreduce``, or the hierarchical one, chosen the same way) on numpy buckets
  below 32 MiB
  (recycled): large leaves are read where they lie, small ones packed first;
  the result is views into the buckets.

Why no buffer of 32 MiB or more on any call: XLA gives a custom call a fresh
output buffer each time, and glibc serves more than 32 MiB with a new ``mmap``,
first touched in 4 KiB page faults (102 MB: ~25,000 faults, ~55 ms, more than
the allreduce); and mpi4jax never passes ``MPI_IN_PLACE`` (a ~9 ms copy). So
buckets stay below it, large leaves go to the ring whole, and every rank keeps
its freed heap (:mod:`research.comm.process.malloc`). With ``python -m
scripts.bench_allreduce`` (2 ranks, ResNet-50's 102 MB) fused takes 0.82x raw
``Allreduce``'s time and host 1.14x; the investigation is in ``docs/journal.md``.
"""

from __future__ import annotations

import functools
import sys
import time
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from mpi4py import MPI

from research.comm.dense import choose, ring
from research.comm.dense import xla as xla_collective
from research.comm.dense.chain import Chain
from research.comm.dense.fusion import FusionPlan, HostBuffers
from research.comm.dense.hierarchical import (
    NodeComms,
    host_allreduce_all,
    jit_allreduce,
)
from research.comm.dense.sizes import DEFAULT_ALONE_BYTES, DEFAULT_BUCKET_BYTES
from research.comm.dense.xla import AXIS
from research.comm.faults import watchdog
from research.comm.info import CommInfo
from research.comm.link import Link
from research.comm.world import as_world
from research.trace import get_tracer


def _plan_key(tree: Any) -> tuple:
    leaves, treedef = jax.tree.flatten(tree)
    return (
        treedef,
        tuple(tuple(x.shape) for x in leaves),
        tuple(np.dtype(x.dtype).str for x in leaves),
    )


class _PlanCache:
    """Plans by tree structure, so one averager serves trees of several shapes."""

    def __init__(
        self, bucket_bytes: int, alone_bytes: int | None, split_leaves: bool = True
    ) -> None:
        self.bucket_bytes = bucket_bytes
        self.alone_bytes = alone_bytes
        self.split_leaves = split_leaves
        self._plans: dict[tuple, Any] = {}

    def get(self, tree: Any, make: Any = None) -> Any:
        key = _plan_key(tree)
        if key not in self._plans:
            plan = FusionPlan.for_tree(
                tree, self.bucket_bytes, self.alone_bytes, self.split_leaves
            )
            self._plans[key] = make(plan) if make else plan
        return self._plans[key]


class FusedAllreduce:
    """Mean over ranks inside ``jit``: mpi4jax allreduce of leaves and buckets.

    Args:
      world: the world to average over.
      bucket_bytes: largest bucket of fused small leaves; keep it below 32 MiB
        (see module docstring).
      alone_bytes: leaves at least this large are summed whole, unfused (None:
        fuse all leaves into buckets of ``bucket_bytes``).
      sequential: start preparing bucket i+1 only when bucket i's allreduce is
        done (see :mod:`research.comm.dense.chain`; False only to measure the
        difference).
      prescale: the mean costs no pass of its own: folded into the ring's last
        reduction step, or floats divided on the way into the buffer (mpi4jax's
        and the hierarchical path). False: divided in a pass after the sum
        (only to measure the difference).
      allreduce: ``"auto"`` (default): time the ring allreduce of
        :mod:`research.comm.dense.ring` (no copy of the input, the mean folded in, no
        large temporaries), mpi4jax's ``MPI_Allreduce`` and, across nodes, the
        hierarchical allreduce on the first trace's buckets and keep the
        fastest, the same on every rank (:mod:`research.comm.dense.choose`);
        ``"ring"``, ``"mpi"``, ``"hierarchical"``: that one; ``"xla"``:
        XLA's collectives, the whole step one program of all ranks
        (:mod:`research.comm.dense.xla`; a candidate of ``auto`` where
        JAX's distributed runtime runs). Any rank that cannot load the ring
        rules the ring out for all. On GPU arrays the ring is staged through
        host memory (:func:`research.comm.dense.ring.allreduce`'s ``staged``):
        ``"ring"`` forces it, ``auto`` does not time it yet.
      in_place: sum each buffer in place (the ring's result aliases its
        operand): saves one gradient-sized buffer where XLA may overwrite the
        gradient, and costs a copy where it may not (the caller keeps it).
      segment_bytes: the ring's piece size (see :mod:`research.comm.dense.ring`).
    """

    def __init__(
        self,
        world: Any,
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        alone_bytes: int | None = DEFAULT_ALONE_BYTES,
        sequential: bool = True,
        prescale: bool = True,
        allreduce: Literal["auto", "ring", "mpi", "hierarchical", "xla"] = "auto",
        in_place: bool = False,
        segment_bytes: int | None = None,
    ) -> None:
        self.world = world = as_world(world)
        self.sequential = sequential
        self.prescale = prescale
        self.allreduce = choose.check_allreduce(allreduce)
        self.in_place = in_place
        if segment_bytes is not None:
            segment_bytes = ring.check_segment_bytes(segment_bytes)
        self.segment_bytes = segment_bytes
        self.size = world.size
        self._plans = _PlanCache(bucket_bytes, alone_bytes)
        # Size 1 never touches MPI, not even to Dup a communicator.
        self.comm = world.dup("dense-fused") if world.size > 1 else None
        self.allreduce_choice = choose.agree(
            self.comm, self.allreduce, getattr(world, "topology", None)
        )
        self._nodes = _node_comms(self.comm, self.allreduce_choice)

    def plan(self, grads: Any) -> FusionPlan:
        """The bucket plan used for trees shaped like ``grads``."""
        return self._plans.get(grads)

    def average_in_jit(self, grads: Any) -> Any:
        """The mean of ``grads`` over all ranks (call inside ``jit``; on the
        ``xla`` path inside the program of :meth:`spmd`)."""
        if self.size == 1:
            return grads
        plan = self.plan(grads)
        if self.allreduce_choice.get("pending"):
            # Not xla: the program being traced is this rank's alone.
            self.allreduce_choice = self._measure(grads, plan, spmd=False)
        return self._average(grads, plan, self.allreduce_choice["path"])

    def _average(self, grads: Any, plan: FusionPlan, path: str) -> Any:
        if path == "xla":  # XLA buckets and schedules its own all-reduces
            try:
                return jax.lax.pmean(grads, AXIS)
            except NameError:  # traced in a program of this rank alone
                raise ValueError(
                    "allreduce=xla: the fused mean needs a step that is one "
                    "program of all ranks: wrap it in research.comm."
                    "xla_collective.Spmd (the Trainer does), or average with "
                    "'host' outside jit"
                ) from None
        allreduce, fold = self._allreduce(path)
        chain = Chain(plan, self.size, self.prescale, self.sequential, fold)
        return chain.run(plan.flatten(grads), allreduce)

    def _measure(self, grads: Any, plan: FusionPlan, spmd: bool) -> dict[str, Any]:
        """``allreduce=auto``: each candidate's program compiled and timed on
        zeros shaped like ``grads``, while the step is being traced
        (collective: every rank traces the same step together); ``xla`` only
        where the step can become a program of all ranks (``spmd``)."""
        with jax.ensure_compile_time_eval():
            zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), grads)

            def program(path: str) -> Any:
                if path == "xla":  # a program of all ranks (xla_collective)
                    mean = xla_collective.Spmd(lambda t: (jax.lax.pmean(t, AXIS),))
                    return lambda: jax.block_until_ready(mean(zeros))
                run = jax.jit(lambda t: self._average(t, plan, path))
                return lambda: jax.block_until_ready(run(zeros))

            wanted = self.allreduce_choice["candidates"]
            paths = {p: program(p) for p in wanted if spmd or p != "xla"}
            return _settled(self, paths, plan, "fused")

    def settle(self, grads: Any) -> None:
        """Decide ``auto`` now, on zeros shaped like ``grads`` (collective),
        where the ``xla`` path is a candidate: it needs a step program of its
        own (:meth:`spmd`), so it cannot be chosen while a step is traced."""
        choice = self.allreduce_choice
        if self.size > 1 and choice.get("pending") and "xla" in choice["candidates"]:
            self.allreduce_choice = self._measure(grads, self.plan(grads), spmd=True)

    def spmd(self) -> bool:
        """Whether the step must run as one program of all ranks (``xla``)."""
        return self.size > 1 and self.allreduce_choice["path"] == "xla"

    def uses_ring(self) -> bool:
        """True when the sums go through :mod:`research.comm.dense.ring`."""
        return self.allreduce_choice["path"] == "ring"

    def path(self) -> str:
        """Which allreduce runs inside the step, in words (for the watchdog)."""
        return _path(self.allreduce_choice, "mpi4jax MPI_Allreduce") + " in jit"

    def adopt_allreduce(self, recorded: dict[str, Any] | None) -> None:
        """Take the path an interrupted run recorded (see
        :func:`research.comm.dense.choose.adopt`); the same on every rank."""
        self.allreduce_choice = choose.adopt(self.allreduce_choice, recorded)

    def _allreduce(self, path: str) -> tuple[Any, bool]:
        """``(allreduce(x, divisor), fold)``: the ring (it divides, ``fold``),
        mpi4jax's or the hierarchical one (the chain divides)."""
        if path == "hierarchical":
            nodes = self._nodes

            def summed_hierarchical(x: Any, divisor: int) -> Any:
                assert divisor == 1, "the chain divides on the hierarchical path"
                return jit_allreduce(x, nodes)

            return summed_hierarchical, False
        if path == "ring":
            from research.comm.dense import ring

            staged = bool(self.allreduce_choice.get("staged"))
            opts = {"in_place": self.in_place and not staged, "staged": staged}
            if self.segment_bytes is not None:
                opts["segment_bytes"] = self.segment_bytes

            def summed(x: Any, divisor: int) -> Any:
                return ring.allreduce(
                    x, op=MPI.SUM, comm=self.comm, divisor=divisor, **opts
                )

            return summed, True
        import mpi4jax  # deferred: loads its XLA bridge only when used

        def summed_mpi4jax(x: Any, divisor: int) -> Any:
            assert divisor == 1, "the chain divides on mpi4jax's path"
            return mpi4jax.allreduce(x, op=MPI.SUM, comm=self.comm)

        return summed_mpi4jax, False


def _path(choice: dict[str, Any], mpi: str) -> str:
    """The path of ``choice`` in words, for the watchdog's messages."""
    if choice.get("pending"):
        return "allreduce=auto: timing " + ", ".join(choice.get("candidates", []))
    path = choice.get("path")
    ring = "ring allreduce" + (" (staged through host)" if choice.get("staged") else "")
    return {"ring": ring, "mpi": mpi}.get(path, f"{path} allreduce")


def _node_comms(comm: Any, choice: dict[str, Any]) -> NodeComms | None:
    """The node and leader communicators, where the hierarchical path may run
    (collective over ``comm``: every rank's choice is the same)."""
    if comm is None or "hierarchical" not in choice["candidates"]:
        return None
    return NodeComms.split(comm)


def _settled(
    averager: Any, paths: dict[str, Any], plan: FusionPlan, name: str
) -> dict[str, Any]:
    """``allreduce=auto``'s choice from timing ``paths`` (collective); rank 0
    says the outcome in one line."""
    with watchdog.watch(f"{name}: allreduce=auto timing"):
        choice = choose.settle(
            averager.comm,
            averager.allreduce_choice,
            paths,
            nbytes=plan.nbytes,
            buffers=len(plan.buckets),
        )
    if averager.comm.Get_rank() == 0:
        print(f"research.comm: {name}: {choice['reason']}", file=sys.stderr, flush=True)
    return choice


class HostAllreduce:
    """Mean over ranks on the host: numpy buckets summed by the ring allreduce.

    ``reduce`` runs on the calling thread; it blocks until every rank has called
    it (a synchronous collective). Leaves of 256 KiB or more are buckets of
    their own, which the ring (:func:`research.comm.dense.ring.host_allreduce`) reads
    straight from the leaf (a jax CPU array's memory, not copied) and writes,
    summed and divided, into the bucket; smaller leaves are packed into shared
    buckets first and summed in place. The result is views into the buckets
    (numpy arrays; jax arrays, copied, with ``as_jax=True``). Where the ring
    cannot be built, every bucket is packed (floats divided on the way) and
    summed in place by mpi4py's ``Allreduce``. The buckets come from a
    small pool (:class:`~research.comm.dense.fusion.HostBuffers`): a set is reused only
    after every view of it has been dropped, so a result stays valid for as long
    as the caller keeps it, and a loop that drops it allocates nothing.

    Args:
      world: the world to average over.
      bucket_bytes: largest bucket (see module docstring).
      as_jax: return jax arrays instead of numpy arrays.
      link: an emulated link (``research.comm.link``): each call also sleeps
        until a ring allreduce of its buckets would have crossed that link
        (the calling thread sleeps, leaving the CPU free as a NIC would).
      alone_bytes: leaves at least this large are buckets of their own (None:
        pack every leaf).
      allreduce: ``"auto"`` (default), ``"ring"``, ``"mpi"``,
        ``"hierarchical"`` or ``"xla"``: as for :class:`FusedAllreduce`, with
        mpi4py's ``Allreduce`` as MPI's own; the ring sums host copies of GPU
        arrays; ``xla`` returns the mean as device arrays.
    """

    def __init__(
        self,
        world: Any,
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        as_jax: bool = False,
        link: str = "real",
        alone_bytes: int | None = DEFAULT_ALONE_BYTES,
        allreduce: Literal["auto", "ring", "mpi", "hierarchical", "xla"] = "auto",
    ) -> None:
        self.world = world = as_world(world)
        self.size = world.size
        self.as_jax = as_jax
        self.link = Link.parse(link)
        self.allreduce = choose.check_allreduce(allreduce)
        # Whole leaves per bucket, so that results are views into the buckets.
        self._buffers = _PlanCache(bucket_bytes, alone_bytes, split_leaves=False)
        self.comm = world.dup("dense-host") if world.size > 1 else None
        self.allreduce_choice = choose.agree(
            self.comm, self.allreduce, getattr(world, "topology", None), True
        )
        self._nodes = _node_comms(self.comm, self.allreduce_choice)
        self._round = 0

    def plan(self, grads: Any) -> FusionPlan:
        """The bucket plan used for trees shaped like ``grads``."""
        return self._buffers.get(grads, HostBuffers).plan

    def reduce(self, grads: Any) -> tuple[Any, CommInfo]:
        """The mean of ``grads`` over all ranks and a record of the call."""
        self._round += 1
        if self.size == 1:
            return grads, CommInfo(contributors=1, round=self._round)
        # Wait for the gradient computation first, so that wait_s and the span
        # measure communication, not the tail of an asynchronously running step.
        jax.block_until_ready(grads)
        host: HostBuffers = self._buffers.get(grads, HostBuffers)
        nbytes = host.plan.nbytes
        if self.allreduce_choice.get("pending"):
            # Collective (the ranks reduce in lock step): every candidate
            # timed on this very gradient, the results thrown away.
            paths = {
                p: functools.partial(self._sum, grads, host, p)
                for p in self.allreduce_choice["candidates"]
            }
            self.allreduce_choice = _settled(self, paths, host.plan, "host")
        with get_tracer().span(
            "allreduce-host",
            track="comm",
            bytes=nbytes,
            buckets=len(host.buffers),
            round=self._round,
        ) as span:
            t0 = time.perf_counter()
            with watchdog.watch("allreduce-host", detail=self.path()):
                path = self.allreduce_choice["path"]
                buffers, t1 = self._sum(grads, host, path)
            emulated = 0.0
            if self.link.emulated:
                model = sum(self.link.allreduce(b.nbytes, self.size) for b in buffers)
                emulated = max(0.0, t1 + model - time.perf_counter())
                time.sleep(emulated)
            t2 = time.perf_counter()
            if path == "xla":  # jax arrays on the device, from XLA's program
                out = self._xla_out
            else:
                out = host.views()
            if self.as_jax:
                out = jax.tree.map(jnp.asarray, out)
            t3 = time.perf_counter()
            span.set(
                pack_s=t1 - t0, mpi_s=t2 - t1, unpack_s=t3 - t2, emulated_s=emulated
            )
        info = CommInfo(
            bytes=nbytes,
            contributors=self.size,
            staleness=0,
            wait_s=t3 - t0,
            round=self._round,
            extra={
                "pack_s": t1 - t0,
                "mpi_s": t2 - t1,
                "unpack_s": t3 - t2,
                "emulated_s": emulated,
            },
        )
        return out, info

    def path(self) -> str:
        """Which allreduce runs, in words (for the watchdog's messages)."""
        return _path(self.allreduce_choice, "mpi4py Allreduce")

    def adopt_allreduce(self, recorded: dict[str, Any] | None) -> None:
        """As :meth:`FusedAllreduce.adopt_allreduce`."""
        self.allreduce_choice = choose.adopt(self.allreduce_choice, recorded)

    def _sum(
        self, grads: Any, host: HostBuffers, path: str
    ) -> tuple[list[np.ndarray], float]:
        """Pack ``grads`` and average the buckets in place along ``path``;
        returns them and the time packing ended (``xla``: no packing, the
        mean left in ``_xla_out``; the buckets, untouched, for the link
        model)."""
        if path == "xla":
            t = time.perf_counter()
            self._xla_out = jax.block_until_ready(xla_collective.mean(grads))
            return host.buffers, t
        use_ring = path == "ring"
        if use_ring:
            buffers, direct = self._ring(grads, host)
        else:
            # Floats are divided while packing, so the sum is the mean and
            # the result is the buckets themselves.
            buffers, direct = host.pack(grads, scale=self.size), {}
        packed = time.perf_counter()
        if path == "hierarchical":  # every bucket at once, pipelined
            host_allreduce_all(buffers, self._nodes)
        for i, buf in enumerate(buffers):
            if use_ring:
                floats = not np.issubdtype(buf.dtype, np.integer)
                ring.host_allreduce(
                    direct.get(i, buf),
                    buf,
                    comm=self.comm,
                    divisor=self.size if floats else 1,
                )
            elif path == "mpi":
                self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            if np.issubdtype(buf.dtype, np.integer):
                np.floor_divide(buf, self.size, out=buf)
        return buffers, packed

    def _ring(self, grads: Any, host: HostBuffers) -> tuple[list, dict]:
        """Pack what the ring cannot read in place; the buckets, and for the
        others the leaf memory the ring reads (bucket index -> flat array)."""
        plan = host.plan
        leaves = plan.treedef.flatten_up_to(grads)
        direct = {}
        for i in range(len(plan.buckets)):
            if plan.zero_copy(i):
                flat = np.asarray(leaves[plan.buckets[i].segments[0].leaf]).reshape(-1)
                # A leaf whose own dtype is not the bucket's (float64 numpy
                # leaves without x64) is packed, i.e. cast, instead.
                if flat.flags.c_contiguous and flat.dtype == plan.buckets[i].dtype:
                    direct[i] = flat
        return host.pack(grads, skip=direct), direct
