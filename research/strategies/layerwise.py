"""``layerwise``: the DDP / Horovod baseline, buckets allreduced during the backward.

Stage gradients, in reverse stage order, are packed into buckets of about
``bucket_bytes`` (PyTorch DDP's 25 MiB by default); each bucket's allreduce
starts on the progress thread as soon as its last stage's gradient exists,
while the rest of the backward pass runs (the HiPC'17 / Horovod scheme); after
the last wait, the ordinary jitted update (``research.steps.jitted.apply_step``).
Exact synchronous SGD, as ``host`` (``tests/mpi/test_overlap.py``). Its
collectives run inside the step, so it has no ``avg(grads)`` form.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from research.options import Range, option
from research.strategies.base import StepContext, StepOut, StrategyOptions, step_phases
from research.strategies.registry import register
from research.strategies.staged import NO_CALL_FORM, Staged
from research.trace import get_tracer

if TYPE_CHECKING:
    from research.steps.flat import FlatStage
    from research.steps.state import TrainState

#: PyTorch DDP's default bucket (``bucket_cap_mb=25``, in MiB).
DDP_BUCKET_BYTES = 25 * 2**20


@register("layerwise")
@dataclasses.dataclass(frozen=True)
class LayerwiseOptions(StrategyOptions):
    """Options of ``layerwise``.

    Attributes:
      bucket_bytes: a bucket closes once it holds at least this many bytes; a
        stage larger than it is a bucket of its own (stages are not split).
      link: an emulated link (``research.comm.link``), or ``real``.
    """

    no_call_form: ClassVar[str | None] = NO_CALL_FORM

    bucket_bytes: int = option(DDP_BUCKET_BYTES, Range(ge=1, le=2**40))
    link: str = "real"

    def create(self, world: Any) -> Layerwise:
        return Layerwise(world, self)


class Layerwise(Staged):
    """Bucketed allreduce overlapped with the backward pass (DDP-style)."""

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
            if filled >= self.options.bucket_bytes:
                buckets.append(current)
                current, filled = [], 0
        if current:
            buckets.append(current)
        return buckets

    def allreduce(self, buf: np.ndarray, label: str, out: np.ndarray | None = None):
        """Start the sum of ``buf`` over ranks (into ``out``, or a fresh buffer)."""
        return self.engine.allreduce(buf, out=out, name=f"allreduce {label}")

    def start(self, state: TrainState, ctx: StepContext) -> None:
        super().start(state, ctx)
        from research.steps.flat import FlatStage, aligned_empty

        flats = [FlatStage(s, state.params) for s in self.stages]
        self.buckets = self.plan([f.nbytes for f in flats])
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
        import jax
        import jax.numpy as jnp

        from research.steps import jitted as steps
        from research.steps.flat import host_view
        from research.steps.state import tree_bytes

        self._begin()
        metrics = self._forward(state, x, y, step)
        grads, handles, done = {}, [], {}
        divisor = jnp.float32(self.size)

        def on_grad(i: int, g: Any) -> None:
            done[i] = g
            k = self._closes.get(i)
            if k is not None:
                trees = [done.pop(j) for j in self.buckets[k]]
                buf = np.asarray(_jit(_pack_bucket)(self._parts[k], trees, divisor))
                self._sent += buf.nbytes
                out = self._out[k]
                handles.append(self.allreduce(buf, self._labels[k], out=out))

        self._backward(step, on_grad)
        hold()
        for k, h in enumerate(handles):
            out = self._wait(h, f"allreduce {self._labels[k]}", step)
            for part in _jit(_split_bucket)(self._parts[k], host_view(out)):
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


def _pack_bucket(part: tuple[FlatStage, ...], trees: list, divisor: Any) -> Any:
    """A bucket's stages' gradients as one message vector."""
    import jax.numpy as jnp

    return jnp.concatenate(
        [f._pack(t, divisor) for f, t in zip(part, trees, strict=True)]
    )


def _split_bucket(part: tuple[FlatStage, ...], flat: Any) -> list[Any]:
    """A bucket's message vector back into its stages' gradient trees."""
    out, start = [], 0
    for f in part:
        out.append(f._unpack(flat[start : start + f.n]))
        start += f.n
    return out


@functools.cache
def _jit(fn: Any) -> Any:
    """``fn`` jitted, its bucket (the first argument) static: once."""
    import jax

    return jax.jit(fn, static_argnums=0)
