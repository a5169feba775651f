"""Interval arithmetic on half-open time intervals ``(start, end)`` in seconds.

Every function takes and returns lists of ``(start, end)`` pairs; ``union`` turns any
list (unsorted, nested, overlapping) into the canonical form the others expect:
sorted, disjoint, non-empty intervals. Nested or overlapping spans are therefore
counted once, never twice.
"""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering exactly the points of ``intervals``."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def total(intervals: Iterable[Interval]) -> float:
    """Summed length; pass a canonical list (:func:`union`) to count each point once."""
    return sum(end - start for start, end in intervals)


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Points in both of two canonical lists (a two-pointer sweep, linear time)."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start = max(a[i][0], b[j][0])
        end = min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        # Advance whichever interval ends first: it cannot meet anything later.
        if a[i][1] <= b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Points of canonical ``a`` not in canonical ``b``."""
    out: list[Interval] = []
    j = 0
    for start, end in a:
        # Skip the parts of b that end before this interval starts.
        while j < len(b) and b[j][1] <= start:
            j += 1
        k, cur = j, start
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < end:
            out.append((cur, end))
    return out
