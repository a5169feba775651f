"""Measure checkpointing savers inside one training run, interleaved.

Comparing whole runs one after another is hopeless on a shared machine: the
same run without checkpoints took 17 s and 71 s here minutes apart. So one
training run (a :class:`~research.train.loop.Trainer`) carries every saver:
the steps are cut into periods of ``window`` steps, each period belongs to one
``(saver, interval)`` arm (``none``: no checkpoint, the placebo), the arm
checkpoints at the period's first step and every ``interval`` steps after it,
and ``settle`` steps after its last checkpoint every rank waits for the arm's
work to finish (the wait is charged to the arm) and meets the others. Each
round holds one period of every arm in shuffled order, so slow drifts of the
machine's load hit every arm alike; arms given fewer ``rounds`` (the in-flight
and extra-interval arms, which no target depends on) sit in rounds spread over
the run.

The cost of a period is its charged part (checkpoint calls, the steps up to
the wait, the wait) minus as many local reference steps, measured on the
clean steps that follow every wait (``overhead.py`` has the estimator, its
reasons and its bootstrap). Blocking time, time until committed and bytes
written are measured per checkpoint; restore time once per saver after
training. Before measuring, each saver writes one checkpoint to pay its
one-time costs (Orbax set-up, compilation of the device copy).
"""

from __future__ import annotations

import dataclasses
import math
import random
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from research.checkpoint.base import Checkpointer
from research.checkpoint.config import CheckpointConfig
from research.checkpoint.overhead import period_costs, profile, summarize
from research.comm.asynchronous.progress import wait_all
from research.comm.world import World
from research.trace import Tracer
from research.train.config import TrainConfig
from research.train.loop import Callback, Trainer


@dataclasses.dataclass(frozen=True)
class Slot:
    """Steps ``(start, start + window]`` belong to ``arm``.

    It checkpoints at ``start``, ``start + interval``, ... (before
    ``start + window``); its work is waited for at step ``start + charged``.
    """

    arm: str
    saver: str
    interval: int
    start: int
    window: int
    charged: int
    round: int

    @property
    def checkpoints(self) -> list[int]:
        if self.saver == "none":
            return []
        return list(range(self.start, self.start + self.window, self.interval))


