"""The trace analyzer: compute/communication overlap, stragglers, update gaps.

Definitions of every track category and metric: :mod:`research.trace_analysis.metrics`.
Command line: ``python -m scripts.analyze_trace RUN_DIR``.
"""

from research.trace_analysis.events import TraceError, load_events
from research.trace_analysis.metrics import TRACKS, Track, analyze, classify
from research.trace_analysis.report import format_table

__all__ = [
    "TRACKS",
    "TraceError",
    "Track",
    "analyze",
    "classify",
    "format_table",
    "load_events",
]
