"""SparCML's top-k with error feedback as one call in your own loop.

::

    topk = TopKAllreduce(world, density=0.01)      # or MPI.COMM_WORLD
    for step in ...:
        grads = grad_fn(params, batch)             # your jitted gradient
        mean, info = topk(grads)                   # selected, summed, averaged
        params, opt = apply(params, opt, mean)
    ckpt.save(step, {"params": params, "topk": topk.state()})

Each call adds the gradient to this rank's residual, selects the k largest
entries by magnitude in one pass on the host (the exact top-k set, exactly k:
:class:`research.comm.sparse.select.TopKSelector`), keeps every entry not sent
in the residual (sent + kept = accumulated, bit for bit), sums the selected
entries over ranks with the sparse allreduce (``algorithm="auto"`` picks the
cheapest of SparCML's algorithms), and returns the mean as a tree shaped like
``grads``. The residual is this rank's own (it differs between ranks): save
``state()`` per rank (DeepFreeze's ``rank_local``) and hand it back with
``load_state`` to resume exactly. The ``sparse`` strategy runs this same
object (``research/strategies/sparse.py``: its one call in a user's loop, and
in the Trainer's step :meth:`select` and :meth:`sum` timed apart, weight decay
added to the local gradient first).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from research.comm.info import CommInfo
from research.comm.sparse.mean import SparseMean
from research.comm.sparse.select import TopKSelector, k_for
from research.comm.sparse.vector import MeanBuffer


class TopKAllreduce:
    """``mean, info = topk(grads)``: top-k with error feedback over ranks.

    Args:
      world: a World or an mpi4py intracommunicator (every rank builds it).
      density: fraction of the entries each rank sends (k = ceil(density n)).
      scope: ``"global"`` (k over the whole gradient) or ``"per-layer"`` (k of
        each leaf's own entries).
      error_feedback: keep what is not sent for the next call (False: drop it).
      bits: quantize the sent values to 2, 4 or 8 bits (0: float32).
      algorithm: the sparse allreduce (``"auto"``: by its cost model).
      seed: seeds the selection's sample positions and the quantization.
      link: an emulated link for the allreduce (``research.comm.link``).
      wd: weight decay added to the gradient before selection (``g + wd p``;
        pass the parameters to :meth:`select`), 0 for none.
      mean: the sparse mean to communicate through (a strategy's own, shared
        by its other uses); None: one is made from the options above.
    """

    def __init__(
        self,
        world: Any,
        *,
        density: float = 0.01,
        scope: str = "global",
        error_feedback: bool = True,
        bits: int = 0,
        algorithm: str = "auto",
        seed: int = 0,
        link: str = "real",
        wd: float = 0.0,
        mean: SparseMean | None = None,
    ) -> None:
        if not 0 < density <= 1:
            raise ValueError(f"density must be in (0, 1], got {density}")
        if scope not in ("global", "per-layer"):
            raise ValueError(f"scope must be global or per-layer, got {scope!r}")
        self.mean = mean or SparseMean(
            world, bits=bits, algorithm=algorithm, seed=seed, link=link
        )
        self.density, self.scope = float(density), scope
        self.error_feedback, self.seed = bool(error_feedback), int(seed)
        self.wd = float(wd)
        self.step = 0
        self._layout: tuple | None = None
        self._pending: np.ndarray | None = None  # a residual loaded before call 1

    def start(self, leaves: list[Any], treedef: Any) -> None:
        """Fix the layout from the gradient's (or parameters') leaves."""
        self._start(leaves, treedef)

    def _start(self, leaves: list[Any], treedef: Any) -> None:
        sizes = [int(np.size(x)) for x in leaves]
        if self.scope == "global":
            ks, segments = [k_for(self.density, sum(sizes))], None
        else:
            ks = [k_for(self.density, n) for n in sizes]
            segments = [(i, i + 1) for i in range(len(sizes))]
        self.dim = sum(sizes)
        if self.dim >= 2**31:
            raise ValueError("TopKAllreduce: more than 2**31 - 1 entries")
        self.k = sum(ks)
        self.selector = TopKSelector(
            sizes,
            ks,
            segments=segments,
            wd=self.wd,
            error_feedback=self.error_feedback,
            seed=self.seed,
        )
        self.residual = np.zeros(self.dim, np.float32)
        self._mean = MeanBuffer(self.dim, self.mean.size)
        shapes = [tuple(np.shape(x)) for x in leaves]
        dtypes = [np.dtype(x.dtype) for x in leaves]
        self._layout = (treedef, shapes, dtypes, sizes)
        if self._pending is not None:
            self._adopt(self._pending)
            self._pending = None

    def __call__(self, grads: Any) -> tuple[Any, CommInfo]:
        """The mean over ranks of every rank's selected entries, shaped like
        ``grads`` (jax arrays for jax input, else numpy), and the round's
        record. Collective: every rank calls it once per step."""
        leaves, treedef = jax.tree.flatten(grads)
        if any(isinstance(x, jax.core.Tracer) for x in leaves):
            raise TypeError(
                "TopKAllreduce runs on the host: call it on the gradients your "
                "jitted step returned, outside jit"
            )
        if self._layout is None:
            self._start(leaves, treedef)
        elif treedef != self._layout[0]:
            raise ValueError("the gradient's tree changed since the first call")
        idx, vals = self.select(leaves, None, self.step)
        mean, info = self.sum(idx, vals, self.step)
        self.step += 1
        _, shapes, dtypes, sizes = self._layout
        as_jax = any(isinstance(x, jax.Array) for x in leaves)
        out, off = [], 0
        for shape, dtype, n in zip(shapes, dtypes, sizes):
            piece = mean[off : off + n].reshape(shape).astype(dtype)  # a copy
            out.append(jnp.asarray(piece) if as_jax else piece)
            off += n
        return jax.tree.unflatten(treedef, out), info

    def select(
        self, grads: list[Any], params: list[Any] | None, step: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """This rank's selected positions and values; the residual keeps the
        rest. ``grads`` (and ``params`` when ``wd``) are leaf lists in the
        layout's order; zero-copy views of jax CPU arrays are read in place."""
        flat = [np.asarray(x, np.float32).reshape(-1) for x in grads]
        if params is not None:
            params = [np.asarray(x, np.float32).reshape(-1) for x in params]
        return self.selector.select(self.residual, flat, params, step)

    def sum(
        self, idx: np.ndarray, vals: np.ndarray, step: int
    ) -> tuple[np.ndarray, CommInfo]:
        """The mean over ranks of everyone's selection, as a flat float32
        vector that the next call overwrites (collective)."""
        total, info = self.mean.reduce_sparse_sum(idx, vals, self.dim, step)
        return self._mean.set(total), info

    def residual_tree(self) -> Any:
        """The residual shaped like the gradient: numpy views of it, in the
        layout of the first call (None before it)."""
        if self._layout is None:
            return None
        treedef, shapes, _, sizes = self._layout
        out, off = [], 0
        for shape, n in zip(shapes, sizes):
            out.append(self.residual[off : off + n].reshape(shape))
            off += n
        return jax.tree.unflatten(treedef, out)

    def state(self) -> dict[str, Any]:
        """What to checkpoint (per rank): the residual (a copy) and the step."""
        residual = None if self._layout is None else self.residual.copy()
        return {"residual": residual, "step": np.int64(self.step)}

    def load_state(self, state: dict[str, Any]) -> None:
        """Take back what :meth:`state` returned (before the first call too:
        the residual is then adopted by the first call)."""
        self.step = int(state["step"])
        residual = state.get("residual")
        if residual is None:
            return
        residual = np.asarray(residual, np.float32)
        if self._layout is None:
            self._pending = residual
        else:
            self._adopt(residual)

    def _adopt(self, residual: np.ndarray) -> None:
        if residual.shape != self.residual.shape:
            raise ValueError(
                f"residual of {residual.size} entries for a gradient of {self.dim}"
            )
        np.copyto(self.residual, residual)
