"""What a window of the ``adaptive`` strategy's steps measured: an :class:`Estimate`.

Pure bookkeeping, no MPI: each rank fills a :class:`Window`, and
:func:`estimate` makes the agreed estimate of every rank's window that
:class:`~research.comm.adaptive_policy.Policy` decides from.

Measured, per rank and step, by whoever runs the steps: the step's wall time,
the time until the rank's gradient was ready (its *arrival*: computation and
any injected delay) and the time it waited for communication. A window's
:class:`Estimate` of the method that ran in it:

* ``cost``: the slowest rank's mean step time (the pace every rank keeps), and
  ``se`` its standard error;
* ``comm``: the slowest rank's mean exposed communication per step;
* ``imbalance``: the mean over steps of (latest arrival - mean arrival): what a
  synchronous method waits for stragglers;
* ``lag`` (top-k only, the guard's figure): the norm of this rank's
  error-feedback residual over the norm of its gradient at the decision (of
  the step about to run), the largest over ranks: how many gradients' worth
  of update the model has not received yet. Error feedback keeps it bounded
  when the density suits the gradients (1% top-k: about 2.5 here); when it
  grows without bound the sparse updates fall behind the gradients, and
  accuracy with them. Measured with one extra forward and backward pass of
  the step's own batch per decision (the Trainer) or from the call's gradient
  (``research.averaging``).

The first step after a switch is not measured (compilation, the drain, the
folded residual).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Window:
    """One rank's figures for the steps since the last decision."""

    step_s: list[float] = field(default_factory=list)
    arrive_s: list[float] = field(default_factory=list)
    comm_s: list[float] = field(default_factory=list)
    lag: float | None = None

    def add(self, step_s: float, arrive_s: float, comm_s: float) -> None:
        self.step_s.append(step_s)
        self.arrive_s.append(arrive_s)
        self.comm_s.append(comm_s)


@dataclass
class Estimate:
    """What one window of a method measured (see the module docstring)."""

    cost: float = math.nan
    se: float = math.nan
    comm: float = math.nan
    comm_se: float = math.nan
    imbalance: float = math.nan
    lag: float = math.nan
    at: int = -1  # the step it was measured at; -1: never

    FIELDS = ("cost", "se", "comm", "comm_se", "imbalance", "lag", "at")

    @property
    def known(self) -> bool:
        return self.at >= 0 and math.isfinite(self.cost)

    def ms(self) -> str:
        return f"{self.cost * 1e3:.1f} +- {self.se * 1e3:.1f} ms"


def _mean_se(xs: list[float]) -> tuple[float, float]:
    a = np.asarray(xs, np.float64)
    if a.size == 0:
        return math.nan, math.nan
    se = float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else float(a[0])
    return float(a.mean()), se


def estimate(windows: list[Window], step: int) -> Estimate:
    """The agreed estimate from every rank's window (rank order)."""
    per = [(_mean_se(w.step_s), _mean_se(w.comm_s)) for w in windows]
    if not per or not windows[0].step_s:
        return Estimate(at=-1)
    slowest = max(range(len(per)), key=lambda r: per[r][0][0])
    (cost, se), _ = per[slowest]
    comm_r = max(range(len(per)), key=lambda r: per[r][1][0])
    comm, comm_se = per[comm_r][1]
    arrive = np.asarray([w.arrive_s for w in windows], np.float64)
    imbalance = float((arrive.max(axis=0) - arrive.mean(axis=0)).mean())
    lags = [w.lag for w in windows if w.lag is not None]
    lag = max(lags) if lags else math.nan
    return Estimate(cost, se, comm, comm_se, imbalance, lag, step)
