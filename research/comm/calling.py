"""One calling convention for the averaging strategies: ``research.averaging``.

Here in ``research.comm`` (the strategies' own ``averaging`` forms build these
wrappers); ``research.api`` and ``research.averaging`` re-export it.

::

    avg = research.averaging("solo", world, full_every=8)   # or MPI.COMM_WORLD
    for step in ...:
        grads = grad_fn(params, batch)
        grads, info = avg(grads)          # the same kind of arrays you passed
        params, opt = apply(params, opt, grads)
    rest = avg.drain()                    # what is still in flight, or None
    if rest is not None:
        params, opt = apply(params, opt, rest[0])
    avg.close()

Every strategy a user can name answers ``avg(grads) -> (grads, info)`` with
``info`` a :class:`research.comm.base.CommInfo` (bytes sent, contributors,
staleness, wait), ``avg.drain()`` (``None`` when nothing is held back, so a
loop never applies a zero gradient that momentum would turn into a step),
``avg.state()`` / ``avg.load_state(s)`` (what must be checkpointed with the
model, per rank), and ``avg.close()``:

* ``fused``: the mean inside ``jit`` (call it in your jitted step, where it is
  part of the compiled program) or outside (a cached jitted mean);
* ``host``: the mean on the host, outside ``jit``;
* ``solo``, ``majority``, ``sync``: eager-SGD's partial allreduce, outside
  ``jit``; ``drain`` hands over what missed its round;
* ``sparse``: top-k with error feedback (:class:`TopKAllreduce`), outside
  ``jit``; ``state`` is this rank's residual;
* ``adaptive``: one of ``host``, top-k, ``majority``, ``solo`` at a time,
  chosen from measurements as it goes (:mod:`research.comm.adaptive.call`);
  ``state`` is its policy and, in a top-k phase, the residual.

Communication watchdog (:mod:`research.comm.faults.watchdog`): ``comm_timeout=``
(seconds, ``"auto"``, ``"off"``) sets this process's timeout; a call of
``avg`` outside ``jit`` is watched by itself. A jitted step of your own that
holds the ``fused`` mean runs where no Python does: call it inside
``research.comm.faults.watchdog.watch("my step")`` to have it watched too.

Not offered in this form, each saying why (``Averager.no_call_form``): ``ps``
(the parameter server exchanges gradients for parameters, it returns no mean),
``layerwise`` and ``overlap`` (their collectives run stage by stage inside the
backward and the next forward: ``experiments.train --strategy overlap``, or
their building block ``research.comm.asynchronous.handles.AsyncComm``). A strategy
decides its own form: ``Averager.averaging`` (``sparse`` overrides it).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from research.comm.base import CommInfo


def averaging(
    name: str, world: Any, *, comm_timeout: float | str | None = None, **options: Any
) -> Averaging:
    """The strategy ``name`` behind one calling convention (see module doc).

    Args:
      name: a strategy that has the form (``experiments.train --list``).
      world: a :class:`research.comm.world.World` or an mpi4py
        intracommunicator (collective: every rank of it builds it alike).
      comm_timeout: the communication watchdog's timeout for this process
        (seconds, ``"auto"`` or ``"off"``; None: leave it as it is).
      **options: the strategy's options (``experiments.train --list``).

    Raises:
      ValueError: an unknown name, a strategy not offered in this form (with
        the reason and what to use instead), or a bad option.
    """
    from research.comm.registry import averager_factory, check_options

    problem = check_options(name, options)
    if problem:
        raise ValueError(problem)
    factory = averager_factory(name)
    why = getattr(factory, "no_call_form", None)
    if why:
        raise ValueError(f"strategy {name!r} has no avg(grads) form: {why}")
    make = getattr(factory, "averaging", None)
    avg = make(world, **options) if make else wrap(factory(world, **options))
    if comm_timeout is not None:
        from research.comm.faults import watchdog

        watchdog.configure(comm_timeout)
    return avg


def offered() -> list[str]:
    """The strategies that have the ``avg(grads)`` form."""
    from research.comm.registry import averager_factory, list_averagers

    return [
        n
        for n in list_averagers()
        if not getattr(averager_factory(n), "no_call_form", None)
    ]


def wrap(averager: Any) -> Averaging:
    """An averager behind the one call, by the kind of executor that runs it."""
    if averager.executor == "fused":
        return _InJit(averager)
    if averager.executor == "host-side":
        return _HostSide(averager)
    raise ValueError(
        f"strategy {averager.name!r} has no avg(grads) form; these do: {offered()}"
    )


class Averaging:
    """``grads, info = avg(grads)``; ``drain``, ``state``, ``load_state``, ``close``."""

    name: str

    def __call__(self, grads: Any) -> tuple[Any, CommInfo]:
        raise NotImplementedError

    def drain(self) -> tuple[Any, CommInfo] | None:
        """What is still held back, as ``(grads, info)``, or None (nothing)."""
        return None

    def state(self) -> dict[str, Any]:
        """What to checkpoint with the model, per rank ({} when nothing)."""
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        """Take back what :meth:`state` returned."""

    def close(self) -> None:
        """Release threads and communicators (collective for some strategies)."""

    def __enter__(self) -> Averaging:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:  # never a collective on an error path
            self.close()


def _host_side(name: str, grads: Any) -> list[Any]:
    leaves = jax.tree.leaves(grads)
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
        raise TypeError(
            f"strategy {name!r} averages on the host: call avg(grads) on the "
            "gradients your jitted step returned, outside jit (only 'fused' "
            "runs inside jit)"
        )
    return leaves


def _like(grads_in: list[Any], out: Any) -> Any:
    """``out`` as jax arrays when the caller passed jax arrays, else as is."""
    if any(isinstance(x, jax.Array) for x in grads_in):
        return jax.tree.map(jnp.asarray, out)
    return out


class _InJit(Averaging):
    def __init__(self, averager: Any) -> None:
        self.averager, self.name = averager, averager.name
        self._jitted = jax.jit(averager.average_in_jit)

    def __call__(self, grads: Any) -> tuple[Any, CommInfo]:
        leaves = jax.tree.leaves(grads)
        size = self.averager.size
        nbytes = sum(int(x.size) * x.dtype.itemsize for x in leaves)
        info = CommInfo(bytes=nbytes, contributors=size, staleness=0)
        if any(isinstance(x, jax.core.Tracer) for x in leaves):
            return self.averager.average_in_jit(grads), info
        from research.comm.faults import watchdog

        with watchdog.watch(f"{self.name} mean", detail=self.averager.path()):
            return jax.block_until_ready(self._jitted(grads)), info


class _HostSide(Averaging):
    def __init__(self, averager: Any) -> None:
        self.averager, self.name = averager, averager.name
        self._last: list[Any] = []  # the last call's input leaves, for their kind

    def __call__(self, grads: Any) -> tuple[Any, CommInfo]:
        self._last = _host_side(self.name, grads)[:1]
        out, info = self.averager.reduce(grads)
        return _like(self._last, out), info

    def drain(self) -> tuple[Any, CommInfo] | None:
        rest = self.averager.drain()
        if rest is None:  # nothing carried: no zero-gradient step
            return None
        tree, info = rest
        return _like(self._last, tree), info

    def close(self) -> None:
        self.averager.close()


class TopK(Averaging):
    """A :class:`~research.comm.sparse.topk.TopKAllreduce` behind the one call."""

    def __init__(self, topk: Any) -> None:
        self.topk, self.name = topk, topk.averager.name

    def __call__(self, grads: Any) -> tuple[Any, CommInfo]:
        return self.topk(grads)

    def state(self) -> dict[str, Any]:
        return self.topk.state()

    def load_state(self, state: dict[str, Any]) -> None:
        self.topk.load_state(state)
