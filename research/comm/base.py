"""The one seam through which every gradient-averaging strategy plugs into the loop.

A strategy receives one step's gradients and returns the gradients to apply plus a
:class:`CommInfo` record of what happened. Two execution styles exist:

* ``fused``: :meth:`Averager.average_in_jit` is traced into the jitted train step,
  so gradient, allreduce (mpi4jax) and update are one XLA program;
* ``staged``: the loop runs a jitted gradient step, hands the gradients to
  :meth:`Averager.reduce` on the host (communication may run on the progress
  thread and may return a different round's result, as partial collectives do),
  then runs a jitted update with what came back.

A strategy may also set ``replaces_update = True`` and return new *parameters*
(a parameter server); the loop then skips its own optimizer update.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

Style = Literal["fused", "staged"]


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

    style: ClassVar[Style] = "staged"
    #: True when ``reduce`` returns parameters to use, not gradients to apply.
    replaces_update: ClassVar[bool] = False
    name: ClassVar[str] = "base"

    def average_in_jit(self, grads: Any) -> Any:
        """Fused style: average ``grads`` inside a jitted function."""
        raise NotImplementedError(f"{type(self).__name__} is not a fused strategy")

    def reduce(self, grads: Any) -> tuple[Any, CommInfo]:
        """Staged style: return the gradients to apply and a record of the call."""
        raise NotImplementedError(f"{type(self).__name__} is not a staged strategy")

    def flush(self) -> tuple[Any, CommInfo] | None:
        """Deliver whatever a staged strategy still carries (None: nothing)."""
        return None

    def close(self) -> None:
        """Release threads and communicators. Idempotent."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
