"""``layerwise``: the DDP / Horovod baseline, a strategy in one module.

Stage gradients, in reverse stage order, are packed into buckets of about
``bucket_bytes`` (PyTorch DDP's 25 MiB by default); each bucket's allreduce
starts on the progress thread as soon as its last stage's gradient exists,
while the rest of the backward pass runs (the HiPC'17 / Horovod scheme); after
the last wait, the ordinary jitted update (``research.train.step.apply_step``).
Exact synchronous SGD, as ``host`` (``tests/mpi/test_overlap.py``).

Everything ``layerwise`` is lives here: :class:`LayerwiseAllreduce`, its
communication (registered as a strategy; its options are its constructor's
annotated keywords, read before launch by :mod:`research.comm.declared`), and
:class:`LayerwiseExecutor`, how its step runs (registered as the executor the
averager names). This is the shape for a new strategy: one module like this one
and one test; nothing else names it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from research.comm.asynchronous.handles import Handle
from research.comm.registry import Range, register_averager
from research.comm.sharded import HandledAverager
from research.trace import get_tracer
from research.train import step as steps
from research.train.executors import StepOut, register_executor, step_phases
from research.train.flat import FlatStage, aligned_empty, host_view
from research.train.sharded import StagedExecutor
from research.train.state import TrainState, tree_bytes

#: PyTorch DDP's default bucket (``bucket_cap_mb=25``, in MiB).
DDP_BUCKET_BYTES = 25 * 2**20


@register_averager("layerwise")
class LayerwiseAllreduce(HandledAverager):
    """Bucketed allreduce started as the backward pass fills each bucket.

    Args:
      world: the world to average over.
      bucket_bytes: a bucket closes once it holds at least this many bytes; a
        stage larger than it is a bucket of its own (stages are not split).
      link: an emulated link (``research.comm.link``) or ``"real"``.
    """

    executor = "layerwise"
    name = "layerwise"
    option_ranges = {"bucket_bytes": Range(ge=1, le=2**40)}
    no_call_form = (
        "its allreduces start during the backward pass, bucket by bucket, "
        "inside the Trainer's executor. Use experiments.train --strategy "
        "layerwise, or research.comm.asynchronous.handles.AsyncComm for the "
        "nonblocking calls"
    )

    def __init__(
        self, world: Any, *, bucket_bytes: int = DDP_BUCKET_BYTES, link: str = "real"
    ) -> None:
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
        super().__init__(world, link=link, name="layerwise")
        self.bucket_bytes = int(bucket_bytes)

    def plan(self, stage_bytes: Sequence[int]) -> list[list[int]]:
        """Buckets of stage indices, in the order the backward pass fills them.

        Args:
          stage_bytes: gradient bytes of each stage, in forward order.

        Returns:
          Lists of stage indices, last stage first; every stage in exactly one.
        """
        buckets, current, filled = [], [], 0
        for i in reversed(range(len(stage_bytes))):
            current.append(i)
            filled += int(stage_bytes[i])
            if filled >= self.bucket_bytes:
                buckets.append(current)
                current, filled = [], 0
        if current:
            buckets.append(current)
        return buckets

    def allreduce(
        self, buf: np.ndarray, label: str, out: np.ndarray | None = None
    ) -> Handle:
        """Start the sum of ``buf`` over ranks (into ``out``, or a fresh buffer)."""
        return self.engine.allreduce(buf, out=out, name=f"allreduce {label}")


class BucketAllreduce(Protocol):
    """What the ``layerwise`` executor calls beyond ``Averager``."""

    size: int

    def plan(self, sizes: Sequence[int]) -> list[list[int]]:
        """Stage indices per bucket, in backward order, from stage byte sizes."""

    def allreduce(self, buf: np.ndarray, label: str, out: Any = None) -> Handle:
        """Start a non-blocking sum of ``buf`` (into ``out``); a handle to wait on."""


@register_executor("layerwise")
class LayerwiseExecutor(StagedExecutor):
    """Bucketed allreduce overlapped with the backward pass (DDP-style)."""

    needs = BucketAllreduce

    def start(self, state: TrainState) -> None:
        flats = [FlatStage(s, state.params) for s in self.stages]
        self.buckets = self.averager.plan([f.nbytes for f in flats])
        self._closes = {b[-1]: k for k, b in enumerate(self.buckets)}
        self._labels = [
            self.stages[b[0]].name
            if len(b) == 1
            else f"{self.stages[b[0]].name}..{self.stages[b[-1]].name}"
            for b in self.buckets
        ]
        self._parts = [tuple(flats[i] for i in b) for b in self.buckets]
        # Result buffers reused every step (the update reads them before the
        # next step's allreduces write them), at addresses JAX can alias.
        self._out = [
            aligned_empty(sum(flats[i].padded for i in b)) for b in self.buckets
        ]

    def step(self, state, x, y, *, step, hold) -> StepOut:
        self._begin()
        metrics = self._forward(state, x, y, step)
        grads, handles, done = {}, [], {}
        divisor = jnp.float32(self.size)

        def on_grad(i: int, g: Any) -> None:
            done[i] = g
            k = self._closes.get(i)
            if k is not None:
                trees = [done.pop(j) for j in self.buckets[k]]
                buf = np.asarray(_pack_bucket(self._parts[k], trees, divisor))
                self._sent += buf.nbytes
                out = self._out[k]
                handles.append(self.averager.allreduce(buf, self._labels[k], out=out))

        self._backward(step, on_grad)
        hold()
        for k, h in enumerate(handles):
            out = self._wait(h, f"allreduce {self._labels[k]}", step)
            for part in _split_bucket(self._parts[k], host_view(out)):
                grads.update(part)
        t1 = time.perf_counter()
        with get_tracer().span("update", "update", step=step):
            state = steps.apply_step(state, grads, self.staged.batch_stats)
            jax.block_until_ready(state.params)
        info = self._info(step, tree_bytes(state.opt_state))
        phases = step_phases(
            self._compute,
            exposed_s=info.wait_s,
            busy_s=info.extra["comm_s"],
            update_s=time.perf_counter() - t1,
        )
        return state, jax.device_get(metrics), info, phases


@functools.partial(jax.jit, static_argnums=0)
def _pack_bucket(part: tuple[FlatStage, ...], trees: list, divisor: Any) -> jax.Array:
    """A bucket's stages' gradients as one message vector."""
    return jnp.concatenate(
        [f._pack(t, divisor) for f, t in zip(part, trees, strict=True)]
    )


@functools.partial(jax.jit, static_argnums=0)
def _split_bucket(part: tuple[FlatStage, ...], flat: jax.Array) -> list[Any]:
    """A bucket's message vector back into its stages' gradient trees."""
    out, start = [], 0
    for f in part:
        out.append(f._unpack(flat[start : start + f.n]))
        start += f.n
    return out
