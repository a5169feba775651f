"""``research.averaging``: every averaging strategy behind one call.

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

The object returned is the strategy itself (``research.strategies``), the one
the Trainer runs: ``avg(grads) -> (grads, info)`` with ``info`` a
:class:`research.comm.info.CommInfo` (bytes sent, contributors, staleness,
wait), ``avg.drain()`` (None when nothing is held back, so a loop never
applies a zero gradient that momentum would turn into a step),
``avg.state()`` / ``avg.load_state(s)`` (what must be checkpointed with the
model, per rank) and ``avg.close()``. ``fused`` works inside ``jit`` too; the
others average on the host, outside it. ``ps``, ``layerwise`` and ``overlap``
run their collectives inside the step: they have no such form, and say why.

Communication watchdog (:mod:`research.comm.faults.watchdog`): ``comm_timeout=``
(seconds, ``"auto"``, ``"off"``) sets this process's timeout; a call of
``avg`` outside ``jit`` is watched by itself. A jitted step of your own that
holds the ``fused`` mean runs where no Python does: call it inside
``research.comm.faults.watchdog.watch("my step")`` to have it watched too.
"""

from __future__ import annotations

from typing import Any

from research.strategies import registry
from research.strategies.base import Strategy

__all__ = ["averaging", "offered"]


def averaging(
    name: str, world: Any, *, comm_timeout: float | str | None = None, **options: Any
) -> Strategy:
    """The strategy ``name`` with ``options``, to call on your gradients.

    Args:
      name: a strategy that has the form (:func:`offered`).
      world: a :class:`research.comm.world.World` or an mpi4py
        intracommunicator (collective: every rank of it builds it alike).
      comm_timeout: the communication watchdog's timeout for this process
        (seconds, ``"auto"`` or ``"off"``; None: leave it as it is).
      **options: the strategy's options (``experiments.train --list``).

    Raises:
      ValueError: an unknown name, a bad option, or a strategy not offered in
        this form (with the reason and what to use instead).
    """
    options_class = registry.options_class(name)  # a ValueError lists the names
    why = options_class.no_call_form
    if why:
        raise ValueError(f"strategy {name!r} has no avg(grads) form: {why}")
    strategy = options_class.make(options).create(world)
    if comm_timeout is not None:
        from research.comm.faults import watchdog

        watchdog.configure(comm_timeout)
    return strategy


def offered() -> list[str]:
    """The strategies that have the ``avg(grads)`` form."""
    return [n for n in registry.names() if not registry.options_class(n).no_call_form]
