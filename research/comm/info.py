"""What one collective call did, as seen by this rank: :class:`CommInfo`.

Every averaging collective (``research.comm.dense``, ``partial``, ``ps``,
``sparse``) and every strategy's step (``research.strategies``) returns one;
the loop writes it to ``metrics.jsonl`` (``comm_*``).
"""

from __future__ import annotations

import dataclasses
from typing import Any


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
