"""Donation-proof snapshots: what the training thread does while a step is held.

The jitted step donates the state, so the next step may write its result into
the buffers of this one, and JAX deletes the donated arrays: a snapshot that
merely keeps references to the state's leaves breaks ("Array has been
deleted") or, read at the wrong moment, sees the next step's values. Three
ways to take a snapshot that survives donation, each leaf by leaf (only this
rank's shard):

``view`` (default on CPU)
    ``np.asarray(leaf)``: a zero-copy host view holding an external reference
    to the device buffer. PjRt cannot donate a buffer with an external
    reference, so the next step writes its result elsewhere and the view
    stays intact; no byte is copied while the step is held. The cost moves to
    the next step, which allocates fresh output buffers for the held leaves.
``host``
    copy each leaf into reusable host buffers (one memcpy of the shard, into
    memory already faulted in by earlier checkpoints).
``device`` (default on GPU/TPU)
    one jitted program that copies the shard's leaves on the device,
    dispatched asynchronously; the background thread then moves the copies
    to the host. On CPU the copy runs at dispatch, so it blocks like ``host``.

:meth:`Snapshotter.take` runs in the training thread (the blocking part);
:meth:`Snapshotter.materialize` runs in the background and returns host arrays.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from research.checkpoint.leaves import is_key

if TYPE_CHECKING:
    import jax

MODES = ("auto", "view", "host", "device")


def cut(a: Any, rows: tuple[int, int] | None) -> Any:
    return a if rows is None else a[rows[0] : rows[1]]


def _copy_all(xs: list[jax.Array], rows: tuple) -> list[jax.Array]:
    import jax.numpy as jnp

    return [jnp.copy(x) if r is None else x[r[0] : r[1]] for x, r in zip(xs, rows)]


class Snapshotter:
    """Takes snapshots of a list of leaves in one of the modes above."""

    def __init__(self, mode: str = "auto") -> None:
        import jax

        if mode not in MODES:
            raise ValueError(f"snapshot mode must be one of {MODES}, got {mode!r}")
        if mode == "auto":
            mode = "view" if jax.default_backend() == "cpu" else "device"
        self.mode = mode
        self._free: list[list[np.ndarray]] = []  # host mode: buffer sets to reuse
        self._lock = threading.Lock()  # release() runs in the background thread
        self._copy = jax.jit(_copy_all, static_argnums=1)

    def take(
        self, leaves: list[Any], rows: list[tuple[int, int] | None] | None = None
    ) -> list[Any]:
        """Capture ``leaves`` (or row blocks of them) so donation cannot change them.

        Args:
          leaves: the state's leaves to capture (this rank's units).
          rows: per leaf, ``(a, b)`` to capture rows ``a:b`` only, or None.
        """
        import jax

        rows = list(rows) if rows is not None else [None] * len(leaves)
        out: list[Any] = [None] * len(leaves)
        device_idx: list[int] = []
        bufs = self._buffers_for(leaves, rows) if self.mode == "host" else None
        for i, (x, r) in enumerate(zip(leaves, rows)):
            if is_key(x):
                out[i] = cut(np.array(jax.random.key_data(x)), r)
            elif not isinstance(x, jax.Array):
                out[i] = np.array(cut(np.asarray(x), r), copy=True)  # may change
            elif self.mode == "view":
                out[i] = cut(np.asarray(x), r)
            elif self.mode == "host":
                np.copyto(bufs[i], cut(np.asarray(x), r))
                out[i] = bufs[i]
            else:
                device_idx.append(i)
        if device_idx:
            copies = self._copy(
                [leaves[i] for i in device_idx],
                tuple(tuple(rows[i]) if rows[i] else None for i in device_idx),
            )
            for i, c in zip(device_idx, copies):
                out[i] = c
        return out

    def materialize(self, taken: list[Any]) -> list[np.ndarray]:
        """Host arrays of a snapshot (waits for device copies); background thread."""
        return [np.asarray(x) for x in taken]

    def release(self, taken: list[Any]) -> None:
        """Return a snapshot's buffers for reuse once it is written."""
        if self.mode == "host" and taken:
            with self._lock:
                self._free = [list(taken)]  # one spare set: saves are sequential

    def _buffers_for(self, leaves: list[Any], rows: list) -> list[np.ndarray | None]:
        import jax

        shapes = [
            (
                tuple(x.shape) if r is None else (r[1] - r[0], *x.shape[1:]),
                np.dtype(x.dtype),
            )
            if isinstance(x, jax.Array) and not is_key(x)
            else None
            for x, r in zip(leaves, rows)
        ]
        with self._lock:
            cand = self._free.pop() if self._free else None
        if (
            cand is not None
            and len(cand) == len(shapes)
            and all(
                s is None
                or (
                    isinstance(c, np.ndarray)
                    and c.flags.writeable
                    and (c.shape, c.dtype) == s
                )
                for s, c in zip(shapes, cand)
            )
        ):
            return [c if s is not None else None for s, c in zip(shapes, cand)]
        return [np.empty(s[0], s[1]) if s is not None else None for s in shapes]
