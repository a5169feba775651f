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
    residual folded back) to the gradient it is given; else the averager."""

    executor = "host-side"

    def __init__(self, inner: Averager) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.pending: Any = None

    def fold(self, tree: Any) -> None:
        """Add ``tree`` to the next gradient (to what is already pending)."""
        self.pending = tree if self.pending is None else add_trees(self.pending, tree)

    def take_carried(self) -> tuple[Any, int] | None:
        """What a partial collective carried, taken back (None: nothing, or
        not a partial collective)."""
        take = getattr(self.inner, "take_carried", None)
        return None if take is None else take()

    def rest(self) -> None:
        """A partial collective left for a while polls rarely (else nothing)."""
        rest = getattr(self.inner, "rest", None)
        if rest is not None:
            rest()

    def reduce(self, grads: Any) -> tuple[Any, CommInfo]:
        if self.pending is not None:
            grads = add_trees(grads, self.pending)
            self.pending = None
        return self.inner.reduce(grads)

    def drain(self) -> tuple[Any, CommInfo] | None:
        return self.inner.drain()

    def close(self) -> None:
        self.inner.close()


def add_trees(a: Any, b: Any) -> Any:
    """``a + b`` leaf by leaf, as float32 numpy (the same bits jax would give)."""
    return jax.tree.map(lambda x, y: np.add(np.asarray(x), np.asarray(y)), a, b)
