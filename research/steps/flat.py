"""A stage's parameters as one aligned float32 vector, and host buffers JAX reads.

The message side of the staged strategies (``research.strategies.staged``):
``FlatStage`` packs a stage's parameter-shaped subtree into one padded vector
(inside the backward program, as its ``post``) and reads one back as leaves;
``aligned_empty`` and ``host_view`` give host buffers that MPI writes and JAX
reads in place; ``busy_time`` measures how long collectives were in flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from research.steps.stages import Stage

#: Leaves start at multiples of 16 float32 (64 bytes) in a stage's vector: JAX
#: aliases host memory with that alignment instead of copying it (dlpack).
ALIGN = 16


def aligned_empty(n: int) -> np.ndarray:
    """A float32 vector of ``n`` items at a 64-byte address, its pages touched
    (zeros): the first write into fresh pages costs page faults, which would
    otherwise land in whichever step first uses the buffer."""
    raw = np.empty(n + ALIGN, np.float32)
    off = (-raw.ctypes.data % (4 * ALIGN)) // 4
    out = raw[off : off + n]
    out.fill(0)
    return out


def host_view(a: np.ndarray) -> jax.Array:
    """``a`` as a JAX array sharing its memory (a copy if ``a`` is misaligned).

    The caller must not write ``a`` while the result is in use. Where JAX
    computes on an accelerator the result is a copy on this rank's device: a
    view would be an array of the CPU, which the step's programs, placed on
    the device, refuse beside their other arguments.
    """
    if jax.default_backend() != "cpu":
        return jax.device_put(a, jax.local_devices()[0])
    return jax.dlpack.from_dlpack(a)


class FlatStage:
    """A stage's parameter-shaped subtree as one float32 vector of ``padded`` items.

    Each leaf starts at a multiple of ``ALIGN`` items (zeros in between), so a
    vector at a 64-byte address can be read back as leaves without copying
    (``views``).

    Args:
      stage: the stage.
      params: a parameter tree (shapes and dtypes are read from it).
      padded: length of the vector (at least ``n``, rounded up as asked).
      divisor: what calling the instance on gradient leaves divides them by
        (it is then a static ``post`` for ``StagedGrad.backward``).
    """

    def __init__(
        self,
        stage: Stage,
        params: Any,
        padded: int | None = None,
        divisor: float = 1.0,
    ) -> None:
        leaves, self.treedef = jax.tree_util.tree_flatten(stage.params(params))
        self.stage = stage
        self.shapes = [tuple(x.shape) for x in leaves]
        self.dtypes = [x.dtype for x in leaves]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.offsets, end = [], 0
        for size in self.sizes:
            self.offsets.append(end)
            end += -(-size // ALIGN) * ALIGN
        self.n = end
        self.padded = self.n if padded is None else int(padded)
        if self.padded < self.n:
            raise ValueError(f"padded {self.padded} < {self.n} elements")
        self.divisor = float(divisor)
        self._key = (self.treedef, tuple(self.shapes), tuple(map(str, self.dtypes)))
        self._key += (self.padded, self.divisor)

    # Equal layouts are equal (and hash alike), so programs that take a
    # FlatStage as a static argument (``post``, ``pack``) are traced once per
    # layout in a process, not once per run.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, FlatStage) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def pack(self, tree: Any, divisor: Any) -> jax.Array:
        """``_pack`` as one program (per layout)."""
        return _PACK(self, tree, divisor)

    def unpack(self, flat: jax.Array) -> Any:
        """``_unpack`` as one program (per layout)."""
        return _UNPACK(self, flat)

    @property
    def nbytes(self) -> int:
        return 4 * self.padded

    def _pack(self, tree: Any, divisor: Any) -> jax.Array:
        """The subtree's leaves, raveled, divided by ``divisor``, zero-padded."""
        return self._pack_leaves(jax.tree_util.tree_leaves(tree), divisor)

    def _pack_leaves(self, leaves: list, divisor: Any) -> jax.Array:
        parts, end = [], 0
        for x, offset, size in zip(leaves, self.offsets, self.sizes, strict=True):
            if offset > end:
                parts.append(jnp.zeros(offset - end, jnp.float32))
            parts.append(jnp.ravel(x).astype(jnp.float32) / divisor)
            end = offset + size
        parts.append(jnp.zeros(self.padded - end, jnp.float32))
        return jnp.concatenate(parts)

    def __call__(self, leaves: list) -> jax.Array:
        return self._pack_leaves(leaves, jnp.float32(self.divisor))

    def _unpack(self, flat: jax.Array) -> Any:
        out = [
            flat[o : o + size].reshape(shape).astype(dtype)
            for o, size, shape, dtype in self._layout()
        ]
        return jax.tree_util.tree_unflatten(self.treedef, out)

    def _layout(self):
        return zip(self.offsets, self.sizes, self.shapes, self.dtypes, strict=True)

    def views(self, flat: np.ndarray) -> Any:
        """The leaves of a host vector as JAX arrays sharing its memory."""
        out = []
        for o, size, shape, dtype in self._layout():
            part = flat[o : o + size].reshape(shape)
            ok = dtype == np.float32
            out.append(host_view(part) if ok else jnp.asarray(part, dtype))
        return jax.tree_util.tree_unflatten(self.treedef, out)


_PACK = jax.jit(lambda f, tree, divisor: f._pack(tree, divisor), static_argnums=0)
_UNPACK = jax.jit(lambda f, flat: f._unpack(flat), static_argnums=0)


def busy_time(handles: Sequence[Any]) -> float:
    """Seconds during which at least one of ``handles`` was in flight (each a
    handle of ``research.comm.asynchronous.handles``, its ``started_at`` and
    ``total_s`` known once it is done)."""
    spans = sorted(
        (h.started_at, h.started_at + h.total_s)
        for h in handles
        if h.started_at is not None and h.total_s is not None
    )
    total, end = 0.0, -np.inf
    for a, b in spans:
        if b > end:
            total += b - max(a, end)
            end = b
    return total
