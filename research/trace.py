"""The timeline: per-rank Chrome trace events; a process per rank, a track per phase.

Usage::

    tracer = Tracer.start(run_dir, rank=world.rank, size=world.size, comm=world.comm)
    set_tracer(tracer)                 # library code finds it with get_tracer()
    with get_tracer().span("forward+backward", track="compute", step=3):
        ...
    tracer.close()                     # rank 0 merges every rank into trace.json

Design choices (see also README "Timeline"):

* Off by default it costs one attribute look-up: :class:`NullTracer.span` returns a
  shared no-op context manager.
* Each rank appends its events to ``trace/rank{r}.json``, a JSON array that is
  rewritten in place so it always ends in ``]``: the file is valid JSON after every
  flush, and a run killed midway leaves valid per-rank files. Rank 0 merges them
  into ``trace.json`` at every flush (atomically, via rename) and at the end, so
  ``trace.json`` is valid JSON whenever it exists.
* Flushed by count (``flush_every`` events, on the recording thread) and by time:
  a daemon thread flushes pending events every ``flush_every_s`` seconds
  (default 2), so a run killed with SIGKILL (the OOM killer, a node failure, a
  batch system's last word) keeps all but its last seconds. The training thread
  only appends to a list; the writing happens on that thread.
* Size is bounded: at most ``max_events`` events per rank (default 200,000, about
  25 MB merged for 4 ranks); later events are counted, not stored, and the count is
  recorded as a ``dropped_events`` metadata event.
* Timestamps are microseconds since a barrier at start, so ranks line up.
* Honesty under asynchronous dispatch: a span only measures host time, so code
  that closes a span around jitted work blocks on its result first (the training
  loop does, every step, whether tracing is on or not).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

# Fixed track (thread) ids so tracks appear in the same order on every rank.
TRACKS = {
    "data": 1,
    "compute": 2,
    "delay": 3,
    "comm": 4,
    "comm-bg": 5,
    "update": 6,
    "eval": 7,
    "checkpoint": 8,
    "checkpoint-bg": 9,
    "log": 10,
    "profile": 11,  # steps captured by jax.profiler (research.train.profiling)
    "restart": 12,  # a run relaunched after a failure (research.entry.restart)
    "strategy": 13,  # which method an adaptive strategy ran, and its switches
}


class _NullSpan:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def set(self, **args: Any) -> None:
        pass


_NULL_SPAN = _NullSpan()


class NullTracer:
    """The tracer used when tracing is off: every call is a no-op."""

    enabled = False

    def span(self, name: str, track: str = "compute", **args: Any) -> _NullSpan:
        return _NULL_SPAN

    def complete(
        self, name: str, track: str, start_s: float, end_s: float, **args: Any
    ) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self, collective: bool = True) -> None:
        pass


class _Span:
    __slots__ = ("_tracer", "_name", "_track", "_args", "_t0")

    def __init__(self, tracer: Tracer, name: str, track: str, args: dict) -> None:
        self._tracer, self._name, self._track, self._args = tracer, name, track, args

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def set(self, **args: Any) -> None:
        """Attach arguments known only at the end of the span (bytes, counts)."""
        self._args.update(args)

    def __exit__(self, *exc):
        self._tracer.complete(
            self._name, self._track, self._t0, time.perf_counter(), **self._args
        )
        return False


class Tracer:
    """Collects this rank's events and writes them off the hot path."""

    enabled = True

    def __init__(
        self,
        run_dir: str | os.PathLike,
        rank: int,
        size: int,
        comm: Any = None,
        max_events: int = 200_000,
        flush_every: int = 5_000,
        merge_every_s: float = 30.0,
        flush_every_s: float | None = 2.0,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.rank, self.size, self.comm = rank, size, comm
        self.max_events = max_events
        self.flush_every = flush_every
        self.merge_every_s = merge_every_s
        self._last_merge = time.perf_counter()
        self._events: list[dict] = []
        self._stored = 0
        self._dropped = 0
        self._dropped_written = 0
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # one writer of the file at a time
        self._closed = False
        self._stop_timer = threading.Event()
        (self.run_dir / "trace").mkdir(parents=True, exist_ok=True)
        self._path = self.run_dir / "trace" / f"rank{rank}.json"
        if comm is not None:
            comm.Barrier()
        self._t0 = time.perf_counter()
        self._wall0 = time.time()
        meta = [
            {
                "ph": "M",
                "pid": rank,
                "tid": 0,
                "name": "process_name",
                "args": {"name": f"rank {rank}"},
            },
            {
                "ph": "M",
                "pid": rank,
                "tid": 0,
                "name": "process_sort_index",
                "args": {"sort_index": rank},
            },
        ]
        for track, tid in TRACKS.items():
            meta.append(
                {
                    "ph": "M",
                    "pid": rank,
                    "tid": tid,
                    "name": "thread_name",
                    "args": {"name": track},
                }
            )
            meta.append(
                {
                    "ph": "M",
                    "pid": rank,
                    "tid": tid,
                    "name": "thread_sort_index",
                    "args": {"sort_index": tid},
                }
            )
        with open(self._path, "w") as f:
            f.write("[\n" + ",\n".join(json.dumps(e) for e in meta) + "\n]")
        self._timer = None
        if flush_every_s:
            self._timer = threading.Thread(
                target=self._flush_by_time,
                args=(flush_every_s,),
                name=f"trace-flush-r{rank}",
                daemon=True,  # never keeps a finished or failing process alive
            )
            self._timer.start()

    def _flush_by_time(self, every_s: float) -> None:
        while not self._stop_timer.wait(every_s):
            self.flush()

    @classmethod
    def start(
        cls,
        run_dir: str | os.PathLike,
        *,
        rank: int,
        size: int,
        comm: Any = None,
        enabled: bool = True,
        **kw: Any,
    ) -> Tracer | NullTracer:
        """A live tracer when ``enabled``, else the no-op :class:`NullTracer`."""
        if not enabled:
            return NullTracer()
        return cls(run_dir, rank, size, comm, **kw)

    # -- recording ---------------------------------------------------------------
    def _us(self, t: float) -> float:
        return round((t - self._t0) * 1e6, 1)

    def _add(self, event: dict) -> None:
        with self._lock:
            if self._stored >= self.max_events:
                self._dropped += 1
                return
            self._stored += 1
            self._events.append(event)
            pending = len(self._events)
        if (
            pending >= self.flush_every
            and threading.current_thread() is threading.main_thread()
        ):
            self.flush()

    def span(self, name: str, track: str = "compute", **args: Any) -> _Span:
        """Context manager recording one complete ("X") event on ``track``."""
        return _Span(self, name, track, args)

    def complete(
        self, name: str, track: str, start_s: float, end_s: float, **args: Any
    ) -> None:
        """Record a phase measured elsewhere (``time.perf_counter`` seconds)."""
        self._add(
            {
                "ph": "X",
                "pid": self.rank,
                "tid": TRACKS.get(track, 99),
                "name": name,
                "cat": track,
                "ts": self._us(start_s),
                "dur": round((end_s - start_s) * 1e6, 1),
                "args": args,
            }
        )

    # -- writing -----------------------------------------------------------------
    def flush(self) -> None:
        """Append pending events to this rank's file, keeping it valid JSON.

        Thread-safe: the recording thread (by count), the timer thread (by
        time) and ``close`` may call it.
        """
        with self._write_lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        with self._lock:
            events, self._events = self._events, []
            dropped = self._dropped
        # The count is cumulative (the last one written holds): written again
        # only when it grew, not at every timed flush.
        dropped, self._dropped_written = (
            (dropped, dropped) if dropped != self._dropped_written else (0, dropped)
        )
        if not events and not dropped:
            return
        if dropped:
            events.append(
                {
                    "ph": "M",
                    "pid": self.rank,
                    "tid": 0,
                    "name": "dropped_events",
                    "args": {"count": dropped, "cap": self.max_events},
                }
            )
        payload = (
            ",\n"
            + ",\n".join(json.dumps(e, separators=(",", ":")) for e in events)
            + "\n]"
        )
        with open(self._path, "r+b") as f:
            f.seek(-2, os.SEEK_END)  # overwrite the closing "\n]"
            f.write(payload.encode())
        now = time.perf_counter()
        if self.rank == 0 and now - self._last_merge > self.merge_every_s:
            # Keep trace.json current, so a run that dies still leaves a timeline.
            self._last_merge = now
            merge_traces(self.run_dir, self.size)

    def close(self, collective: bool = True) -> None:
        """Flush; rank 0 then merges all ranks into ``trace.json``.

        Collective unless ``collective=False``, which an error path must pass:
        another rank may be inside a collective this one will never join. Then
        only this rank's file is flushed (it stays valid JSON).
        """
        if self._closed:
            return
        self._closed = True
        self._stop_timer.set()
        if self._timer is not None and self._timer is not threading.current_thread():
            self._timer.join()
        self.flush()
        if not collective:
            return
        if self.comm is not None:
            self.comm.Barrier()
        if self.rank == 0:
            merge_traces(self.run_dir, self.size)


def read_rank_trace(path: Path) -> list[dict]:
    """Events of one rank file; tolerates a file cut off mid-write."""
    text = path.read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        # A rank killed during a write: keep the complete lines before the cut.
        events = []
        for line in text.splitlines()[1:]:
            line = line.rstrip(",").strip()
            if not line or line == "]":
                continue
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                break
        return events


def read_trace_events(run_dir: str | os.PathLike) -> list[dict]:
    """The events of a run's merged ``trace.json`` ([] when the run has none)."""
    path = Path(run_dir) / "trace.json"
    if not path.exists():
        return []
    return json.loads(path.read_text())["traceEvents"]


def merge_traces(run_dir: str | os.PathLike, size: int | None = None) -> Path:
    """Merge ``trace/rank*.json`` into ``trace.json`` (atomic rename)."""
    run_dir = Path(run_dir)
    files = sorted(
        (run_dir / "trace").glob("rank*.json"), key=lambda p: int(p.stem[4:])
    )
    events: list[dict] = []
    for path in files:
        events.extend(read_rank_trace(path))
    out = run_dir / "trace.json"
    tmp = run_dir / "trace.json.tmp"
    # dumps, not dump: json.dump streams through the pure-Python encoder.
    text = json.dumps(
        {"traceEvents": events, "displayTimeUnit": "ms"}, separators=(",", ":")
    )
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, out)
    return out


_current: Tracer | NullTracer = NullTracer()


def get_tracer() -> Tracer | NullTracer:
    """The tracer of this process (a :class:`NullTracer` unless one was set)."""
    return _current


def set_tracer(tracer: Tracer | NullTracer) -> None:
    global _current
    _current = tracer


@contextlib.contextmanager
def tracing(tracer: Tracer | NullTracer):
    """Install ``tracer`` for the duration of a block, then close it."""
    prev = get_tracer()
    set_tracer(tracer)
    try:
        yield tracer
    except BaseException:
        tracer.close(collective=False)  # the others may be in a collective
        raise
    else:
        tracer.close()
    finally:
        set_tracer(prev)
