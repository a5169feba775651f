"""Reading Chrome trace events as ``research.trace`` writes them, with checks.

A malformed trace raises :class:`TraceError` naming the offending event, so that
the command line can report one line instead of a traceback.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, NamedTuple


class TraceError(ValueError):
    """A trace that is missing, not JSON, or not Chrome trace events."""


class RawSpan(NamedTuple):
    """One complete ("X") event, times in seconds."""

    rank: int
    track: str
    name: str
    start: float
    end: float
    args: dict


def load_events(source: Any) -> list[dict]:
    """Events from a run folder, a trace file, a ``{"traceEvents": ...}`` or a list."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            path = path / "trace.json"
        try:
            source = json.loads(path.read_text())
        except FileNotFoundError:
            msg = f"no trace at {path} (was the run started with --trace?)"
            raise TraceError(msg) from None
        except (OSError, UnicodeDecodeError) as e:
            raise TraceError(f"cannot read {path}: {e}") from None
        except json.JSONDecodeError as e:
            raise TraceError(f"{path} is not valid JSON ({e})") from None
    if isinstance(source, dict):
        source = source.get("traceEvents")
    if not isinstance(source, list):
        raise TraceError("expected a list of trace events or {'traceEvents': [...]}")
    return source


def _number(event: dict, key: str, i: int) -> float:
    v = event.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise TraceError(f"event {i} ({event.get('name')!r}): bad {key!r}: {v!r}")
    return float(v)


def complete_events(events: list[dict]) -> tuple[list[RawSpan], dict[int, int]]:
    """The complete events, and per rank the count of events the tracer dropped.

    A span's track is its ``cat`` (``research.trace`` writes the track there), else
    the ``thread_name`` metadata of its ``(pid, tid)``, else ``"tid N"``.
    """
    names: dict[tuple[Any, Any], str] = {}
    dropped: dict[int, int] = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M":
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            if e.get("name") == "thread_name":
                names[(e.get("pid"), e.get("tid"))] = str(args.get("name"))
            elif e.get("name") == "dropped_events" and isinstance(e.get("pid"), int):
                count = args.get("count")
                dropped[e["pid"]] = count if isinstance(count, int) else 0
    spans = []
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise TraceError(f"event {i} is not an object: {e!r:.80}")
        if e.get("ph") != "X":
            continue
        pid = e.get("pid")
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise TraceError(f"event {i} ({e.get('name')!r}): bad 'pid': {pid!r}")
        ts, dur = _number(e, "ts", i), _number(e, "dur", i)
        if dur < 0:
            raise TraceError(f"event {i} ({e.get('name')!r}): negative 'dur'")
        track = e.get("cat") or names.get((pid, e.get("tid")), f"tid {e.get('tid')}")
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        spans.append(
            RawSpan(
                pid,
                str(track),
                str(e.get("name", "")),
                ts / 1e6,
                (ts + dur) / 1e6,
                args,
            )
        )
    return spans, dropped
