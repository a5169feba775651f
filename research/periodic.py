"""One place that decides periodic actions (big_vision's ``itstime``)."""

from __future__ import annotations


def itstime(
    step: int, every: int, total: int, *, last: bool = True, first: bool = False
) -> bool:
    """True when an action due every ``every`` steps should run after ``step``.

    Args:
      step: number of completed steps (1-based).
      every: period in steps; 0 or negative disables the action (except ``last``).
      total: total steps of the run.
      last: also run after the final step.
      first: also run after the first step.
    """
    if last and step == total:
        return True
    if first and step == 1:
        return True
    return every > 0 and step % every == 0
