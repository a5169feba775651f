"""A change-point rule for one series of per-step figures: a new level, up or down.

The ``adaptive`` strategy watches a few series step by step (the slowest
rank's lateness, the running method's communication time) and must see a
straggler or a new link rate come *and go*. :class:`ChangePoint` does both
with one test, so a window is entered and left on the same evidence:

* the *reference* is the mean (and spread) of the samples since the last
  change, except the newest ``window``;
* the newest ``window`` samples are the *probe*; their median is compared with
  the reference: a change is declared when it lies off the reference mean by
  more than the band ``max(rel x |mean|, z x se, floor)`` (``se`` the
  standard error of a median of ``window`` samples, ``1.25 sd /
  sqrt(window)``), and every probe sample but one lies on the same side
  beyond half the band (a lone outlier, such as one step that paid for a
  page fault, moves neither);
* on a change the probe's samples at the new level become the reference;
  otherwise the oldest probe sample joins the reference, clipped to twice the
  band around it (an outlier the probe let pass must not drag the reference
  off, or the next ordinary samples would look like a change), whose weight
  is capped at ``memory`` samples, so a slow drift is followed.

With ``window=3`` a step change is declared at its second sample. Nothing
here knows what the numbers mean; pure Python floats, so every rank that adds
the same samples declares the same changes.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass
class ChangePoint:
    """Two-sided detector of a shift in a series' level (module docstring).

    Args:
      window: samples in the probe (at least 2).
      rel: the band's part relative to the reference level.
      z: the band's part in standard errors of the probe's median (used once
        the reference holds at least ``window + 2`` samples).
      memory: most samples the reference weighs (older ones fade).
    """

    window: int = 3
    rel: float = 0.2
    z: float = 3.0
    memory: int = 50
    n: float = 0.0
    mean: float = math.nan
    m2: float = 0.0
    changes: int = 0
    probe: deque = field(default_factory=deque)

    def __post_init__(self) -> None:
        if self.window < 2:
            raise ValueError(f"ChangePoint: window={self.window} must be >= 2")

    @property
    def level(self) -> float:
        """The current level: the reference mean, or the probe's median before
        the reference has a sample."""
        if self.n > 0:
            return self.mean
        return _median(list(self.probe)) if self.probe else math.nan

    @property
    def sd(self) -> float:
        return math.sqrt(self.m2 / (self.n - 1)) if self.n > 1 else math.nan

    def band(self, floor: float = 0.0) -> float:
        """How far from the reference a level must move to count."""
        b = max(self.rel * abs(self.mean), floor)
        if self.n >= self.window + 2 and math.isfinite(self.sd):
            b = max(b, self.z * 1.25 * self.sd / math.sqrt(self.window))
        return b

    def add(self, x: float, floor: float = 0.0) -> bool:
        """Add a sample; True when it completes a change (the samples at the
        new level are then the reference). ``floor``: the least band, in the
        series' units."""
        x = float(x)
        if not math.isfinite(x):
            return False
        self.probe.append(x)
        if len(self.probe) < self.window:
            return False
        moved = self._shifted(floor) if self.n >= 2 else []
        if moved:
            self.reset(moved)
            self.changes += 1
            return True
        if len(self.probe) > self.window - 1:
            x = self.probe.popleft()
            if self.n >= 1:
                b = 2 * self.band(floor)
                x = min(max(x, self.mean - b), self.mean + b)
            self._absorb(x)
        return False

    def drift(self, floor: float = 0.0) -> float:
        """+1 or -1 when the newest sample lies beyond the band above or below
        the reference (a change may be starting), else 0."""
        if self.n < 2 or not self.probe:
            return 0.0
        d = self.probe[-1] - self.mean
        return math.copysign(1.0, d) if abs(d) > self.band(floor) else 0.0

    def _shifted(self, floor: float) -> list[float]:
        """The probe samples at the new level, or [] (no change)."""
        band = self.band(floor)
        med = _median(list(self.probe))
        if abs(med - self.mean) <= band:
            return []
        side = 1.0 if med > self.mean else -1.0
        beyond = [v for v in self.probe if side * (v - self.mean) > band / 2]
        return beyond if len(beyond) >= len(self.probe) - 1 else []

    def _absorb(self, x: float) -> None:
        if self.n >= self.memory:  # fade: the oldest weigh less
            self.n = self.memory - 1
            self.m2 *= (self.memory - 2) / (self.memory - 1)
        self.n += 1
        if self.n == 1:
            self.mean, self.m2 = x, 0.0
            return
        d = x - self.mean
        self.mean += d / self.n
        self.m2 += d * (x - self.mean)

    def take(self, x: float) -> None:
        """Add a sample to the reference itself (one known to be at the level)."""
        self._absorb(float(x))

    def reset(self, samples: list[float] = ()) -> None:
        """Forget the reference; ``samples`` become it (the probe empties)."""
        self.n, self.mean, self.m2 = 0.0, math.nan, 0.0
        self.probe.clear()
        for v in samples:
            self._absorb(v)

    def state(self) -> list[float]:
        """``[n, mean, m2, changes, probe...]`` padded to ``window`` with NaN."""
        probe = list(self.probe) + [math.nan] * (self.window - len(self.probe))
        return [self.n, self.mean, self.m2, float(self.changes), *probe]

    def load(self, values: list[float]) -> None:
        """Take what :meth:`state` gave."""
        self.n, self.mean, self.m2 = values[0], values[1], values[2]
        self.changes = int(values[3])
        self.probe = deque(v for v in values[4 : 4 + self.window] if math.isfinite(v))


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
