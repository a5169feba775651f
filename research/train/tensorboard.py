"""TensorBoard scalars of every run, written by rank 0 off the training thread.

``tensorboard --logdir runs/`` then compares runs, and the arms of a paper
experiment side by side: each run folder is one TensorBoard run (an eager-SGD
job's arms are ``runs/eager_sgd-<time>/allreduce-s0``, ``.../solo-s0``, ...).
On by default (``--no-tensorboard`` turns it off); the writer is tensorboardX's
event file format (no TensorFlow), one ``events.out.tfevents.*`` file per run
(a resumed run adds one).

Tags, from the same rows as ``metrics.jsonl`` (same step numbers, same values,
stored as float32):

==========================  ====================================================
tag                         from
==========================  ====================================================
``train/<key>``             a step row's ``loss``, ``acc``, ``lr``,
                            ``samples_per_s`` (global samples per second of
                            training time since the previous row), ``step_time``
``step/<key>``              its timings: the schema's ``compute_s``,
                            ``comm_exposed_s``, ``comm_busy_s``, ``update_s``
                            (``research.strategies.base.PHASES``), ``data_wait_s``,
                            ``delay_s``, a strategy's own (``select_s``) and
                            any other number a strategy adds
``comm/<key>``              its communication record ``comm_<key>``: ``bytes``,
                            ``contributors``, ``staleness``, ``wait_s``,
                            ``round``, a strategy's own (solo and majority:
                            ``mean_age``, ``carried``; sparse: ``density``)
``eval/<key>``              evaluation rows: ``test_acc``, ``test_loss``,
                            ``eval_s``, ``epoch``
``checkpoint/<key>``        each save's ``blocking_s`` and ``wait_s``
                            (:meth:`Trainer.log_scalars`, at the saved step)
``per_rank/<tag>/rank<r>``  every rank's value of a ``train/step_time``,
                            ``step/``, ``comm/`` or ``checkpoint/`` tag wherever
                            the ranks' values differ
==========================  ====================================================

Per-rank figures travel to rank 0 in one ``gather`` at each evaluation and at
the end of a run (points where the ranks meet anyway), never on an error path:
a run that fails keeps rank 0's tags whole and the per-rank tags up to its last
evaluation. A Custom Scalars layout overlays each per-rank tag's ranks in one
chart. Tags that never differ (``comm/bytes`` of an allreduce) get no per-rank
copy; one that differs once keeps getting one.

Off the critical path: the training thread puts a row (a dict it built anyway)
on a queue; a daemon thread turns rows into events and writes them, flushing
every 2 s (a killed run loses at most its last 2 s). tensorboardX's own
``SummaryWriter`` was 180 us per scalar on the calling thread (a bounded
multiprocessing queue); one event per row here costs 5 us per scalar.
Measured cost on a 2-core machine (docs/journal.md): per logged
row 23.5 us on each rank's training thread and 113 us of rank 0's writer-thread
CPU (25 tags). ``scripts/bench_tensorboard.py`` (4 ranks, ``cnn_small``,
``solo``, 300 steps, 6 rounds): the scalars' own time was 0.18% of training
time at the default ``--log-every 10`` (1.3% logging every step); on / off of
the median step 0.94 [0.87, 1.06] and 1.05 [0.99, 1.23]: no cost measurable
above the machine's noise, hence on by default.
"""

from __future__ import annotations

import math
import os
import queue
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

#: Step-row keys with a tag of their own in ``train/``; ``comm_*`` keys go to
#: ``comm/``, every other number (the timings) to ``step/``.
TRAIN_KEYS = ("loss", "acc", "lr", "samples_per_s", "step_time")
#: Row keys that say where a row is, not what happened (no tag).
SKIP_KEYS = ("step", "wall", "train_time", "kind")
#: ``train/`` tags that are the run's (rank 0's) figure only.
RUN_ONLY = ("train/loss", "train/acc", "train/lr", "train/samples_per_s")
FLUSH_EVERY_S = 2.0
INSTALL = "pip install tensorboardX"


