"""SC18's FC-activation exchange: dense layers averaged through their activations.

A dense layer ``z = x W + b`` has the weight gradient ``x^T dz`` over the batch,
so the mean over ranks of its gradient needs only every rank's input ``x`` and
output error ``dz``: ``(in + out) x batch`` floats per rank instead of
``in x out``. For VGG-16's fc layers at a small batch that is a few
kilobytes instead of tens of megabytes (the authors' ``pcnn`` does this for
its fully connected layers). Every rank then computes the same full gradient
of the layer (its ``in x out`` matmul over ``P x batch`` rows instead of
``batch``) and applies the same full update: no reduce-scatter, no sharded
update and no allgather for those stages, and their optimizer state is whole
on every rank (not 1/P).

``ActivationExchange`` is what the ``overlap`` strategy runs for it (option
``fc_exchange``, ``research.strategies.overlap``), for stages that
``research.steps.stages`` runs tapped: each stage's inputs are allgathered as
soon as its forward is done (the rest of the forward and the backward hide it),
its errors as soon as its backward is done, and ``update`` turns both into the
stage's new parameters and optimizer state. The allgathers are the strategy's
(``allgather(buf, label, out=) -> handle``): nothing here communicates.
The gradient is exact: ``research.steps.stages.dense_grads``, checked against
``host`` in ``tests/mpi/test_overlap.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from research.steps.flat import aligned_empty, host_view
from research.steps.stages import Stage, dense_grads


def ravel_concat(leaves: list) -> jax.Array:
    """The leaves as one float32 vector (a static ``post`` for the backward)."""
    return jnp.concatenate([jnp.ravel(x).astype(jnp.float32) for x in leaves])


class ActivationExchange:
    """Allgathers and updates of the tapped (dense) stages of an overlap step.

    Args:
      allgather: ``allgather(buf, label, out=None) -> handle``, started on
        every rank (``handle.wait()`` gives every rank's ``buf`` in ``out``).
      size: ranks in the job.
      stages: the tapped stages.
      tx: the run's optax transformation (elementwise, as for the shards).
    """

    def __init__(
        self,
        allgather: Callable[..., Any],
        size: int,
        stages: Sequence[Stage],
        tx: optax.GradientTransformation,
    ) -> None:
        self.allgather, self.size = allgather, size
        self.stages = {s.index: s for s in stages}
        # Per stage: per-rank shapes of the layers' inputs (known once its
        # forward has run) and reused result buffers (the update reads them before
        # the next step's allgathers write them).
        self._shapes: dict[int, tuple] = {}
        self._buffers: dict[tuple[int, str], np.ndarray] = {}
        size = self.size

        def update(params, opt, xs, dzs, in_shapes):
            err_shapes = [
                (*s[:-1], params[k]["kernel"].shape[1])
                for k, s in zip(sorted(params), in_shapes, strict=True)
            ]
            inputs = _unstack(xs, in_shapes, size)
            errors = _unstack(dzs, err_shapes, size)
            grads = dense_grads(params, inputs, errors, size)
            upd, opt = tx.update(grads, opt, params)
            return optax.apply_updates(params, upd), opt

        # The optimizer state is donated (updated in place); the parameters
        # are not: the step's state still holds them.
        self._update = jax.jit(update, static_argnums=4, donate_argnums=1)

    def __contains__(self, i: int) -> bool:
        return i in self.stages

    def _out(self, i: int, what: str, n: int) -> np.ndarray:
        buf = self._buffers.get((i, what))
        if buf is None or buf.size != self.size * n:
            buf = self._buffers[i, what] = aligned_empty(self.size * n)
        return buf

    def start_inputs(self, i: int, inputs: Sequence[jax.Array]) -> tuple[Any, int]:
        """Start gathering every rank's inputs of stage ``i``'s layers; the
        handle and the bytes handed to MPI."""
        self._shapes[i] = tuple(tuple(a.shape) for a in inputs)
        parts = [np.asarray(a, np.float32).reshape(-1) for a in inputs]
        buf = parts[0] if len(parts) == 1 else np.concatenate(parts)
        out = self._out(i, "inputs", buf.size)
        name = f"inputs {self.stages[i].name}"
        return self.allgather(buf, name, out=out), buf.nbytes

    def start_errors(self, i: int, flat: jax.Array) -> tuple[Any, int]:
        """Start gathering every rank's output errors of stage ``i``'s layers
        (``flat``: ``ravel_concat`` of them); the handle and the bytes."""
        buf = np.asarray(flat)
        out = self._out(i, "errors", buf.size)
        name = f"errors {self.stages[i].name}"
        return self.allgather(buf, name, out=out), buf.nbytes

    def update(
        self, i: int, params: Any, opt: Any, inputs: np.ndarray, errors: np.ndarray
    ) -> tuple[Any, Any]:
        """Stage ``i``'s new parameters and optimizer state, from the gathered
        inputs and errors (host buffers, read in place)."""
        xs, dzs = host_view(inputs.reshape(-1)), host_view(errors.reshape(-1))
        return self._update(params, opt, xs, dzs, self._shapes[i])


def _unstack(flat: jax.Array, shapes: Sequence[tuple], size: int) -> list:
    """Every rank's leaves from an allgathered vector, ranks stacked per leaf."""
    n = sum(int(np.prod(s)) for s in shapes)
    rows = flat.reshape(size, n)
    out, start = [], 0
    for s in shapes:
        k = int(np.prod(s))
        out.append(rows[:, start : start + k].reshape(size * s[0], *s[1:]))
        start += k
    return out
