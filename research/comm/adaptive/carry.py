"""What one method of the ``adaptive`` strategy hands the next at a switch.

A switch carries what the old method has not delivered yet into the new one's
first step: top-k's error-feedback residual, or the gradients a partial
collective carried; :class:`Folded` adds such a tree to the next gradient a
host-side averager is given, :func:`add_trees` adds two trees.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from research.comm.base import Averager, CommInfo


class Folded(Averager):
    """A host-side averager whose next ``reduce`` adds a carried tree (the
    residual folded back) to the gradient it is given; else the averager.
    The carried tree's own arrays take the sum where they can (a top-k
    residual's views, a partial collective's taken-back tree): the fold then
    allocates nothing."""

    executor = "host-side"

    def __init__(self, inner: Averager) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.pending: Any = None

    def fold(self, tree: Any) -> None:
        """Add ``tree`` to the next gradient (to what is already pending)."""
        self.pending = tree if self.pending is None else add_trees(self.pending, tree)

    def take_carried(self, flat: bool = False) -> tuple[Any, int] | None:
        """What a partial collective carried, taken back (None: nothing, or
        not a partial collective)."""
        take = getattr(self.inner, "take_carried", None)
        return None if take is None else take(flat)

    def rest(self, resting: bool = True) -> None:
        """A partial collective left for a while polls rarely, and again at
        its usual pace when about to run (else nothing)."""
        rest = getattr(self.inner, "rest", None)
        if rest is not None:
            rest(resting)

    def reduce(self, grads: Any) -> tuple[Any, CommInfo]:
        if self.pending is not None:
            grads = jax.tree.map(_add_into, self.pending, grads)
            self.pending = None
        return self.inner.reduce(grads)

    def drain(self) -> tuple[Any, CommInfo] | None:
        return self.inner.drain()

    def close(self) -> None:
        self.inner.close()


def _add_into(carried: Any, grad: Any) -> np.ndarray:
    """``carried + grad``, into ``carried`` when it is a writable array of the
    gradient's dtype (no new memory: the sum is the gradient handed on)."""
    c, g = np.asarray(carried), np.asarray(grad)
    if c.flags.writeable and c.dtype == g.dtype and c.shape == g.shape:
        return np.add(c, g, out=c)
    return np.add(c, g)


def add_trees(a: Any, b: Any) -> Any:
    """``a + b`` leaf by leaf, as float32 numpy (the same bits jax would give)."""
    return jax.tree.map(lambda x, y: np.add(np.asarray(x), np.asarray(y)), a, b)
