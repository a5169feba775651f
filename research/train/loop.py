"""The training loop: steps, evaluation, logging, callbacks; the strategy runs the step.

``Trainer(config, world, strategy=..., imbalance=..., callbacks=...).run()``
trains, evaluates and writes the run folder. How a step runs is its
strategy's (``research.strategies``): the loop asks it for each step's new
state, metrics and communication record, and has it drain what is in flight
before an evaluation, a checkpoint snapshot and the end. What the run writes
(the timeline, ``metrics.jsonl``, TensorBoard, the profile, ``config.json``
and ``summary.json``) goes through one object, ``research.train.records``.
The loop blocks on each step's metrics, so step times are honest.

Failures: set-up is agreed before any collective (``research.train.setup``).
After that an exception on one rank leaves the others inside a collective, so
the error path runs no collective and the exception propagates to the entry
point, whose abort hook (``research.comm.world``) ends the job. Told to stop
(SIGTERM, SIGUSR1), the ranks agree on a step, checkpoint it and ``run`` raises
:class:`research.train.preemption.Stopped` (``research.train.preemption``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from research.comm.dense import HostAllreduce
from research.comm.faults.watchdog import note_step, set_step, watch
from research.comm.info import CommInfo
from research.comm.world import World
from research.imbalance import Imbalance
from research.periodic import itstime
from research.steps.state import TrainState
from research.strategies.base import StepContext, Strategy
from research.train.callback import Callback  # re-exported: callbacks subclass it
from research.train.config import TrainConfig
from research.train.evaluate import average_batch_stats, evaluate
from research.train.preemption import StopAgreement, Stopped, lag_for, save_at_stop
from research.train.prefetch import DeviceFeed
from research.train.records import Records
from research.train.report import (
    config_record,
    eval_row,
    progress_bar,
    rank_row,
    say_eval,
    step_row,
    summary_record,
)
from research.train.setup import (
    Setup,
    agreed_setup,
    implied_callbacks,
    start_process,
)

__all__ = ["Callback", "Trainer"]


class Trainer:
    """Synchronous (or partially synchronous) data-parallel training on MPI.

    What callbacks may read of it: :class:`research.train.callback.Run`.
    """

    def __init__(
        self,
        config: TrainConfig,
        world: World,
        *,
        strategy: Strategy | None = None,
        imbalance: Imbalance | None = None,
        callbacks: tuple[Callback, ...] | list[Callback] = (),
        run_dir: str | Path | None = None,
    ) -> None:
        self.t_made = time.perf_counter()  # the run's clock: start-up counts
        self.config, self.world = config, world
        self.run_dir = Path(run_dir or config.run_dir).absolute()  # for Orbax
        self.imbalance = imbalance or Imbalance()
        options = start_process(config, world, self.run_dir)  # before JAX computes
        setup = agreed_setup(config, world)  # the same outcome on every rank
        self._parts(setup)
        self.callbacks = [*callbacks, *implied_callbacks(config)]
        self.strategy = strategy or options.create(world)
        self.ctx = StepContext(setup.optimizer, self.model, config.weight_decay)
        self.stop = StopAgreement(world, lag_for(self.strategy))  # collective; signals
        self.records = Records.open(
            config.records, world, self.run_dir, setup.profile_window
        )
        self._tallies()

    @property
    def tracer(self) -> Any:
        """The run's timeline (``research.trace``), for the loop's and the
        callbacks' spans."""
        return self.records.tracer

    def _parts(self, setup: Setup) -> None:
        """The agreed set-up's parts: the data (the next batch already on the
        device: research.train.prefetch), schedule, model and state."""
        self.dataset, self.loader = setup.dataset, DeviceFeed(setup.loader)
        self.total_steps, self.schedule = setup.total_steps, setup.schedule
        self.model, self.state = setup.model, setup.state
        # BatchNorm statistics: the ring where every rank can load it, not a
        # timed choice, so a resumed run averages them exactly as before.
        self._stats_mean = HostAllreduce(self.world, allreduce="ring")

    def _tallies(self) -> None:
        """What the run counts as it goes (``summary.json``'s figures)."""
        self.step, self.logged = 0, (0, 0.0)  # the last metrics row: step, time
        self.step_times: list[float] = []
        self.delays: list[float] = []  # injected into each step (imbalance)
        self.data_waits: list[float] = []  # each step's input wait
        self.contributors: list[int] = []
        self.evals: list[dict[str, Any]] = []
        self.train_time = 0.0  # wall time in training steps, evaluation excluded
        self.t_start = 0.0  # when the first step began (perf_counter)
        self.start_s = 0.0  # from the constructor's start to the first step

    # -- resume -------------------------------------------------------------------
    def restore(self, state: TrainState, step: int, data_position: dict | None) -> None:
        """Continue from a checkpoint: every rank passes the identical state."""
        self.state = state
        self.step = int(step)
        if data_position is not None:
            self.loader.set_position(data_position)

    # -- one step -----------------------------------------------------------------
    def _train_step(self) -> tuple[dict, CommInfo | None, dict[str, float]]:
        step = self.step
        # The input wait: what the training thread waits for a batch that the
        # feeder thread did not have on the device yet (research.train.prefetch).
        with self.tracer.span("load batch", "data", step=step):
            x, y = self.loader.next_batch()
        delay = self.imbalance.delay(step, self.world.rank)
        self.state, m, info, phases = self.strategy.step(
            self.state, x, y, step=step, hold=lambda: self._hold(delay, step)
        )
        wait = self.loader.wait_s
        return m, info, {"data_wait_s": wait, "delay_s": delay, **phases}

    def _hold(self, delay: float, step: int) -> None:
        """The injected imbalance: part of the compute phase (a slower rank)."""
        if delay > 0:
            how = self.imbalance.how
            with self.tracer.span(
                "injected delay", "delay", step=step, seconds=delay, how=how
            ):
                self.imbalance.hold(delay)

    def drain(self, final: bool = False) -> None:
        """Complete the strategy's communication in flight (collective).

        Called before every evaluation and checkpoint snapshot and at the end,
        so nobody sees half-updated parameters or misses a carried gradient.
        """
        self.state = self.strategy.drain_into(self.state, final)

    # -- the loop -----------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train for ``total_steps``, evaluating and logging; returns the summary.

        On an exception only local clean-up runs (see the module docstring) and
        the exception propagates; the collective clean-up runs on success only.
        A run told to stop raises :class:`Stopped` after its clean-up.
        """
        with self.records.current():
            try:
                summary = self._run()
            except BaseException:
                self.stop.restore_handlers()
                self.loader.close()  # the feeder and decoding threads; no collective
                self.records.close(collective=False)  # rank 0 writes what it has
                raise
            self.loader.close()
            self.records.close(collective=True)
        with watch("strategy close"):
            self.strategy.close()
        if self.stop.stopped is not None:
            raise Stopped(self.stop.stopped)
        return summary

    def _run(self) -> dict[str, Any]:
        world = self.world
        self.records.write("config.json", config_record(self))
        started = self.strategy.start(self.state, self.ctx)
        if started is not None:  # the strategy's own state fields, before restore
            self.state = started
        self.imbalance.hold(0.0)  # compiles and calibrates a spin, if any
        for cb in self.callbacks:
            cb.on_train_start(self)
        bar = progress_bar(self)
        self.logged = (self.step, self.train_time)
        world.barrier()
        self.t_start = time.perf_counter()
        self.start_s = self.t_start - self.t_made
        while self.step < self.total_steps:
            with self.records.profiler.step(self.step + 1):
                t0 = time.perf_counter()
                set_step(self.step + 1)
                m, info, phases = self._train_step()
                dt = time.perf_counter() - t0
                note_step(dt)
            self.train_time += dt
            self.step += 1
            self.step_times.append(dt)
            self.delays.append(phases.get("delay_s", 0.0))
            self.data_waits.append(phases["data_wait_s"])
            if info is not None:
                self.contributors.append(info.contributors)
            self._after_step(m, info, phases, dt, bar)
            if self.stop.check(self.step):  # the same step on every rank
                world.log(f"stopping at step {self.step}: {self.stop.stopped}")
                break
        set_step(None)
        self.stop.close()
        self.drain(final=True)
        if self.stop.stopped is not None:
            save_at_stop(self)  # checkpoint this step; no final evaluation
        elif not self.evals or self.evals[-1]["step"] != self.step:
            self._eval_and_log()
        for cb in self.callbacks:
            cb.on_train_end(self)
        self.records.gather()  # collective: the ranks' figures since the last eval
        if bar is not None:
            bar.close()
        summary = summary_record(self)
        self.records.write("summary.json", summary)
        return summary

    def _after_step(self, m, info, phases, dt, bar) -> None:
        cfg = self.config
        if self.records.wants_step(self.step, self.total_steps):
            if self.world.rank == 0:
                row = step_row(self, m, info, phases, dt)
                self.logged = (self.step, self.train_time)
                self.records.step(row)
            else:  # this rank's own figures, for TensorBoard's per-rank tags
                self.records.rank_step(rank_row(self, info, phases, dt))
        self.records.events(self.strategy.take_rows())  # a strategy's own
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
            batches = self.dataset.eval_batches(
                self.config.eval_batch_size, self.world.rank, self.world.size
            )
            return evaluate(self.state, batches, self.world)

    def _eval_and_log(self) -> None:
        t0 = time.perf_counter()
        row = eval_row(self, self.evaluate(), t0)
        self.evals.append(row)
        self.records.eval(row)
        if self.world.rank == 0:
            say_eval(self, row)
        self.records.gather()  # collective, where the ranks meet anyway

    def log_scalars(self, step: int, values: dict[str, float]) -> None:
        """More TensorBoard scalars at ``step``, from any rank (a callback's:
        ``checkpoint/blocking_s``); rank 0's are written as they are, every
        rank's also as ``per_rank/<tag>/rank<r>`` where the ranks differ."""
        self.records.scalars(step, values)
