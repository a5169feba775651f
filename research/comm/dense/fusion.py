"""Tensor fusion: pack a gradient pytree into a few flat buffers and back.

Horovod's tensor fusion and PyTorch DDP's gradient buckets send many small
tensors as a few large messages, because per-message latency dominates small
transfers. :class:`FusionPlan` does the same for a JAX pytree:

* leaves are grouped by *wire dtype* (their dtype, except that ``bfloat16`` and
  ``float16`` travel as ``float32``: MPI has no standard type for them, mpi4jax
  refuses them, and summing in float32 loses nothing a rounded mean would keep);
* each group's leaves, flattened in tree order, form one stream that is cut into
  buckets of at most ``bucket_bytes``; a leaf may straddle two buckets, so no
  buffer ever exceeds the threshold, however large a single leaf is (VGG-16's
  first dense kernel alone is 411 MB);
* optionally (``alone_bytes``), leaves that are large already skip fusion and
  form a bucket of their own, which in ``jit`` costs no copy at all;
* the plan (treedef, shapes, dtypes, segment offsets) is plain static Python, so
  :meth:`FusionPlan.pack` / :meth:`FusionPlan.unpack` trace into ``jit`` and
  :class:`HostBuffers` reuses the same plan on the host with numpy.

Why the threshold is also a *maximum* (not only Horovod's "fuse up to"): on
Linux/glibc every allocation above 32 MiB is a fresh ``mmap``, so a buffer that
large is page-faulted in 4 KiB pages on every step. Buckets below that size are
recycled by malloc after the first step. See ``research/comm/dense/mean.py``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from research.comm.dense.sizes import DEFAULT_BUCKET_BYTES

# Dtypes MPI (and mpi4jax) cannot reduce; they travel as float32.
_WIRE_DTYPES = {
    np.dtype(jnp.bfloat16): np.dtype(np.float32),
    np.dtype(np.float16): np.dtype(np.float32),
}


def wire_dtype(dtype: Any) -> np.dtype:
    """The dtype a leaf of ``dtype`` is communicated in."""
    dt = np.dtype(dtype)
    return _WIRE_DTYPES.get(dt, dt)


@dataclasses.dataclass(frozen=True)
class Segment:
    """A run of ``length`` elements of leaf ``leaf`` stored in bucket ``bucket``.

    Offsets are in elements of the flattened leaf and of the bucket.
    """

    leaf: int
    leaf_start: int
    bucket: int
    bucket_start: int
    length: int


@dataclasses.dataclass(frozen=True)
class Bucket:
    """One flat buffer: its wire dtype, element count and segments in order."""

    dtype: np.dtype
    size: int
    segments: tuple[Segment, ...]

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class FusionPlan:
    """Static description of how a pytree maps onto flat buckets.

    Build it once with :meth:`for_tree` (from arrays or ``jax.ShapeDtypeStruct``);
    it is plain static data, safe to close over in ``jit``.

    Attributes:
      treedef: structure of the tree.
      shapes: shape of every leaf, in ``jax.tree.leaves`` order.
      dtypes: dtype of every leaf.
      buckets: the flat buffers, grouped by wire dtype.
      leaf_segments: for each leaf, its segments in leaf order.
      bucket_bytes: the threshold the plan was built with.
    """

    treedef: Any
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]
    buckets: tuple[Bucket, ...]
    leaf_segments: tuple[tuple[Segment, ...], ...]
    bucket_bytes: int

    @classmethod
    def for_tree(
        cls,
        tree: Any,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        alone_bytes: int | None = None,
        split_leaves: bool = True,
    ) -> FusionPlan:
        """Plan the buckets of ``tree``.

        Args:
          tree: a pytree of arrays or anything with ``shape`` and ``dtype``.
          bucket_bytes: largest fused bucket, in bytes (at least one element).
          alone_bytes: leaves of at least this many bytes (in their wire dtype)
            are not fused: each becomes a bucket of its own, whole, whatever its
            size, and :meth:`pack_bucket` returns it without a copy. None: fuse
            everything.
          split_leaves: cut each dtype's stream into even buckets, splitting
            leaves at bucket boundaries (no bucket exceeds ``bucket_bytes``).
            False: fill buckets greedily with whole leaves (Horovod style), so
            every leaf lies in one bucket and can be viewed in place (see
            :meth:`HostBuffers.views`); a leaf larger than ``bucket_bytes``
            then gets a bucket of its own.

        Returns:
          The plan. Solo buckets come first, in tree order; then, per wire dtype,
          the fused leaves in tree order, cut (``split_leaves``) into
          ``ceil(group_bytes / bucket_bytes)`` buckets of nearly equal size.
        """
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        leaves, treedef = jax.tree.flatten(tree)
        shapes = tuple(tuple(int(d) for d in leaf.shape) for leaf in leaves)
        dtypes = tuple(_canonical(leaf.dtype) for leaf in leaves)

        buckets: list[Bucket] = []
        per_leaf: list[list[Segment]] = [[] for _ in leaves]
        groups: dict[np.dtype, list[int]] = {}
        for i, dt in enumerate(dtypes):
            wdt, count = wire_dtype(dt), math.prod(shapes[i])
            if (
                alone_bytes is not None
                and count
                and count * wdt.itemsize >= alone_bytes
            ):
                seg = Segment(i, 0, len(buckets), 0, count)
                buckets.append(Bucket(wdt, count, (seg,)))
                per_leaf[i].append(seg)
            else:
                groups.setdefault(wdt, []).append(i)

        for wdt, idx in groups.items():
            total = sum(math.prod(shapes[i]) for i in idx)
            if total == 0:
                continue
            cap = max(1, bucket_bytes // wdt.itemsize)
            if split_leaves:
                # Even split: n buckets of nearly equal size, rather than n-1 full
                # ones and a tiny tail that would pay a whole message latency.
                n = -(-total // cap)
                sizes = [total // n + (1 if b < total % n else 0) for b in range(n)]
            else:
                sizes = [0]
                for i in idx:
                    count = math.prod(shapes[i])
                    if sizes[-1] and sizes[-1] + count > cap:
                        sizes.append(0)
                    sizes[-1] += count
                sizes = [x for x in sizes if x]
                n = len(sizes)
            first = len(buckets)
            segs: list[list[Segment]] = [[] for _ in range(n)]
            b, fill = 0, 0
            for i in idx:
                start, left = 0, math.prod(shapes[i])
                while left:
                    while fill == sizes[b]:
                        b, fill = b + 1, 0
                    take = min(left, sizes[b] - fill)
                    seg = Segment(i, start, first + b, fill, take)
                    segs[b].append(seg)
                    per_leaf[i].append(seg)
                    start, left, fill = start + take, left - take, fill + take
            buckets.extend(
                Bucket(wdt, size, tuple(s)) for size, s in zip(sizes, segs, strict=True)
            )
        return cls(
            treedef=treedef,
            shapes=shapes,
            dtypes=dtypes,
            buckets=tuple(buckets),
            leaf_segments=tuple(tuple(s) for s in per_leaf),
            bucket_bytes=bucket_bytes,
        )

    # -- facts ---------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes on the wire per call: the sum of all buckets."""
        return sum(b.nbytes for b in self.buckets)

    def zero_copy(self, index: int) -> bool:
        """True when bucket ``index`` is one whole leaf in its own dtype.

        Packing such a bucket is a reshape (no copy), so it adds nothing to
        XLA's temporary memory.
        """
        segs = self.buckets[index].segments
        if len(segs) != 1:
            return False
        leaf = segs[0].leaf
        return (
            len(self.leaf_segments[leaf]) == 1
            and self.dtypes[leaf] == self.buckets[index].dtype
        )

    # -- traced (jnp) path ---------------------------------------------------
    # pack = flatten + pack_bucket for each bucket; unpack = split_bucket for each
    # bucket + assemble. The pieces are public so that a caller can interleave
    # per-bucket work (FusedAllreduce sequences bucket by bucket to bound memory).
    def flatten(self, tree: Any) -> list[jax.Array]:
        """The leaves of ``tree``, each raveled to 1-D (jnp)."""
        return [jnp.ravel(leaf) for leaf in self.treedef.flatten_up_to(tree)]

    def pack_bucket(self, index: int, flat: Sequence[jax.Array]) -> jax.Array:
        """Bucket ``index`` built from raveled leaves ``flat`` (see :meth:`flatten`)."""
        bucket = self.buckets[index]
        parts = [
            _piece(flat[s.leaf], s.leaf_start, s.length).astype(bucket.dtype)
            for s in bucket.segments
        ]
        return parts[0] if len(parts) == 1 else jnp.concatenate(parts)

    def split_bucket(self, index: int, bucket: jax.Array) -> list[jax.Array]:
        """The segments of bucket ``index``, each cast back to its leaf's dtype."""
        return [
            _piece(bucket, s.bucket_start, s.length).astype(self.dtypes[s.leaf])
            for s in self.buckets[index].segments
        ]

    def assemble(self, pieces: Sequence[Sequence[jax.Array]]) -> Any:
        """The tree from ``pieces[i]`` = :meth:`split_bucket` of every bucket ``i``."""
        by_segment = {
            seg: piece
            for bucket, parts in zip(self.buckets, pieces, strict=True)
            for seg, piece in zip(bucket.segments, parts, strict=True)
        }
        leaves = []
        for shape, dtype, segs in zip(
            self.shapes, self.dtypes, self.leaf_segments, strict=True
        ):
            parts = [by_segment[s] for s in segs]
            if not parts:
                flat = jnp.zeros((0,), dtype)
            elif len(parts) == 1:
                flat = parts[0]
            else:
                flat = jnp.concatenate(parts)
            leaves.append(flat.reshape(shape))
        return self.treedef.unflatten(leaves)

    def pack(self, tree: Any) -> list[jax.Array]:
        """Flat buckets of ``tree`` (jnp; works inside and outside ``jit``)."""
        flat = self.flatten(tree)
        return [self.pack_bucket(i, flat) for i in range(len(self.buckets))]

    def unpack(self, buckets: Sequence[jax.Array]) -> Any:
        """The tree held by ``buckets`` (inverse of :meth:`pack`)."""
        if len(buckets) != len(self.buckets):
            raise ValueError(
                f"expected {len(self.buckets)} buckets, got {len(buckets)}"
            )
        return self.assemble([self.split_bucket(i, b) for i, b in enumerate(buckets)])