def charged_steps(interval: int, window: int, settle: int) -> int:
    """Steps from a period's start to its wait: ``settle`` after the last save."""
    last = ((window - 1) // interval) * interval if interval else 0
    return min(last + settle, window)


def schedule(
    arms: dict[str, tuple[str, int]],
    *,
    rounds: int,
    window: int,
    settle: int,
    warm: int,
    minor: dict[str, int] | None = None,
    seed: int = 0,
) -> list[Slot]:
    """Shuffled rounds, one period of every arm each (``none``: the placebo).

    Args:
      arms: ``{arm: (saver, interval)}``; ``"none": ("none", 0)`` included.
      rounds: rounds, i.e. periods of each arm.
      window: steps per period.
      settle: steps after an arm's last checkpoint of a period before its work
        is waited for; the rest of the period is clean (``overhead.py``).
      warm: steps before the first period (compilation, one-time costs).
      minor: ``{arm: n}``: these arms get only ``n`` periods, in rounds spread
        evenly over the run.
      seed: shuffling seed (the same on every rank).
    """
    if not 0 < settle < window:
        raise ValueError(f"settle must be in 1..{window - 1} steps, got {settle}")
    minor = minor or {}
    rng = random.Random(seed)
    slots: list[Slot] = []
    step = warm
    for r in range(rounds):
        order = [
            a
            for a in arms
            if a not in minor
            or r in {(j * rounds) // minor[a] for j in range(min(minor[a], rounds))}
        ]
        rng.shuffle(order)
        for a in order:
            saver, interval = arms[a]
            every = interval if saver != "none" else window
            n = charged_steps(every, window, settle)
            slots.append(Slot(a, saver, interval, step, window, n, r))
            step += window
    return slots


class Interleaved(Callback):
    """Runs the schedule: saves with the active arm's checkpointer, times steps."""

    def __init__(
        self,
        configs: dict[str, CheckpointConfig],
        arms: dict[str, tuple],
        slots: list[Slot],
        warm_saves_at: int,
    ) -> None:
        self.configs, self.arms, self.slots = configs, arms, slots
        self.warm_saves_at = warm_saves_at
        self.ckpts: dict[str, Checkpointer] = {}
        self.before: dict[int, float] = {}  # step end and any wait, before saving
        self.after: dict[int, float] = {}  # after this step's checkpoint call
        self.drained: dict[int, float] = {}  # wait for an arm's work, this rank
        self._due: dict[int, str] = {}
        self._drain: dict[int, str] = {}
        for s in slots:
            for k in s.checkpoints:
                self._due[k] = s.arm
            self._drain[s.start + s.charged] = s.saver
        # Progress: rank 0 prints a line as each round ends.
        self._round_end = {
            max(s.start + s.window for s in slots if s.round == r): r
            for r in {s.round for s in slots}
        }
        self._t0 = 0.0
        self._comm = None

    def on_train_start(self, trainer: Trainer) -> None:
        self._comm = trainer.world.dup("checkpoint-bench")
        self._t0 = time.perf_counter()
        if isinstance(trainer.tracer, Tracer):
            # Rank 0 merges every rank's trace into trace.json at the end only.
            # A merge mid-run stalls its training thread (0.13 s for the
            # default run's 3.6 MB trace), and the stall lands in one period's
            # charged steps or in the clean steps its neighbours' reference
            # steps come from: noise of about a point in that arm's overhead.
            trainer.tracer.merge_every_s = math.inf
        for name, cfg in self.configs.items():
            self.ckpts[name] = cfg.create(trainer.world, trainer.run_dir)

    def on_step_end(self, trainer: Trainer, step: int) -> None:
        # Every period waits for its arm's work at the same step and the ranks
        # meet (placebo periods too), so the wait, charged to the arm, is the
        # slowest rank's, no work spills into the clean steps, and two
        # savers never write at once (Orbax is not safe for concurrent
        # saves in one process). The barrier sleeps, like the training's waits.
        drain = self._drain.get(step)
        if drain is not None:
            t = time.perf_counter()
            if drain != "none":
                self.ckpts[drain].wait()
            self.drained[step] = time.perf_counter() - t
            wait_all([self._comm.Ibarrier()])
        self.before[step] = time.perf_counter()
        if step == self.warm_saves_at:
            for ck in self.ckpts.values():
                ck.save(step, trainer.state, extra={"data": trainer.loader.position})
                ck.wait()
            for ck in self.ckpts.values():
                ck.records.pop(step, None)  # one-time costs, not measured
        arm = self._due.get(step)
        if arm is not None:
            saver = self.arms[arm][0]
            self.ckpts[saver].save(
                step, trainer.state, extra={"data": trainer.loader.position}
            )
        self.after[step] = time.perf_counter()
        r = self._round_end.get(step)
        if r is not None and trainer.world.rank == 0:
            total = trainer.total_steps
            spent = self.after[step] - self._t0
            left = spent * (total - step) / step
            print(
                f"r0 | round {r + 1}/{len(self._round_end)} done: step "
                f"{step}/{total}, {spent:.0f} s, about {left:.0f} s left",
                flush=True,
            )

    def on_train_end(self, trainer: Trainer) -> None:
        for ck in self.ckpts.values():
            ck.wait()


def _median(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _worst(records: list[dict], key: str) -> float | None:
    """Largest value among the ranks that have one (rank-0 savers: rank 0)."""
    vals = [r[key] for r in records if r[key] is not None]
    return max(vals) if vals else None


def run_interleaved(
    world: World,
    train: TrainConfig,
    configs: dict[str, CheckpointConfig],
    arms: dict[str, tuple[str, int]],
    *,
    rounds: int = 2,
    window: int = 10,
    settle: int = 5,
    warm: int = 6,
    minor: dict[str, int] | None = None,
    versus: str | None = "deepfreeze",
    restore: bool = True,
    seed: int = 0,
) -> dict[str, Any]:
    """Train once through the schedule; every rank returns the same results.

    Args:
      world: the job's world (collective).
      train: the training run; ``steps`` is set from the schedule.
      configs: one checkpoint configuration per saver (``resume`` ignored).
      arms: ``{arm: (saver, interval)}``; include ``"none": ("none", 0)``.
      rounds, window, settle, warm, minor, seed: see :func:`schedule`.
      versus: the saver every other is compared with (``diff_ci``).
      restore: time a restore of each saver's newest checkpoint afterwards.
    """
    configs = {
        n: dataclasses.replace(
            c,
            resume=False,
            directory=c.directory or str(Path(train.run_dir) / "checkpoints" / n),
        )
        for n, c in configs.items()
    }
    slots = schedule(
        arms,
        rounds=rounds,
        window=window,
        settle=settle,
        warm=warm,
        minor=minor,
        seed=seed,
    )
    train = dataclasses.replace(train, steps=slots[-1].start + window + 1)
    cb = Interleaved(configs, arms, slots, warm_saves_at=max(1, warm - 2))
    trainer = Trainer(train, world, callbacks=[cb])
    summary = trainer.run()
    periods, base, prof = _periods(world, cb, slots)
    vs = next((a for a, (s, i) in arms.items() if s == versus and i == window), None)
    stats = summarize(periods, window * base, versus=vs, seed=seed)
    out: dict[str, Any] = {
        "ranks": world.size,
        "model": train.model.name,
        "steps": train.steps,
        "median_step_s": summary["median_step_s"],
        "reference_step_s": base,
        "window": window,
        "settle": settle,
        "rounds": rounds,
        "versus": vs,
        "windows": periods,
        "profile": prof,
        "run_dir": train.run_dir,
        "arms": {},
        "savers": {},
    }
    for arm, (saver, interval) in arms.items():
        ws = [w for w in periods if w["arm"] == arm]
        st = stats[arm]
        out["arms"][arm] = {
            "saver": saver,
            "interval": interval,
            "periods": st["periods"],
            "overhead": st["overhead"],
            "overhead_ci90": st.get("ci"),
            "raw_overhead": st["raw_overhead"],
            "raw_ci90": st.get("raw_ci"),
            "diff_ci90": st.get("diff_ci"),
            "cost_s": st["cost_s"],
            "median_cost_s": st["median_cost_s"],
            "checkpoints_per_period": len(ws[0]["steps"]) if ws else 0,
            "blocking_s": _median([w["blocking_s"] for w in ws]),
            "drain_s": _median([w["drain_s"] for w in ws]),
        }
    for name, ck in cb.ckpts.items():
        out["savers"][name] = _saver_stats(world, name, ck, slots)
        ck.close()
        if restore:
            out["savers"][name]["restore_s"] = _time_restore(
                world, configs[name], trainer
            )
        _remove_checkpoints(world, ck)
    return out


def _periods(
    world: World, cb: Interleaved, slots: list[Slot]
) -> tuple[list[dict], float, dict]:
    """Every period's cost (``overhead.py``), the mean clean step, the profile."""
    gathered = world.allgather((cb.before, cb.after, cb.drained))
    # Steps as rank 0 sees them: the allreduce makes every rank wait for the
    # slowest, and the barrier after each wait puts the ranks level again.
    before, after = gathered[0][0], gathered[0][1]
    # Checkpoint calls and waits as the slowest rank paid them (for the table).
    call = {k: max(g[1][k] - g[0][k] for g in gathered) for k in after}
    drain = {k: max(g[2].get(k, 0.0) for g in gathered) for k in gathered[0][2]}
    periods = []
    for s in slots:
        d = s.start + s.charged
        periods.append(
            {
                **dataclasses.asdict(s),
                "steps": s.checkpoints,
                "seconds": before[s.start + s.window] - before[s.start],
                "blocking_s": sum(call[k] for k in s.checkpoints),
                "drain_s": drain.get(d, 0.0),
            }
        )
    periods, base = period_costs(before, periods)
    return periods, base, profile(before, periods)


def _saver_stats(
    world: World, key: str, ck: Checkpointer, slots: list[Slot]
) -> dict[str, Any]:
    """Per-checkpoint numbers of one saver, by interval, over every rank."""
    recs = world.allgather([dataclasses.asdict(r) for r in ck.records.values()])
    by_step: dict[int, list[dict]] = {}
    for rank_recs in recs:
        for r in rank_recs:
            by_step.setdefault(r["step"], []).append(r)
    interval_of = {
        k: s.interval
        for s in slots
        if s.saver == key
        for k in range(s.start, s.start + s.window)
    }
    out: dict[str, Any] = {
        "by_interval": {},
        "snapshot_mode": getattr(ck, "snapshot_mode", None),
    }
    for k, rs in by_step.items():
        d = out["by_interval"].setdefault(
            str(interval_of.get(k, 0)),
            {
                "blocking_s": [],
                "wait_s": [],
                "committed_s": [],
                "persisted_s": [],
                "skipped": 0,
                "stalled": 0,
                "checkpoints": 0,
                "bytes_per_rank": [[] for _ in range(world.size)],
                "writer_cpu_s": [],
                "writer_cpu_s_per_mb": [],
            },
        )
        d["checkpoints"] += 1
        # The training is synchronous: a checkpoint costs what its slowest rank pays.
        d["blocking_s"].append(max(r["blocking_s"] for r in rs))
        d["wait_s"].append(max(r["wait_s"] for r in rs))
        d["committed_s"].append(_worst(rs, "committed_s"))
        d["persisted_s"].append(_worst(rs, "persisted_s"))
        d["skipped"] += any(r["skipped"] for r in rs)
        d["stalled"] += any(r["wait_s"] > 0 for r in rs)
    for rank, rank_recs in enumerate(recs):
        for r in rank_recs:
            key = str(interval_of.get(r["step"], 0))
            if not r["skipped"]:
                d = out["by_interval"][key]
                d["bytes_per_rank"][rank].append(r["bytes_written"])
                # Per writing rank and checkpoint, on the writer's own CPU clock.
                if r.get("shard_bytes"):
                    d["writer_cpu_s"].append(r["writer_cpu_s"])
                    d["writer_cpu_s_per_mb"].append(
                        r["writer_cpu_s"] / (r["shard_bytes"] / 1e6)
                    )
    for d in out["by_interval"].values():
        for key in (
            "blocking_s",
            "wait_s",
            "committed_s",
            "persisted_s",
            "writer_cpu_s",
            "writer_cpu_s_per_mb",
        ):
            d["median_" + key] = _median(d[key])
        d["bytes_per_rank"] = [_median(b) or 0 for b in d["bytes_per_rank"]]
    return out


def _time_restore(world: World, cfg: CheckpointConfig, trainer: Trainer) -> float:
    """Slowest rank's time to restore the newest checkpoint with a new checkpointer."""
    fresh = cfg.create(world, trainer.run_dir)
    world.barrier()
    t0 = time.perf_counter()
    fresh.restore(trainer.state)
    dt = time.perf_counter() - t0
    fresh.close()
    return max(world.allgather(dt))


def _remove_checkpoints(world: World, ck: Checkpointer) -> None:
    """Free the tiers (the fast one is memory) once measured."""
    world.barrier()
    for tier in ck.tiers:
        shutil.rmtree(tier.rank_dir(world.rank), ignore_errors=True)
    world.barrier()
    if world.rank == 0:
        for tier in ck.tiers:
            shutil.rmtree(tier.root, ignore_errors=True)
