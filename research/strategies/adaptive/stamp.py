"""One rank's figures of one step of the ``adaptive`` strategy: its *stamp*.

Every rank stamps every step with what it measured (no MPI here); the ranks
exchange their stamps (:mod:`research.strategies.adaptive.exchange`), and every
rank's :class:`~research.strategies.adaptive.policy.Policy` reads all of them, so
the model and the decisions are the same on every rank. The fields, seconds
unless said:

* ``step``, ``method`` (the candidate's index), ``since`` (the step that
  candidate started at);
* ``total``: the step's wall time on this rank;
* ``arrive``: from the step's start to this rank's gradient being ready (its
  computation and any delay: how late it comes to the collective);
* ``comm``: the time it waited for the collective (exposed communication);
* ``bytes``: the bytes it handed to the collective;
* ``lag``: top-k's residual over this step's gradient (the guard's figure;
  NaN when not measured this step);
* ``age``: a partial collective's mean age of the gradients in its round
  (rounds late; NaN for a synchronous candidate);
* ``carried``: gradients a partial collective had carried for this rank and
  that a switch at this step took back into the next method (0 else);
* ``full``: 1 when a partial collective's round was a full one (every rank
  waited for every other: no measure of the link), else 0.
"""

from __future__ import annotations

from typing import NamedTuple

FIELDS = (
    "step", "method", "since", "total", "arrive", "comm", "bytes",
    "lag", "age", "carried", "full",
)  # fmt: skip


class Stamp(NamedTuple):
    """One rank's figures of one step (module docstring)."""

    step: float
    method: float
    since: float
    total: float
    arrive: float
    comm: float
    bytes: float
    lag: float
    age: float
    carried: float
    full: float
