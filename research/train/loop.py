"""The training loop: one seam for averaging, both execution styles, callbacks.

``Trainer(config, world, averager=..., imbalance=..., callbacks=...).run()``
trains, evaluates and writes the run folder (``research.rundir``). The averaging
strategy (``research.comm.base.Averager``) decides the style:

* fused: ``state, metrics = fused_step(state, x, y)`` (gradient, mpi4jax
  allreduce and update in one jitted program);
* staged: ``grads = grad_step(...)``; ``grads, info = averager.reduce(grads)`` on
  the host; ``state = apply_step(state, grads)``. A strategy with
  ``replaces_update`` returns parameters instead (parameter server).

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
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from research.comm.base import Averager, CommInfo
from research.comm.world import World
from research.imbalance import Imbalance
from research.launch import UsageError, xla_compute_threads
from research.rundir import MetricsWriter, versions, write_json
from research.trace import NullTracer, Tracer, get_tracer, set_tracer
from research.train import step as steps
from research.train.config import TrainConfig
from research.train.optim import make_optimizer, make_schedule
from research.train.periodic import itstime
from research.train.state import (
    TrainState,
    create_train_state,
    param_count,
    tree_bytes,
    tree_digest,
)


class Callback:
    """Hooks into the loop (checkpointing, custom logging). All are optional."""

    def on_train_start(self, trainer: Trainer) -> None:
        """Before the first step; may call ``trainer.restore`` to resume."""

    def on_step_end(self, trainer: Trainer, step: int) -> None:
        """After the update of step ``step`` (number of completed steps)."""

    def on_train_end(self, trainer: Trainer) -> None:
        """After the last step and the final evaluation."""

    def summary(self) -> dict[str, Any]:
        """Numbers merged into ``summary.json``."""
        return {}


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
        from research.comm.registry import get_averager

        self.config = config
        self.world = world
        # Absolute once: Orbax and other libraries refuse relative paths.
        self.run_dir = Path(run_dir or config.run_dir).absolute()
        self.callbacks = list(callbacks)
        self.imbalance = imbalance or Imbalance()
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
            from research.checkpoint import CheckpointConfig
            from research.checkpoint.callback import CheckpointCallback

            ck = CheckpointConfig(
                strategy=config.checkpoint,
                every=config.checkpoint_every,
                resume=config.resume,
                final=True,
            )
            self.callbacks.append(CheckpointCallback(ck))
        if world.rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        world.barrier()
        self.averager = averager or get_averager(
            config.strategy, world, **config.strategy_options
        )
        self.step = 0
        self.tracer: Tracer | NullTracer = Tracer.start(
            self.run_dir,
            rank=world.rank,
            size=world.size,
            comm=world.comm,
            enabled=config.trace,
            max_events=config.trace_max_events,
        )
        self.metrics = MetricsWriter(self.run_dir, enabled=world.rank == 0)
        self._fused = (
            steps.make_fused_step(self.averager.average_in_jit)
            if self.averager.style == "fused"
            else None
        )
        self._step_times: list[float] = []
        self._delays: list[float] = []  # injected into each step (imbalance)
        self._contributors: list[int] = []
        self._evals: list[dict[str, Any]] = []
        self._train_time = 0.0  # wall time in training steps, evaluation excluded
        self._t_start = 0.0

    def _setup_local(self) -> None:
        """Data, loader, schedule, model and state: this rank's work alone."""
        import models
        from research.data import get_dataset
        from research.data.sharding import ShardedLoader

        config, world = self.config, self.world
        self.dataset = get_dataset(
            config.dataset,
            path=config.data_dir,
            seed=config.seed,
            **config.data_options,
        )
        self.loader = ShardedLoader(
            self.dataset.train_x,
            self.dataset.train_y,
            batch_size=config.batch_size,
            rank=world.rank,
            size=world.size,
            seed=config.seed,
        )
        self.total_steps = (
            config.steps
            if config.steps > 0
            else max(1, math.ceil(config.epochs * self.loader.steps_per_epoch))
        )
        lr = config.lr * (
            config.batch_size * world.size / 256 if config.scale_lr else 1
        )
        self.schedule = make_schedule(
            config.schedule, lr, self.total_steps, config.warmup_steps
        )
        tx = make_optimizer(self.schedule, config.momentum, config.weight_decay)
        self.model = models.get_model(
            config.model, num_classes=self.dataset.num_classes, **config.model_options
        )
        self.state: TrainState = create_train_state(
            self.model, self.dataset.train_x[:1], tx, config.seed
        )

    # -- resume -------------------------------------------------------------------
    def restore(self, state: TrainState, step: int, data_position: dict | None) -> None:
        """Continue from a checkpoint: every rank passes the identical state."""
        self.state = state
        self.step = int(step)
        if data_position is not None:
            self.loader.set_position(data_position)

    # -- one step -----------------------------------------------------------------
    def _train_step(self) -> tuple[dict, CommInfo | None, dict[str, float]]:
        tr, rank, step = self.tracer, self.world.rank, self.step
        phases: dict[str, float] = {}
        t0 = time.perf_counter()
        with tr.span("load batch", "data", step=step):
            x, y = self.loader.next_batch()
        t1 = time.perf_counter()
        phases["data_s"] = t1 - t0
        delay = self.imbalance.delay(step, rank)
        phases["delay_s"] = delay
        info = None
        if self._fused is not None:
            self._hold(delay, step)  # one jitted call: the delay can only go first
            t2 = time.perf_counter()
            with tr.span("fwd+bwd+allreduce+update", "compute", step=step):
                self.state, m = self._fused(self.state, x, y)
                m = jax.device_get(m)
            phases["compute_s"] = time.perf_counter() - t2
        else:
            t2 = time.perf_counter()
            with tr.span("forward+backward", "compute", step=step):
                grads, batch_stats, m = steps.grad_step(self.state, x, y)
                grads = jax.block_until_ready(grads)
                m = jax.device_get(m)
            compute_s = time.perf_counter() - t2
            # The straggler's extra work follows its forward+backward, so it
            # computes alongside the others (as contended as they are when ranks
            # share cores) and is then held while they wait or move on.
            self._hold(delay, step)
            t3 = time.perf_counter()
            with tr.span(
                "average", "comm", step=step, strategy=self.averager.name
            ) as sp:
                out, info = self.averager.reduce(grads)
                sp.set(
                    bytes=info.bytes,
                    contributors=info.contributors,
                    staleness=info.staleness,
                )
            t4 = time.perf_counter()
            with tr.span("update", "update", step=step):
                self._apply(out, batch_stats)
            phases.update(
                compute_s=compute_s, comm_s=t4 - t3, update_s=time.perf_counter() - t4
            )
        return m, info, phases

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

    def _apply(self, out: Any, batch_stats: Any) -> None:
        if self.averager.replaces_update:
            self.state = steps.set_params_step(self.state, out, batch_stats)
        else:
            self.state = steps.apply_step(self.state, out, batch_stats)
        jax.block_until_ready(self.state.params)

    # -- evaluation ---------------------------------------------------------------
    def sync_batch_stats(self) -> None:
        """Average BatchNorm statistics over ranks (collective), as Flax's example."""
        leaves, treedef = jax.tree_util.tree_flatten(self.state.batch_stats)
        if not leaves or self.world.size == 1:
            return
        from mpi4py import MPI

        flat = np.concatenate([np.asarray(a, np.float64).ravel() for a in leaves])
        self.world.comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
        flat /= self.world.size
        out, off = [], 0
        for a in leaves:
            out.append(flat[off : off + a.size].reshape(a.shape).astype(a.dtype))
            off += a.size
        self.state = self.state.replace(
            batch_stats=jax.tree_util.tree_unflatten(treedef, out)
        )

    def evaluate(self) -> dict[str, float]:
        """Test loss and accuracy over the whole test split, summed over ranks."""
        from research.data.sharding import eval_batches

        with self.tracer.span("evaluate", "eval", step=self.step):
            self.sync_batch_stats()
            totals = np.zeros(3)
            for x, y in eval_batches(
                self.dataset.test_x,
                self.dataset.test_y,
                self.config.eval_batch_size,
                self.world.rank,
                self.world.size,
            ):
                loss_sum, correct = steps.eval_step(self.state, x, y)
                totals += (float(loss_sum), float(correct), len(y))
            totals = self.world.comm.allreduce(totals)
        n = max(totals[2], 1)
        return {"test_loss": totals[0] / n, "test_acc": totals[1] / n}

    # -- the loop -----------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train for ``total_steps``, evaluating and logging; returns the summary.

        On an exception only local clean-up runs (see the module docstring) and
        the exception propagates; the collective clean-up runs on success only.
        """
        prev_tracer = get_tracer()
        set_tracer(self.tracer)
        try:
            summary = self._run()
        except BaseException:
            self.metrics.close()
            self.tracer.close(collective=False)
            set_tracer(prev_tracer)
            raise
        self.metrics.close()
        self.tracer.close()
        set_tracer(prev_tracer)
        self.averager.close()
        return summary

    def _run(self) -> dict[str, Any]:
        world = self.world
        if world.rank == 0:
            write_json(self.run_dir / "config.json", self._config_record())
        self._bind_server()
        self.imbalance.hold(0.0)  # compiles and calibrates a spin, if any
        for cb in self.callbacks:
            cb.on_train_start(self)
        bar = self._progress_bar()
        world.barrier()
        self._t_start = time.perf_counter()
        while self.step < self.total_steps:
            t0 = time.perf_counter()
            m, info, phases = self._train_step()
            dt = time.perf_counter() - t0
            self._train_time += dt
            self.step += 1
            self._step_times.append(dt)
            self._delays.append(phases.get("delay_s", 0.0))
            if info is not None:
                self._contributors.append(info.contributors)
            self._after_step(m, info, phases, dt, bar)
        self._flush_averager()
        if not self._evals or self._evals[-1]["step"] != self.step:
            self._eval_and_log()
        for cb in self.callbacks:
            cb.on_train_end(self)
        if bar is not None:
            bar.close()
        summary = self._summary()
        if world.rank == 0:
            write_json(self.run_dir / "summary.json", summary)
        return summary

    def _bind_server(self) -> None:
        """Give a parameter-server strategy its start parameters and optimizer.

        P pushes make one synchronous step's worth of gradient, so the server
        steps with lr / P on a schedule P times as long (same per-example rate).
        """
        if not (self.averager.replaces_update and hasattr(self.averager, "bind")):
            return
        c, p = self.config, self.world.size
        lr = c.lr * (c.batch_size * p / 256 if c.scale_lr else 1)
        sched = make_schedule(
            c.schedule, lr / p, self.total_steps * p, c.warmup_steps * p
        )
        self.averager.bind(
            self.state.params, make_optimizer(sched, c.momentum, c.weight_decay)
        )

    def _after_step(self, m, info, phases, dt, bar) -> None:
        cfg = self.config
        if self.world.rank == 0 and itstime(
            self.step, cfg.log_every, self.total_steps, first=True
        ):
            row = {
                "step": self.step,
                "loss": float(m["loss"]),
                "acc": float(m["acc"]),
                "lr": float(self.schedule(self.step - 1)),
                "step_time": dt,
                "wall": time.perf_counter() - self._t_start,
                "train_time": self._train_time,
                **phases,
            }
            if info is not None:
                row.update({f"comm_{k}": v for k, v in info.as_dict().items()})
            self.metrics.write(row)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{float(m['loss']):.3f}", refresh=False)
        if itstime(self.step, cfg.eval_every, self.total_steps, last=False):
            self._eval_and_log()
        for cb in self.callbacks:
            cb.on_step_end(self, self.step)

    def _flush_averager(self) -> None:
        out = self.averager.flush()
        if out is not None:
            tree, info = out
            with self.tracer.span("flush", "comm", contributors=info.contributors):
                self._apply(tree, self.state.batch_stats)
            # The flush round delivers carried gradients: it is not a new step.
            self.state = self.state.replace(step=self.step)

    def _eval_and_log(self) -> None:
        t0 = time.perf_counter()
        ev = self.evaluate()
        row = {
            "step": self.step,
            "epoch": self.step / self.loader.steps_per_epoch,
            "wall": t0 - self._t_start,
            "train_time": self._train_time,
            "eval_s": time.perf_counter() - t0,
            **ev,
        }
        self._evals.append(row)
        if self.world.rank == 0:
            self.metrics.write({"kind": "eval", **row})
            if not (sys.stderr.isatty() and self.config.progress):
                print(
                    f"r0 | step {self.step}/{self.total_steps} "
                    f"test_acc {ev['test_acc']:.4f} test_loss {ev['test_loss']:.4f}",
                    flush=True,
                )

    def _progress_bar(self):
        if self.world.rank != 0 or not self.config.progress or not sys.stderr.isatty():
            return None
        from tqdm import tqdm

        return tqdm(
            total=self.total_steps,
            initial=self.step,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            mininterval=0.5,
        )

    def _config_record(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "world_size": self.world.size,
            "strategy": {"name": self.averager.name, "style": self.averager.style},
            "imbalance": getattr(
                self.imbalance, "describe", lambda: self.imbalance.name
            )(),
            "model_params": param_count(self.state.params),
            "param_bytes": tree_bytes(self.state.params),
            "dataset": self.dataset.describe(),
            "total_steps": self.total_steps,
            "steps_per_epoch": self.loader.steps_per_epoch,
            # What sized XLA:CPU's compute pool (research.launch.thread_env),
            # and the pool this rank really has.
            "compute_threads": {
                **{v: os.environ.get(v) for v in ("PJRT_NPROC", "NPROC", "XLA_FLAGS")},
                "xla_eigen_threads": xla_compute_threads(),
            },
            "versions": versions(),
        }

    def _summary(self) -> dict[str, Any]:
        times = self._step_times[1:] or self._step_times  # step 1 includes compilation
        med = statistics.median(times) if times else float("nan")
        per_rank = self.world.allgather(med)
        # What a step costs apart from the rank's own injected delay: the waiting
        # for stragglers that a strategy does or avoids (imbalance studies).
        busy = [t - d for t, d in zip(self._step_times, self._delays)]
        busy = busy[1:] or busy
        busy_per_rank = self.world.allgather(
            statistics.median(busy) if busy else float("nan")
        )
        global_batch = self.config.batch_size * self.world.size
        last = self._evals[-1] if self._evals else {}
        summary = {
            "steps": self.step,
            "world_size": self.world.size,
            "strategy": self.averager.name,
            "model": self.config.model,
            "dataset": self.config.dataset,
            "global_batch": global_batch,
            "median_step_s": med,
            "median_step_s_per_rank": per_rank,
            # median over ranks of each rank's median (step - own injected delay)
            "median_step_without_delay_s": statistics.median(busy_per_rank),
            "train_time_s": self._train_time,
            "samples_per_s": global_batch * len(times) / max(sum(times), 1e-9),
            "final_test_acc": last.get("test_acc"),
            "final_test_loss": last.get("test_loss"),
            "params_sha256": tree_digest(self.state.params),
            "evals": self._evals,
        }
        if self._contributors:
            summary["mean_contributors"] = float(np.mean(self._contributors))
        for cb in self.callbacks:
            summary.update(cb.summary())
        return summary
