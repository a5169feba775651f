"""The training loop: steps, evaluation, logging, callbacks; the strategy runs the step.

``Trainer(config, world, averager=..., imbalance=..., callbacks=...).run()``
trains, evaluates and writes the run folder (``research.rundir``). How a step
runs (one jitted program, host-side averaging, a parameter server, stages
overlapped with communication) is its strategy's executor
(``research.train.executors``): the loop asks it for each step's new state,
metrics and communication record, and has it ``drain`` whatever is in flight
before an evaluation, a checkpoint snapshot and the end. Logged rows go to
``metrics.jsonl`` and, by default, to TensorBoard (``research.train.tensorboard``);
``--profile`` captures XLA's profile of chosen steps (``research.train.profiling``).

Per step the loop blocks on the step's metrics, so step times are honest and
rank 0's progress bar shows the loss; the cost is that the host cannot enqueue
step s+1 while step s computes (small on CPU, where dispatch is cheap).

Failures: set-up that only reads (data, model, state) runs before any collective,
and the ranks then agree on its outcome, so bad input raises the same
:class:`research.launch.UsageError` on every rank. After that an exception on
one rank leaves the others inside a collective it will never join, so the error
path runs no collective (the trace is flushed locally, nothing is merged or
closed collectively) and the exception propagates to the entry point, whose
abort hook (``research.comm.world.install_abort_on_error``) ends the job.

Told to stop (SIGTERM, SIGUSR1): the ranks agree on a step, drain, checkpoint
it, write the run folder and ``run`` raises
:class:`research.train.preemption.Stopped` (exit code 128 + signal); see
:mod:`research.train.preemption`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from research.comm import devices, failures, watchdog, xla_collective
from research.comm.base import Averager, CommInfo
from research.comm.dense import HostAllreduce
from research.comm.world import World
from research.imbalance import Imbalance
from research.launch import UsageError
from research.periodic import itstime
from research.rundir import MetricsWriter, write_json
from research.trace import NullTracer, Tracer, get_tracer, set_tracer
from research.train.callback import Callback  # re-exported: callbacks subclass it
from research.train.config import TrainConfig, load_data, model_options
from research.train.evaluate import average_batch_stats, evaluate
from research.train.executors import StepContext, make_executor
from research.train.optim import make_optimizer_for
from research.train.preemption import StopAgreement, Stopped, lag_for, save_at_stop
from research.train.profiling import ProfileWindow, StepProfiler
from research.train.report import (
    config_record,
    eval_row,
    progress_bar,
    rank_row,
    say_eval,
    step_row,
    summary_record,
)

__all__ = ["Callback", "Trainer"]
from research.train.state import TrainState, create_train_state
from research.train.tensorboard import Board


class Trainer:
    """Synchronous (or partially synchronous) data-parallel training on MPI.

    Attributes available to callbacks: ``config``, ``world``, ``state``,
    ``loader``, ``step`` (completed steps), ``total_steps``, ``run_dir``,
    ``tracer``, ``dataset``, ``model``, ``averager``.
    """

    def __init__(
        self,
        config: TrainConfig,
        world: World,
        *,
        averager: Averager | None = None,
        imbalance: Imbalance | None = None,
        callbacks: tuple[Callback, ...] | list[Callback] = (),
        run_dir: str | Path | None = None,
    ) -> None:
        from research.comm.registry import get_averager, strategy_options

        self.config = config
        self.world = world
        # Absolute once: Orbax and other libraries refuse relative paths.
        self.run_dir = Path(run_dir or config.run_dir).absolute()
        self.callbacks = list(callbacks)
        self.imbalance = imbalance or Imbalance()
        # The communication watchdog's timeout, and where a failing rank says
        # why (research.comm.watchdog, research.comm.failures).
        watchdog.configure(config.comm_timeout)
        failures.set_dir(self.run_dir)
        # XLA's collectives (allreduce=xla, or auto on GPUs) need JAX's
        # distributed runtime, which starts before JAX computes (collective).
        xla_collective.start_for(world, config)
        # Local set-up first (no collective): bad data or settings raise here on
        # any rank; the ranks then agree, so every rank stops alike.
        problem = None
        try:
            self._setup_local()
        except (ValueError, UsageError) as e:
            problem = str(e)
        problems = world.allgather(problem)
        failed = [(r, p) for r, p in enumerate(problems) if p is not None]
        if failed:
            r, p = failed[0]
            raise UsageError(p if len(failed) == world.size else f"rank {r}: {p}")
        if config.checkpoint != "none":
            from research.train.checkpointing import CheckpointCallback

            self.callbacks.append(CheckpointCallback.for_run(config))
        if failures.attempt() > 0:  # relaunched by research.restart
            from research.train.restarted import RestartRecord

            self.callbacks.append(RestartRecord())
        if world.rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self.devices = world.allgather(devices.describe())  # for config.json
        try:
            options = strategy_options(
                config.strategy, config.strategy_options, config.link
            )
            self.averager = averager or get_averager(config.strategy, world, **options)
        except ValueError as e:  # the same on every rank
            raise UsageError(str(e)) from None
        self.executor = make_executor(
            self.averager,
            StepContext(
                world.size,
                self._optimizer,
                self.model,
                weight_decay=config.weight_decay,
            ),
        )
        # Collective (a communicator of its own); catches SIGTERM and SIGUSR1.
        self.stop = StopAgreement(world, lag_for(self.averager))
        self.step = 0
        with watchdog.watch("timeline start"):
            self.tracer: Tracer | NullTracer = Tracer.start(
                self.run_dir,
                rank=world.rank,
                size=world.size,
                comm=world.comm,
                enabled=config.trace,
                max_events=config.trace_max_events,
            )
        self.metrics = MetricsWriter(self.run_dir, enabled=world.rank == 0)
        # TensorBoard scalars (rank 0 writes; research.train.tensorboard) and
        # XLA's profile of --profile's steps (research.train.profiling).
        self.board = Board.start(self.run_dir, world, enabled=config.tensorboard)
        self.profiler = StepProfiler.start(
            self._profile_window, self.run_dir, world.rank, self.tracer
        )
        self._logged = (0, 0.0)  # (step, train_time) of the last metrics row
        # BatchNorm statistics: the ring where every rank can load it, not a
        # timed choice, so a resumed run averages them exactly as before.
        self._stats_mean = HostAllreduce(world, allreduce="ring")
        self.step_times: list[float] = []
        self.delays: list[float] = []  # injected into each step (imbalance)
        self.contributors: list[int] = []
        self.evals: list[dict[str, Any]] = []
        self.train_time = 0.0  # wall time in training steps, evaluation excluded
        self._t_start = 0.0

    def _setup_local(self) -> None:
        """Data, loader, schedule, model and state: this rank's work alone."""
        import models

        config = self.config
        self.dataset, self.loader, self.total_steps = load_data(config, self.world)
        self.schedule, tx = self._optimizer(1)
        self.model = models.get_model(
            config.model, num_classes=self.dataset.num_classes, **model_options(config)
        )
        self.state: TrainState = create_train_state(
            self.model, self.dataset.train_x[:1], tx, config.seed
        )
        self._profile_window = ProfileWindow.parse(config.profile, config.profile_ranks)
        if self._profile_window is not None:
            problem = self._profile_window.problem(self.total_steps, self.world.size)
            if problem:
                raise UsageError(problem)

    # -- resume -------------------------------------------------------------------
    def restore(self, state: TrainState, step: int, data_position: dict | None) -> None:
        """Continue from a checkpoint: every rank passes the identical state."""
        self.state = state
        self.step = int(step)
        if data_position is not None:
            self.loader.set_position(data_position)

    def _optimizer(self, pushes_per_step: int, weight_decay: float | None = None):
        """``(schedule, tx)`` for a consumer of ``pushes_per_step`` updates per
        step; ``weight_decay`` overrides the run's (0: a strategy that decays
        the local gradient itself)."""
        return make_optimizer_for(
            self.config,
            self.world.size,
            self.total_steps,
            pushes_per_step,
            weight_decay=weight_decay,
        )

    # -- one step -----------------------------------------------------------------
    def _train_step(self) -> tuple[dict, CommInfo | None, dict[str, float]]:
        step = self.step
        t0 = time.perf_counter()
        with self.tracer.span("load batch", "data", step=step):
            x, y = self.loader.next_batch()
        data_s = time.perf_counter() - t0
        delay = self.imbalance.delay(step, self.world.rank)
        self.state, m, info, phases = self.executor.step(
            self.state, x, y, step=step, hold=lambda: self._hold(delay, step)
        )
        return m, info, {"data_s": data_s, "delay_s": delay, **phases}

    def _hold(self, delay: float, step: int) -> None:
        """The injected imbalance: part of the compute phase (a slower rank)."""
        if delay > 0:
            with self.tracer.span(
                "injected delay",
                "delay",
                step=step,
                seconds=delay,
                how=self.imbalance.how,
            ):
                self.imbalance.hold(delay)

    def drain(self, final: bool = False) -> None:
        """Complete the strategy's communication in flight (collective).

        Called before every evaluation and checkpoint snapshot and at the end,
        so nobody sees half-updated parameters or misses a carried gradient.
        """
        self.state = self.executor.drain(self.state, final)

    # -- the loop -----------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train for ``total_steps``, evaluating and logging; returns the summary.

        On an exception only local clean-up runs (see the module docstring) and
        the exception propagates; the collective clean-up runs on success only.
        A run told to stop raises :class:`Stopped` after its clean-up.
        """
        prev_tracer = get_tracer()
        set_tracer(self.tracer)
        try:
            summary = self._run()
        except BaseException:
            self.stop.restore_handlers()
            self.profiler.close()
            self.board.close()  # local: rank 0 writes what it has
            self.metrics.close()
            self.tracer.close(collective=False)
            set_tracer(prev_tracer)
            raise
        self.profiler.close()
        self.board.close()
        self.metrics.close()
        with watchdog.watch("timeline merge"):
            self.tracer.close()
        set_tracer(prev_tracer)
        with watchdog.watch("strategy close"):
            self.executor.close()
        if self.stop.stopped is not None:
            raise Stopped(self.stop.stopped)
        return summary

    def _run(self) -> dict[str, Any]:
        world = self.world
        if world.rank == 0:
            write_json(self.run_dir / "config.json", config_record(self))
        started = self.executor.start(self.state)
        if started is not None:  # the strategy's own state fields, before restore
            self.state = started
        self.imbalance.hold(0.0)  # compiles and calibrates a spin, if any
        for cb in self.callbacks:
            cb.on_train_start(self)
        bar = progress_bar(self)
        self._logged = (self.step, self.train_time)
        world.barrier()
        self._t_start = time.perf_counter()
        while self.step < self.total_steps:
            with self.profiler.step(self.step + 1):
                t0 = time.perf_counter()
                watchdog.set_step(self.step + 1)
                m, info, phases = self._train_step()
                dt = time.perf_counter() - t0
                watchdog.note_step(dt)
            self.train_time += dt
            self.step += 1
            self.step_times.append(dt)
            self.delays.append(phases.get("delay_s", 0.0))
            if info is not None:
                self.contributors.append(info.contributors)
            self._after_step(m, info, phases, dt, bar)
            if self.stop.check(self.step):  # the same step on every rank
                world.log(f"stopping at step {self.step}: {self.stop.stopped}")
                break
        watchdog.set_step(None)
        self.stop.close()
        self.drain(final=True)
        if self.stop.stopped is not None:
            save_at_stop(self)  # checkpoint this step; no final evaluation
        elif not self.evals or self.evals[-1]["step"] != self.step:
            self._eval_and_log()
        for cb in self.callbacks:
            cb.on_train_end(self)
        self.board.gather()  # collective: the ranks' figures since the last eval
        if bar is not None:
            bar.close()
        summary = summary_record(self)
        if world.rank == 0:
            write_json(self.run_dir / "summary.json", summary)
        return summary

    def _after_step(self, m, info, phases, dt, bar) -> None:
        cfg = self.config
        if (self.world.rank == 0 or self.board.per_rank) and itstime(
            self.step, cfg.log_every, self.total_steps, first=True
        ):
            if self.world.rank == 0:
                row = step_row(self, m, info, phases, dt)
                self._logged = (self.step, self.train_time)
                self.metrics.write(row)
                self.board.step(row)
            else:  # this rank's own figures, for TensorBoard's per-rank tags
                self.board.step(rank_row(self, info, phases, dt))
        for row in self.executor.take_rows():  # a strategy's own events
            self.metrics.write(row)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{float(m['loss']):.3f}", refresh=False)
        if itstime(self.step, cfg.eval_every, self.total_steps, last=False):
            self._eval_and_log()
        for cb in self.callbacks:
            cb.on_step_end(self, self.step)

    def evaluate(self) -> dict[str, float]:
        """Test loss and accuracy now (collective): drains, syncs BatchNorm stats."""
        self.drain()
        with self.tracer.span("evaluate", "eval", step=self.step):
            self.state = average_batch_stats(self.state, self._stats_mean)
            return evaluate(
                self.state,
                self.dataset.test_x,
                self.dataset.test_y,
                self.config.eval_batch_size,
                self.world,
            )

    def _eval_and_log(self) -> None:
        t0 = time.perf_counter()
        row = eval_row(self, self.evaluate(), t0)
        self.evals.append(row)
        if self.world.rank == 0:
            self.metrics.write({"kind": "eval", **row})
            self.board.eval(row)
            say_eval(self, row)
        self.board.gather()  # collective, where the ranks meet anyway

    def log_scalars(self, step: int, values: dict[str, float]) -> None:
        """More TensorBoard scalars at ``step``, from any rank (a callback's:
        ``checkpoint/blocking_s``); rank 0's are written as they are, every
        rank's also as ``per_rank/<tag>/rank<r>`` where the ranks differ."""
        self.board.scalars(step, values)