def _canonical(dtype: Any) -> np.dtype:
    # What jax makes of the dtype (float64 -> float32 unless x64 is enabled), so
    # the jnp and numpy paths build identical buckets.
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def _piece(flat: jax.Array, start: int, length: int) -> jax.Array:
    # A whole leaf needs no slice op: keeps the traced program minimal.
    if start == 0 and length == flat.shape[0]:
        return flat
    return jax.lax.slice(flat, (start,), (start + length,))


def flat_wire_dtype(dtypes: Sequence[Any]) -> np.dtype:
    """The one dtype a whole pytree travels in when it must be a single buffer.

    The same rule as :func:`wire_dtype`, narrowed to one buffer: float64 when any
    leaf's wire dtype is float64, else float32 (bf16/f16 and float32 leaves).
    """
    wide = any(wire_dtype(d) == np.float64 for d in dtypes)
    return np.dtype(np.float64 if wide else np.float32)


class FlatLayout:
    """A pytree as ONE flat host buffer (plus trailing slots), and back.

    For protocols that need a single message per call: the partial collectives
    (payload and round metadata in one Iallreduce) and the parameter server
    (gradients and a version number in one message). The dtype rule is
    :func:`flat_wire_dtype`; bucketed averaging uses :class:`FusionPlan`.

    Args:
      tree: the pytree whose structure, shapes and dtypes it records.
      extra: trailing slots after the payload (metadata in the same message).
    """

    def __init__(self, tree: Any, extra: int = 0) -> None:
        leaves, self.treedef = jax.tree_util.tree_flatten(tree)
        self.shapes = [tuple(np.shape(x)) for x in leaves]
        self.dtypes = [np.dtype(x.dtype) for x in leaves]
        self.n = int(sum(math.prod(s) for s in self.shapes))
        self.extra = extra
        self.wire = flat_wire_dtype(self.dtypes)

    def matches(self, tree: Any) -> bool:
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        return (
            treedef == self.treedef
            and [tuple(np.shape(x)) for x in leaves] == self.shapes
        )

    def pack(self, tree: Any, extra: Sequence[float] = ()) -> np.ndarray:
        """A new buffer: ``tree``'s leaves in tree order, then ``extra``."""
        out = np.empty(self.n + self.extra, self.wire)
        off = 0
        for leaf in self.treedef.flatten_up_to(tree):
            a = np.asarray(leaf).reshape(-1)
            out[off : off + a.size] = a
            off += a.size
        out[self.n : self.n + len(extra)] = extra
        return out

    def unpack(self, flat: np.ndarray, divide: float | None = None) -> Any:
        """The tree in ``flat[:n]`` (new arrays of the leaves' dtypes), / ``divide``."""
        out, off = [], 0
        for shape, dtype in zip(self.shapes, self.dtypes):
            k = math.prod(shape)
            piece = flat[off : off + k].reshape(shape)
            leaf = np.empty(shape, dtype)
            if divide is None:
                np.copyto(leaf, piece, casting="unsafe")
            else:
                np.divide(piece, divide, out=leaf, casting="unsafe")
            out.append(leaf)
            off += k
        return jax.tree_util.tree_unflatten(self.treedef, out)


