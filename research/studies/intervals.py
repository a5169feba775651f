"""Figures with their uncertainty, and checks decided on intervals.

Every figure a results page states rests on samples: the measured steps of a
run, the seeds of an arm, the repetitions of a call, the rounds of an
interleaved run. :class:`Estimate` carries the figure, a 90% interval around
it, how many samples it rests on and what they are; :func:`verdict` decides
a check on that interval, never on the point alone:

* PASS: the whole interval is on the asked side of the limit;
* FAIL: the whole interval is on the other side;
* UNDECIDED: the interval holds the limit, or there is none (one sample:
  the noise is unknown).

The intervals, all at :data:`LEVEL` and all deterministic (a page rendered
twice from the same data says the same):

* :func:`mean`: Student's t over the samples (seeds: runs that differ only in
  their seed are independent draws);
* :func:`median`, :func:`ratio`, :func:`shift`: a percentile bootstrap (:data:`DRAWS`
  resamples from a fixed seed) of the median (steps: a few slow steps must
  not move the figure) or of the ratio of two arms' statistics, each arm
  resampled on its own, or both with the same indices where the samples are
  paired (the same seed, the same step), or of the difference of two medians;
* :func:`difference`: Welch's t for two arms' means (paired: t of the
  per-sample differences).

A bootstrap over the steps of one run treats its steps as independent; steps
next to each other are not quite, so the interval is the run's own noise, not
what a second run would show (run-to-run spread needs seeds or reruns).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

import numpy as np

LEVEL = 0.90
DRAWS = 2000
#: Student's t, the upper 95% point (a two-sided 90% interval), by degrees of
#: freedom; beyond the table, the next lower entry (a slightly wider interval).
_T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895,
        8: 1.860, 9: 1.833, 10: 1.812, 12: 1.782, 15: 1.753, 20: 1.725,
        25: 1.708, 30: 1.697, 40: 1.684, 60: 1.671, 120: 1.658}  # fmt: skip
PASS, FAIL, UNDECIDED = "PASS", "FAIL", "UNDECIDED"


def t95(df: float) -> float:
    """The upper 95% point of Student's t with ``df`` degrees of freedom
    (rounded down to the table's entries: never narrower than the exact)."""
    if df < 1:
        return math.inf
    keys = [k for k in _T95 if k <= df]
    return _T95[max(keys)] if df < 1000 else 1.645


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A figure, its 90% interval (None: one sample) and what it rests on.

    ``n`` counts the samples (for a ratio or difference: the smaller arm's),
    ``of`` names them ("steps", "seeds", "reps", "rounds").
    """

    value: float
    lo: float | None
    hi: float | None
    n: int
    of: str

    @property
    def known(self) -> bool:
        """Whether there is an interval (two samples or more)."""
        return self.lo is not None and self.hi is not None

    def show(self, spec: str = ".2f", unit: str = "", scale: float = 1.0) -> str:
        """``"1.31x [1.22, 1.40] (3 seeds)"``: the figure, its interval, its base."""
        v = format(self.value * scale, spec) + unit
        if not self.known:
            return f"{v} ({self.n} {self.of}: no interval)"
        lo, hi = format(self.lo * scale, spec), format(self.hi * scale, spec)
        return f"{v} [{lo}, {hi}] ({self.n} {self.of})"

    def brief(self, spec: str = ".2f", unit: str = "", scale: float = 1.0) -> str:
        """``"1.31x [1.22, 1.40]"``: the figure and its interval, no base."""
        return self.show(spec, unit, scale).split(" (")[0]

    def point(self, spec: str = ".2f", unit: str = "", scale: float = 1.0) -> str:
        """``"1.31x"``: the figure alone (where its interval is said elsewhere)."""
        return format(self.value * scale, spec) + unit

    def to_json(self) -> dict:
        """The estimate as a JSON object (``results.json`` keeps them so)."""
        return dataclasses.asdict(self)


def _clean(xs: Sequence[float | None]) -> list[float]:
    return [float(x) for x in xs if x is not None and math.isfinite(float(x))]


def _bootstrap(
    arrays: list[np.ndarray], stat, paired: bool
) -> tuple[float, float] | None:
    """The 90% percentile interval of ``stat(*resampled arrays)``."""
    if any(a.size < 2 for a in arrays):
        return None
    rng = np.random.default_rng(0)
    if paired:
        idx = rng.integers(0, arrays[0].size, size=(DRAWS, arrays[0].size))
        draws = stat(*(a[idx] for a in arrays))
    else:
        draws = stat(
            *(a[rng.integers(0, a.size, size=(DRAWS, a.size))] for a in arrays)
        )
    tail = 100 * (1 - LEVEL) / 2
    lo, hi = np.percentile(draws, [tail, 100 - tail])
    return float(lo), float(hi)


def mean(xs: Sequence[float | None], of: str = "seeds") -> Estimate:
    """The mean of ``xs`` and its t interval (None and non-finite left out)."""
    vals = _clean(xs)
    if not vals:
        return Estimate(math.nan, None, None, 0, of)
    m = statistics.fmean(vals)
    if len(vals) < 2:
        return Estimate(m, None, None, len(vals), of)
    half = t95(len(vals) - 1) * statistics.stdev(vals) / math.sqrt(len(vals))
    return Estimate(m, m - half, m + half, len(vals), of)


def median(xs: Sequence[float | None], of: str = "steps") -> Estimate:
    """The median of ``xs`` and its bootstrap interval."""
    vals = np.asarray(_clean(xs))
    if vals.size == 0:
        return Estimate(math.nan, None, None, 0, of)
    iv = _bootstrap([vals], lambda a: np.median(a, axis=-1), paired=False)
    m = float(np.median(vals))
    return Estimate(m, *(iv or (None, None)), int(vals.size), of)


def ratio(
    num: Sequence[float | None],
    den: Sequence[float | None],
    of: str = "steps",
    *,
    stat: str = "median",
    paired: bool = False,
) -> Estimate:
    """``stat(num) / stat(den)`` (``"median"`` or ``"mean"``) and its bootstrap
    interval; ``paired``: sample i of both belongs together (same seed or
    step; samples missing on either side are left out of both)."""
    if paired:
        pairs = [
            (a, b) for a, b in zip(num, den, strict=True) if _clean([a]) and _clean([b])
        ]
        a = np.asarray([float(p[0]) for p in pairs])
        b = np.asarray([float(p[1]) for p in pairs])
    else:
        a, b = np.asarray(_clean(num)), np.asarray(_clean(den))
    n = int(min(a.size, b.size))
    if n == 0:
        return Estimate(math.nan, None, None, 0, of)
    fn = np.median if stat == "median" else np.mean
    value = float(fn(a) / fn(b))
    iv = _bootstrap([a, b], lambda x, y: fn(x, axis=-1) / fn(y, axis=-1), paired=paired)
    return Estimate(value, *(iv or (None, None)), n, of)


def shift(
    a: Sequence[float | None], b: Sequence[float | None], of: str = "steps"
) -> Estimate:
    """``median(a) - median(b)`` and its bootstrap interval (each resampled on
    its own): how much one run's steps moved against another's."""
    xa, xb = np.asarray(_clean(a)), np.asarray(_clean(b))
    n = int(min(xa.size, xb.size))
    if n == 0:
        return Estimate(math.nan, None, None, 0, of)
    value = float(np.median(xa) - np.median(xb))
    iv = _bootstrap(
        [xa, xb], lambda x, y: np.median(x, axis=-1) - np.median(y, axis=-1), False
    )
    return Estimate(value, *(iv or (None, None)), n, of)


def difference(
    a: Sequence[float | None],
    b: Sequence[float | None],
    of: str = "seeds",
    *,
    paired: bool = False,
) -> Estimate:
    """``mean(a) - mean(b)`` and its t interval (Welch's, or of the per-sample
    differences where ``paired``)."""
    if paired:
        d = [x - y for x, y in zip(a, b, strict=True) if _clean([x]) and _clean([y])]
        return mean(d, of)
    xa, xb = _clean(a), _clean(b)
    n = min(len(xa), len(xb))
    if n == 0:
        return Estimate(math.nan, None, None, 0, of)
    value = statistics.fmean(xa) - statistics.fmean(xb)
    if n < 2:
        return Estimate(value, None, None, n, of)
    va, vb = statistics.variance(xa) / len(xa), statistics.variance(xb) / len(xb)
    se = math.sqrt(va + vb)
    if se == 0:
        return Estimate(value, value, value, n, of)
    # Welch-Satterthwaite degrees of freedom.
    df = (va + vb) ** 2 / (va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1))
    half = t95(df) * se
    return Estimate(value, value - half, value + half, n, of)


def verdict(est: Estimate, limit: float, *, above: bool) -> str:
    """PASS, FAIL or UNDECIDED for the claim ``est >= limit`` (``above``) or
    ``est <= limit``, on the interval (module docstring)."""
    if not est.known or not math.isfinite(est.value):
        return UNDECIDED
    if above:
        return PASS if est.lo >= limit else FAIL if est.hi < limit else UNDECIDED
    return PASS if est.hi <= limit else FAIL if est.lo > limit else UNDECIDED


def exact(ok: bool) -> str:
    """The verdict of a check on an exact count (bytes, probes): no noise."""
    return PASS if ok else FAIL


def check_line(word: str, text: str) -> str:
    """A check as a page shows it: ``"PASS  text"``."""
    return f"{word}  {text}"
