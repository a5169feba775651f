"""Load-imbalance injection (placeholder interface; the eager-SGD work fills it in).

The training loop asks ``imbalance.delay(step, rank)`` once per step, inside the
compute phase, and sleeps that many seconds on the timeline's ``delay`` track.
"""

from __future__ import annotations


class Imbalance:
    """No injected delay."""

    name = "none"

    def delay(self, step: int, rank: int) -> float:
        """Seconds rank ``rank`` sleeps in step ``step`` (0-based)."""
        return 0.0