class HostBuffers:
    """Numpy buckets for one plan, recycled so the host path allocates nothing.

    ``pack`` copies a tree's leaves (jax or numpy arrays; jax CPU arrays are read
    through a zero-copy view) into a set of buckets, optionally divided by a
    scale on the way; ``views`` returns the tree as views into those buckets,
    ``unpack`` as copies. A bucket set is reused by a later ``pack`` only once no
    view of it is alive any more (the caller dropped the result, and so did jax,
    which may wrap a numpy array without copying it on CPU); until then ``pack``
    takes another set from a small pool. In the steady state of a training loop
    two sets alternate and no step allocates or page-faults anything.

    Why that matters: fresh memory is expensive. 161 ResNet-50 leaves from
    malloc come back page-faulted after glibc trims its heap, and on the dev VM
    the first touch of memory handed back to the hypervisor took up to 1.1 s per
    102 MB instead of ~8 ms for a copy into warm buffers.
    """

    def __init__(self, plan: FusionPlan, max_sets: int = 3) -> None:
        self.plan = plan
        self.max_sets = max_sets
        self._sets: list[list[np.ndarray]] = []
        #: The buckets of the last ``pack`` (valid until the next one).
        self.buffers: list[np.ndarray] = self._free_set()

    def _free_set(self) -> list[np.ndarray]:
        for buffers in self._sets:
            # A free buffer is referenced by its set's list and by getrefcount's
            # argument only; every live view (a returned leaf) adds its ``base``.
            if all(sys.getrefcount(buffers[k]) == 2 for k in range(len(buffers))):
                return buffers
        buffers = []
        for b in self.plan.buckets:
            buf = np.empty(b.size, b.dtype)
            buf.fill(0)  # fault the pages in now, not during a step
            buffers.append(buf)
        if len(self._sets) < self.max_sets:
            self._sets.append(buffers)
        return buffers

    def pack(
        self, tree: Any, scale: float | None = None, skip: Sequence[int] = ()
    ) -> list[np.ndarray]:
        """Copy ``tree`` into a free bucket set and return its buckets.

        Args:
          tree: arrays with the plan's structure, shapes and dtypes.
          scale: divide floating-point leaves by this on the way (one memory
            pass for copy and division); integer leaves are copied as they are.
          skip: buckets left as they are (the caller fills them itself, e.g. a
            collective that reads the leaf and writes the bucket).
        """
        plan = self.plan
        self.buffers = self._free_set()
        leaves = plan.treedef.flatten_up_to(tree)
        skipped = set(skip)
        for i, segs in enumerate(plan.leaf_segments):
            segs = [s for s in segs if s.bucket not in skipped]
            if not segs:
                continue
            flat = np.asarray(leaves[i]).reshape(-1)
            for s in segs:
                src = flat[s.leaf_start : s.leaf_start + s.length]
                dst = self.buffers[s.bucket][s.bucket_start : s.bucket_start + s.length]
                if scale is None or np.issubdtype(dst.dtype, np.integer):
                    np.copyto(dst, src, casting="unsafe")
                else:
                    # In the wider of the two dtypes: a bfloat16 leaf divided
                    # in bfloat16 lost ~0.4% before its float32 sum.
                    wide = np.promote_types(src.dtype, dst.dtype)
                    np.divide(src, scale, out=dst, dtype=wide, casting="unsafe")
        return self.buffers

    def views(self) -> Any:
        """The tree held by the last packed buckets, without copying.

        A leaf stored whole in one bucket in its own dtype is a view into it; a
        leaf split across buckets or cast for the wire (bfloat16) is a new array.
        The views keep their bucket set out of reuse for as long as they live.
        """
        plan, leaves = self.plan, []
        for shape, dtype, segs in zip(
            plan.shapes, plan.dtypes, plan.leaf_segments, strict=True
        ):
            parts = [
                self.buffers[s.bucket][s.bucket_start : s.bucket_start + s.length]
                for s in segs
            ]
            if len(parts) == 1 and parts[0].dtype == dtype:
                leaves.append(parts[0].reshape(shape))
            elif not parts:
                leaves.append(np.zeros(shape, dtype))
            else:
                leaves.append(np.concatenate(parts).astype(dtype).reshape(shape))
        return plan.treedef.unflatten(leaves)

    def unpack(self, scale: float | None = None, out: Any | None = None) -> Any:
        """The tree held by the last packed buckets, copied out.

        Args:
          scale: divide every element by this while copying (floor division for
            integers); None: plain copy.
          out: a tree of writable C-contiguous numpy arrays of the plan's shapes
            to fill; None: new arrays.
        """
        plan = self.plan
        if out is None:
            dests = [
                np.empty(s, d) for s, d in zip(plan.shapes, plan.dtypes, strict=True)
            ]
        else:
            dests = plan.treedef.flatten_up_to(out)
            for d in dests:
                if not (
                    isinstance(d, np.ndarray)
                    and d.flags.c_contiguous
                    and d.flags.writeable
                ):
                    raise ValueError("out must hold writable C-contiguous numpy arrays")
        for dest, segs in zip(dests, plan.leaf_segments, strict=True):
            flat = dest.reshape(-1)
            for s in segs:
                src = self.buffers[s.bucket][s.bucket_start : s.bucket_start + s.length]
                dst = flat[s.leaf_start : s.leaf_start + s.length]
                if scale is None:
                    np.copyto(dst, src, casting="unsafe")
                elif np.issubdtype(src.dtype, np.integer):
                    np.floor_divide(src, scale, out=dst, casting="unsafe")
                else:
                    np.divide(src, scale, out=dst, casting="unsafe")
        return plan.treedef.unflatten(dests)
