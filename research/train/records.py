"""What a run writes as it goes: its folder, timeline, metrics, TensorBoard, profile.

``Records.open(options, world, run_dir, profile_window)`` (``options``: the
run's :class:`research.train.config.RecordsConfig`) makes the run folder
(rank 0), gathers every rank's device for ``config.json`` and starts the
timeline (``research.trace``; both collective), ``metrics.jsonl``
(``research.rundir``, rank 0), TensorBoard's scalars
(``research.train.tensorboard``) and XLA's profile of ``--profile``'s steps
(``research.train.profiling``). The Trainer hands it rows (``step``,
``rank_step``, ``eval``, ``events``, ``scalars``) and whole records (``write``:
``config.json``, ``summary.json``), and closes it once: ``close(collective=True)``
after success merges the ranks' timelines into ``trace.json``; after an
exception ``close(collective=False)`` writes what this rank has and meets no
other rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from research.comm.faults import watchdog
from research.comm.process import devices
from research.periodic import itstime
from research.rundir import MetricsWriter, write_json
from research.trace import NullTracer, Tracer, get_tracer, set_tracer
from research.train.profiling import StepProfiler
from research.train.tensorboard import Board


class Records:
    """The run's writers, made by :meth:`open`; rank 0 writes the files."""

    def __init__(
        self,
        run_dir: Path,
        world: Any,
        *,
        tracer: Tracer | NullTracer,
        metrics: MetricsWriter,
        board: Any,
        profiler: Any,
        devices: list[Any],
        log_every: int = 1,
    ) -> None:
        self.run_dir, self.world, self.log_every = run_dir, world, log_every
        self.tracer, self.metrics, self.board = tracer, metrics, board
        self.profiler = profiler
        self.devices = devices  # every rank's platform and device (config.json)

    @classmethod
    def open(
        cls, options: Any, world: Any, run_dir: Path, profile_window: Any
    ) -> Records:
        """The run's records in ``run_dir`` (collective: every rank calls it)."""
        if world.rank == 0:
            run_dir.mkdir(parents=True, exist_ok=True)
        found = world.allgather(devices.describe())
        with watchdog.watch("timeline start"):
            tracer = Tracer.start(
                run_dir,
                rank=world.rank,
                size=world.size,
                comm=world.comm,
                enabled=options.trace,
                max_events=options.trace_max_events,
            )
        return cls(
            run_dir,
            world,
            tracer=tracer,
            metrics=MetricsWriter(run_dir, enabled=world.rank == 0),
            board=Board.start(run_dir, world, enabled=options.tensorboard),
            profiler=StepProfiler.start(profile_window, run_dir, world.rank, tracer),
            devices=found,
            log_every=options.log_every,
        )

    @contextmanager
    def current(self) -> Iterator[Records]:
        """This run's timeline as the process's (``research.trace.get_tracer``)
        while the run trains; the one before it afterwards."""
        before = get_tracer()
        set_tracer(self.tracer)
        try:
            yield self
        finally:
            set_tracer(before)

    def wants_step(self, step: int, total_steps: int) -> bool:
        """Whether this rank logs ``step`` (every ``--log-every`` steps, the
        first and the last): rank 0 writes the row, and every rank adds its
        own figures where TensorBoard keeps them per rank."""
        if self.world.rank != 0 and not self.board.per_rank:
            return False
        return itstime(step, self.log_every, total_steps, first=True)

    def step(self, row: dict[str, Any]) -> None:
        """Rank 0's row of a step: ``metrics.jsonl`` and TensorBoard."""
        self.metrics.write(row)
        self.board.step(row)

    def rank_step(self, row: dict[str, Any]) -> None:
        """Another rank's own figures of a step, for TensorBoard's per-rank tags."""
        self.board.step(row)

    def events(self, rows: Iterable[dict[str, Any]]) -> None:
        """A strategy's own rows (its events) into ``metrics.jsonl``."""
        for row in rows:
            self.metrics.write(row)

    def eval(self, row: dict[str, Any]) -> None:
        """An evaluation's row (rank 0's): ``metrics.jsonl`` and TensorBoard."""
        if self.world.rank == 0:
            self.metrics.write({"kind": "eval", **row})
            self.board.eval(row)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """More TensorBoard scalars at ``step`` from any rank."""
        self.board.scalars(step, values)

    def gather(self) -> None:
        """Collective: every rank's TensorBoard figures since the last gather."""
        self.board.gather()

    def write(self, name: str, record: dict[str, Any]) -> None:
        """A whole record as ``RUN_DIR/name`` (rank 0 writes)."""
        if self.world.rank == 0:
            write_json(self.run_dir / name, record)

    def close(self, collective: bool) -> None:
        """Close the profiler, TensorBoard, metrics and the timeline (merged
        into ``trace.json`` only when ``collective``)."""
        self.profiler.close()
        self.board.close()
        self.metrics.close()
        with watchdog.watch("timeline merge") if collective else nullcontext():
            self.tracer.close(collective=collective)