def step_tags(row: dict[str, Any]) -> dict[str, float]:
    """The tags of one ``metrics.jsonl`` step row (see the module docstring)."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if key in SKIP_KEYS or not _number(value):
            continue
        if key in TRAIN_KEYS:
            out[f"train/{key}"] = float(value)
        elif key.startswith("comm_") and key not in ("comm_exposed_s", "comm_busy_s"):
            out[f"comm/{key[5:]}"] = float(value)
        else:
            out[f"step/{key}"] = float(value)
    return out


def eval_tags(row: dict[str, Any]) -> dict[str, float]:
    """The tags of one evaluation row (``kind: eval`` in ``metrics.jsonl``)."""
    return {
        f"eval/{k}": float(v)
        for k, v in row.items()
        if k not in SKIP_KEYS and _number(v)
    }


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, str)


def _per_rank(tags: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in tags.items() if k not in RUN_ONLY}


class EventWriter:
    """One event file, written by a daemon thread from a queue (rank 0).

    ``put(step, values, walltime)`` returns at once; a failure to write is
    reported in one line and ends the writing, never the run.
    """

    def __init__(self, run_dir: str | os.PathLike) -> None:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto import event_pb2, summary_pb2

        self._Event, self._Summary = event_pb2.Event, summary_pb2.Summary
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        # events.out.tfevents.<time>.<host>.<pid>: the pid keeps a run resumed
        # within the same second from truncating the first file ("wb").
        self._file = EventsWriter(
            os.path.join(os.fspath(run_dir), "events"), f".{os.getpid()}"
        )
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.failed: str | None = None
        self.cpu_s = 0.0  # the writer thread's CPU time, once closed
        self._thread = threading.Thread(
            target=self._work, name="tensorboard-writer", daemon=True
        )
        self._thread.start()

    def put(self, step: int, values: dict[str, float], walltime: float) -> None:
        if values:
            self._queue.put(("scalars", step, values, walltime))

    def call(self, fn: Any, *args: Any) -> None:
        """Run ``fn(self, *args)`` on the writer thread (rank 0's bookkeeping).
        ``fn`` writes with :meth:`write_now` and :meth:`write_layout_now`."""
        self._queue.put(("call", fn, args, None))

    def write_now(self, step: int, values: dict[str, float], walltime: float) -> None:
        """Write at once, on the writer thread (from a :meth:`call`). Not
        :meth:`put`: that queues behind a ``close`` already queued (the end of a
        run gathers, then closes), and what it queued was lost."""
        if values:
            self._write(("scalars", step, values, walltime))

    def write_layout_now(self, step: int, layout: dict[str, Any]) -> None:
        """A Custom Scalars layout (``tensorboardX.summary.custom_scalars``),
        written at once on the writer thread (see :meth:`write_now`)."""
        self._write(("layout", step, layout, time.time()))

    def _work(self) -> None:
        try:
            self._loop()
        finally:
            self.cpu_s = time.thread_time()

    def _loop(self) -> None:
        next_flush = None
        while True:
            timeout = None if next_flush is None else max(0.0, next_flush - time.time())
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                item = None
            try:
                if item is None or item[0] == "close":
                    self._file.flush()
                    next_flush = None
                    if item is not None:
                        self._file.close()
                        return
                    continue
                self._write(item)
                if next_flush is None:
                    next_flush = time.time() + FLUSH_EVERY_S
            except Exception as e:  # noqa: BLE001 - a full disk ends the scalars only
                self.failed = f"{type(e).__name__}: {e}"
                print(
                    f"r0 | TensorBoard scalars stopped ({self.failed}); "
                    "metrics.jsonl goes on",
                    file=sys.stderr,
                    flush=True,
                )
                self._drain_after_failure()
                return

    def _write(self, item: tuple) -> None:
        kind, a, b, walltime = item
        if kind == "call":
            a(self, *b)
        elif kind == "scalars":
            values = [
                self._Summary.Value(tag=tag, simple_value=v) for tag, v in b.items()
            ]
            self._emit(a, self._Summary(value=values), walltime)
        elif kind == "layout":
            from tensorboardX.summary import custom_scalars

            self._emit(a, custom_scalars(b), walltime)

    def _emit(self, step: int, summary: Any, walltime: float) -> None:
        self._file.write_event(
            self._Event(wall_time=walltime, step=int(step), summary=summary)
        )

    def _drain_after_failure(self) -> None:
        while True:
            item = self._queue.get()
            if item[0] == "close":
                return

    def close(self, timeout_s: float = 60.0) -> None:
        """Write what is queued, close the file (local; any path)."""
        if not self._thread.is_alive():
            return
        self._queue.put(("close", None, None, None))
        self._thread.join(timeout_s)


class NullBoard:
    """TensorBoard off: every call is a no-op."""

    enabled = False
    per_rank = False

    def step(self, row: dict[str, Any]) -> None:
        pass

    def eval(self, row: dict[str, Any]) -> None:
        pass

    def scalars(self, step: int, values: dict[str, float]) -> None:
        pass

    def gather(self) -> None:
        pass

    def close(self) -> None:
        pass


class Board:
    """A run's TensorBoard scalars, on every rank (see the module docstring).

    Rank 0 writes its rows' tags; with more than one rank every rank keeps its
    per-rank figures until :meth:`gather` (collective) hands them to rank 0.
    Everything but :meth:`gather` is local.
    """

    enabled = True

    def __init__(self, run_dir: str | os.PathLike, world: Any) -> None:
        self.world = world
        self.per_rank = world.size > 1
        self.writer: EventWriter | None = None
        self._mine: list[tuple[int, float, dict[str, float]]] = []
        self.cost_s = 0.0  # this rank's training thread in the calls below
        self._differ: set[str] = set()  # written per rank (rank 0's writer thread)
        if world.rank == 0:
            try:
                self.writer = EventWriter(run_dir)
            except ImportError:
                print(
                    f"r0 | TensorBoard scalars off: tensorboardX is not installed "
                    f"({INSTALL}); the rest of the run is unaffected",
                    flush=True,
                )
            except OSError as e:  # the other ranks go on; so does rank 0
                print(
                    f"r0 | TensorBoard scalars off: cannot write an event file in "
                    f"{run_dir} ({e.strerror or e}); the rest of the run is "
                    "unaffected",
                    flush=True,
                )

    @classmethod
    def start(
        cls, run_dir: str | os.PathLike, world: Any, enabled: bool = True
    ) -> Board | NullBoard:
        """A live board when ``enabled`` (the same on every rank), else a no-op."""
        return cls(run_dir, world) if enabled else NullBoard()

    def step(self, row: dict[str, Any]) -> None:
        """A step row of ``metrics.jsonl`` (every rank passes its own)."""
        t0 = time.perf_counter()
        self._add(row["step"], step_tags(row))
        self.cost_s += time.perf_counter() - t0

    def eval(self, row: dict[str, Any]) -> None:
        """An evaluation row (rank 0's is written; the others' are ignored)."""
        if self.writer is not None:
            self.writer.put(row["step"], eval_tags(row), time.time())

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """More tags at ``step`` from any rank (``checkpoint/blocking_s``)."""
        self._add(step, {k: float(v) for k, v in values.items()})

    def _add(self, step: int, tags: dict[str, float]) -> None:
        now = time.time()
        if self.writer is not None:
            self.writer.put(step, tags, now)
        if self.per_rank:
            mine = _per_rank(tags)
            if mine:
                self._mine.append((step, now, mine))

    def gather(self) -> None:
        """Hand every rank's figures to rank 0 (collective; success path only)."""
        if not self.per_rank:
            return
        t0 = time.perf_counter()
        rows, self._mine = self._mine, []
        gathered = self.world.comm.gather(rows, root=0)
        if self.writer is not None:
            self.writer.call(_write_per_rank, self._differ, gathered)
        self.cost_s += time.perf_counter() - t0

    def close(self) -> None:
        """Write what is queued and close the file (local: safe on any path)."""
        if self.writer is not None:
            self.writer.close()


def _write_per_rank(
    writer: EventWriter, differ: set[str], gathered: list[list[tuple]]
) -> None:
    """On the writer thread: the per-rank tags of the tags whose ranks differ."""
    by_step: dict[int, dict[str, list[float]]] = {}
    for rows in gathered:
        for step, _, tags in rows:
            for tag, v in tags.items():
                by_step.setdefault(step, {}).setdefault(tag, []).append(v)
    grown = False
    for tags in by_step.values():
        for tag, vals in tags.items():
            # Differs: unequal values, or a figure some ranks have and others not.
            if tag not in differ and (
                len(vals) < len(gathered) or not _all_equal(vals)
            ):
                differ.add(tag)
                grown = True
    last = 0
    for r, rows in enumerate(gathered):
        for step, walltime, tags in rows:
            out = {f"per_rank/{t}/rank{r}": v for t, v in tags.items() if t in differ}
            writer.write_now(step, out, walltime)
            last = max(last, step)
    if grown:
        charts = {
            tag: ["Multiline", [rf"^per_rank/{re.escape(tag)}/rank\d+$"]]
            for tag in sorted(differ)
        }
        writer.write_layout_now(last, {"per rank": charts})


def _all_equal(vals: list[float]) -> bool:
    first = vals[0]
    return all(v == first or (math.isnan(v) and math.isnan(first)) for v in vals)
