"""The communication side of a gradient-averaging strategy.

An :class:`Averager` is what a strategy does with gradients; how a training step
around it runs is its executor's business (``research.train.executors``), named
by the averager's ``executor`` attribute:

* ``"fused"``: :meth:`Averager.average_in_jit` is traced into one jitted program
  with the gradient and the update (mpi4jax);
* ``"host-side"``: :meth:`Averager.reduce` gets the step's gradients on the host and
  returns the gradients to apply (communication may run on the progress thread
  and may return another round's result, as partial collectives do);
* ``"server"``: :meth:`Averager.reduce` returns the *parameters* to continue
  from (a parameter server).

An executor that calls more than these methods declares what in its ``needs``
(a ``typing.Protocol``: ``bind`` for ``"server"``; ``plan`` and ``allreduce``
for ``"layerwise"``; ``shard_size``, ``reduce_scatter`` and ``allgather`` for
``"overlap"``; ``k_for``, ``reduce_sparse``, ... for ``"sparse"``), and a
strategy lacking any of it is refused by name when its executor is made.

Every call returns a :class:`CommInfo` record of what happened. This module
imports nothing of the strategies' registry or calling convention, which
build on it.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, ClassVar


@dataclasses.dataclass
class CommInfo:
    """What one averaging call did, as seen by this rank.

    Attributes:
      bytes: bytes this rank handed to MPI for this call (payload, not protocol).
      contributors: ranks whose fresh gradient of this step is in the result.
      staleness: how many rounds late this rank's contribution was applied (0: fresh).
      wait_s: seconds the calling (compute) thread waited for the result.
      round: round number (1, 2, ...) for round-based strategies, else the step.
      extra: strategy-specific fields, written to metrics as they are.
    """

    bytes: int = 0
    contributors: int = 0
    staleness: int = 0
    wait_s: float = 0.0
    round: int = 0
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        extra = d.pop("extra")
        d.update(extra)
        return d


class Averager:
    """Base class of gradient-averaging strategies (see module docstring)."""

    #: The executor that runs this strategy's steps (research.train.executors).
    executor: ClassVar[str] = "host-side"
    name: ClassVar[str] = "base"
    #: Why this strategy has no ``grads, info = avg(grads)`` form
    #: (``research.averaging``), with what to use instead; None: it has one.
    #: The form is the averager itself behind :func:`research.comm.calling.wrap`;
    #: a strategy whose form is another object (``sparse``: its top-k object)
    #: defines a classmethod ``averaging(world, **options)`` that builds it.
    no_call_form: ClassVar[str | None] = None

    def average_in_jit(self, grads: Any) -> Any:
        """Fused: average ``grads`` inside a jitted function."""
        raise NotImplementedError(f"{type(self).__name__} is not a fused strategy")

    def reduce(self, grads: Any) -> tuple[Any, CommInfo]:
        """Staged: the gradients to apply (server: the parameters) and a record."""
        raise NotImplementedError(f"{type(self).__name__} is not a host-side strategy")

    def drain(self) -> tuple[Any, CommInfo] | None:
        """Complete what is in flight and deliver what is still carried, as
        ``(tree, info)`` to apply, or None (nothing to apply). Collective."""
        return None

    def flush(self) -> tuple[Any, CommInfo] | None:
        """The old name of :meth:`drain`, accepted for one release."""
        renamed("Averager.flush()", "drain()")
        return self.drain()

    def close(self) -> None:
        """Release threads and communicators. Idempotent."""

    def summary(self) -> dict[str, Any]:
        """What ``summary.json`` records of this strategy beyond the loop's
        numbers (local: no collective)."""
        return {}

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_SAID: set[str] = set()


def renamed(old: str, new: str) -> None:
    """One line on stderr, once per job (rank 0 of a launched job, or a lone
    process), when an old spelling is used."""
    from research.comm.process.env import env_rank

    if old not in _SAID:
        _SAID.add(old)
        if env_rank() != 0:
            return
        print(
            f"research: {old} is now {new} (the old name works for one release)",
            file=sys.stderr,
            flush=True,
        )


def old_options(owner: str, renames: dict[str, str], old: dict[str, Any]) -> dict:
    """A constructor's ``**old`` keywords under their current names.

    Args:
      owner: who takes them (for the messages), e.g. ``"solo"``.
      renames: old name -> current name (the class's ``renamed_options``).
      old: the keywords the constructor did not name.

    Returns:
      ``{current name: value}``; each old spelling noted once (:func:`renamed`).

    Raises:
      TypeError: a keyword that is neither an option nor an old name of one.
    """
    out = {}
    for key, value in old.items():
        if key not in renames:
            raise TypeError(f"{owner}: unexpected keyword argument {key!r}")
        renamed(f"{owner} option {key}", renames[key])
        out[renames[key]] = value
    return out
