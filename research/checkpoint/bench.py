"""Measure checkpointing strategies inside one training run, interleaved.

Comparing whole runs one after another is hopeless on a shared machine: the
same run without checkpoints took 17 s and 71 s here minutes apart. So one
training run (a :class:`~research.train.loop.Trainer`) carries every strategy:
the steps are cut into windows of ``window`` steps, each window belongs to one
``(strategy, interval)`` arm (``none`` windows are the reference), an arm
checkpoints every ``interval`` steps of its window, and a gap of ``gap`` steps
without checkpoints follows each arm's window so that background work left
over (a flush) is charged to the arm that caused it; whatever is still in
flight at the end of the gap is waited for there, and charged too. Arms come
in a shuffled order per round, so slow drifts of the machine's load hit every
arm alike.

Even so, single steps here vary from 50 to 900 ms (other users' jobs), and
window totals by 2x, which buries a few percent. The cost of a window is
therefore split in two robust parts: the time the training thread spent in
checkpoint calls and in the final wait (slowest rank; exact), plus the change
of the *median* step time against the reference windows (each step compared
with its own round's reference median, all the arm's steps pooled), times the
steps of window and gap: the slowdown from background work, immune to the
occasional stalled step. An arm's overhead is its median blocking per window
plus that slowdown, over the reference time of ``window`` steps. The plain
difference of window totals is kept as ``raw_overhead``.
Blocking time, time until committed and bytes written are measured per
checkpoint; restore time once per strategy after training. Before measuring,
each strategy writes one checkpoint to pay its one-time costs (Orbax set-up,
compilation of the device copy).
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from research.checkpoint.base import Checkpointer
from research.checkpoint.config import CheckpointConfig
from research.comm.world import World
from research.train.config import TrainConfig
from research.train.loop import Callback, Trainer


@dataclasses.dataclass(frozen=True)
class Slot:
    """Steps ``(start, start + window]`` belong to ``arm``; ``gap`` steps follow."""

    arm: str
    strategy: str
    interval: int
    start: int
    window: int
    gap: int
    round: int


def schedule(
    arms: dict[str, tuple[str, int]],
    *,
    rounds: int,
    window: int,
    gap: int,
    warm: int,
    reference_every: int = 4,
    seed: int = 0,
) -> list[Slot]:
    """Shuffled rounds of arm windows, with reference (``none``) windows among them.

    Args:
      arms: ``{arm: (strategy, interval)}``; arms named ``none*`` are references.
      rounds: how many times each arm is measured.
      window, gap: steps per window and per following gap.
      warm: steps before the first window (compilation, one-time costs).
      reference_every: a reference window after every this many arm windows.
      seed: shuffling seed (the same on every rank).
    """
    rng = random.Random(seed)
    slots: list[Slot] = []
    step = warm
    names = [a for a in arms if a != "none"]
    for r in range(rounds):
        order = names[:]
        rng.shuffle(order)
        seq = ["none"]
        for i, a in enumerate(order, 1):
            seq.append(a)
            if i % reference_every == 0 and i < len(order):
                seq.append("none")
        for a in seq:
            strategy, interval = arms.get(a, ("none", 0))
            slots.append(Slot(a, strategy, interval, step, window, gap, r))
            step += window + gap
    return slots


class Interleaved(Callback):
    """Runs the schedule: saves with the active arm's checkpointer, times windows."""

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
        self.before: dict[int, float] = {}  # step end, before checkpointing
        self.after: dict[int, float] = {}  # after this step's checkpoint
        self.drained: dict[int, float] = {}  # waits for an arm's leftover work
        self._due: dict[int, str] = {}
        self._drain: dict[int, str] = {}
        for s in slots:
            if s.strategy != "none":
                for k in range(s.start, s.start + s.window, s.interval):
                    self._due[k] = s.arm
                self._drain[s.start + s.window + s.gap] = s.strategy
        # Progress: rank 0 prints a line as each round of windows ends.
        self._round_end = {
            max(s.start + s.window + s.gap for s in slots if s.round == r): r
            for r in {s.round for s in slots}
        }
        self._t0 = 0.0

    def on_train_start(self, trainer: Trainer) -> None:
        self._t0 = time.perf_counter()
        for name, cfg in self.configs.items():
            self.ckpts[name] = cfg.create(trainer.world, trainer.run_dir)

    def on_step_end(self, trainer: Trainer, step: int) -> None:
        # An arm's background work is finished at the end of its gap and the
        # wait charged to it: no arm pays for another, and two strategies never
        # write at once (Orbax is not safe for concurrent saves in one process).
        drain = self._drain.get(step)
        if drain is not None:
            t = time.perf_counter()
            self.ckpts[drain].wait()
            self.drained[step] = time.perf_counter() - t
        self.before[step] = time.perf_counter()
        if step == self.warm_saves_at:
            for ck in self.ckpts.values():
                ck.save(step, trainer.state, extra={"data": trainer.loader.position})
                ck.wait()
            for ck in self.ckpts.values():
                ck.records.pop(step, None)  # one-time costs, not measured
        arm = self._due.get(step)
        if arm is not None:
            strategy = self.arms[arm][0]
            self.ckpts[strategy].save(
                step, trainer.state, extra={"data": trainer.loader.position}
            )
        self.after[step] = time.perf_counter()
        r = self._round_end.get(step)
        if r is not None and trainer.world.rank == 0:
            total = trainer.total_steps
            spent = self.after[step] - self._t0
            left = spent * (total - step) / step
            print(
                f"r0 | round {r + 1}/{len(self._round_end)} of windows done: step "
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
    """Largest value among the ranks that have one (rank-0 strategies: rank 0)."""
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
    gap: int = 5,
    warm: int = 6,
    restore: bool = True,
    seed: int = 0,
) -> dict[str, Any]:
    """Train once through the schedule; every rank returns the same results.

    Args:
      world: the job's world (collective).
      train: the training run; ``steps`` is set from the schedule.
      configs: one checkpoint configuration per strategy (``resume`` ignored).
      arms: ``{arm: (strategy, interval)}``; include ``"none": ("none", 0)``.
      rounds, window, gap, warm, seed: see :func:`schedule`.
      restore: time a restore of each strategy's newest checkpoint afterwards.
    """
    configs = {
        n: dataclasses.replace(
            c,
            resume=False,
            directory=c.directory or str(Path(train.run_dir) / "checkpoints" / n),
        )
        for n, c in configs.items()
    }
    slots = schedule(arms, rounds=rounds, window=window, gap=gap, warm=warm, seed=seed)
    train = dataclasses.replace(train, steps=slots[-1].start + window + gap + 1)
    cb = Interleaved(configs, arms, slots, warm_saves_at=max(1, warm - gap))
    trainer = Trainer(train, world, callbacks=[cb])
    summary = trainer.run()
    windows, base = _windows(world, cb, slots, rounds)
    out: dict[str, Any] = {
        "ranks": world.size,
        "model": train.model,
        "steps": train.steps,
        "median_step_s": summary["median_step_s"],
        "reference_step_s": base,
        "window": window,
        "gap": gap,
        "rounds": rounds,
        "windows": windows,
        "run_dir": train.run_dir,
        "arms": {},
        "strategies": {},
    }
    for arm, (strategy, interval) in arms.items():
        ws = [w for w in windows if w["arm"] == arm]
        # Pooling every step of the arm's windows (rounds x (window + gap))
        # before taking the median makes the slowdown far less noisy than a
        # median of per-window medians.
        cost = _arm_cost(ws, window, gap)
        lo, hi = _bootstrap(ws, window, gap, seed)
        out["arms"][arm] = {
            "strategy": strategy,
            "interval": interval,
            "overhead": cost / (window * base),
            "overhead_ci90": [lo / (window * base), hi / (window * base)],
            "raw_overhead": _median([w["raw_overhead"] for w in ws]),
            "cost_s": cost,
            "blocking_s": _median([w["blocking_s"] for w in ws]),
            "slowdown_s": _median([d for w in ws for d in w["step_deltas"]]),
        }
    for name, ck in cb.ckpts.items():
        out["strategies"][name] = _strategy_stats(world, name, ck, slots)
        ck.close()
        if restore:
            out["strategies"][name]["restore_s"] = _time_restore(
                world, configs[name], trainer
            )
        _remove_checkpoints(world, ck)
    return out


def _arm_cost(ws: list[dict], window: int, gap: int) -> float:
    """Median blocking per window + pooled median slowdown x (window + gap)."""
    slower = _median([d for w in ws for d in w["step_deltas"]]) or 0.0
    return (_median([w["blocking_s"] for w in ws]) or 0.0) + slower * (window + gap)


def _bootstrap(
    ws: list[dict], window: int, gap: int, seed: int, n: int = 300
) -> tuple[float, float]:
    """5th and 95th percentiles of the arm's cost, resampling its windows."""
    if len(ws) < 2:
        c = _arm_cost(ws, window, gap)
        return c, c
    rng = random.Random(seed)
    costs = sorted(_arm_cost(rng.choices(ws, k=len(ws)), window, gap) for _ in range(n))
    return costs[int(0.05 * n)], costs[int(0.95 * n) - 1]


def _windows(
    world: World, cb: Interleaved, slots: list[Slot], rounds: int
) -> tuple[list[dict], float]:
    """Cost and overhead of every window (see the module docstring)."""
    gathered = world.allgather((cb.before, cb.after, cb.drained))
    before, after = gathered[0][0], gathered[0][1]
    # Steps as rank 0 sees them, without the checkpoint calls: the allreduce
    # makes every rank wait for the slowest, so one rank's view is the step's.
    step = {k: before[k + 1] - after[k] for k in after if k + 1 in before}
    # Checkpoint calls and drains cost what the slowest rank paid.
    call = {k: max(g[1][k] - g[0][k] for g in gathered) for k in after}
    drain = {k: max(g[2].get(k, 0.0) for g in gathered) for k in gathered[0][2]}

    def steps_of(s: Slot) -> list[float]:
        return [
            step[k] for k in range(s.start, s.start + s.window + s.gap) if k in step
        ]

    ref = {
        r: statistics.median(
            [x for s in slots if s.round == r and s.arm == "none" for x in steps_of(s)]
        )
        for r in range(rounds)
    }
    total = {s: before[s.start + s.window + s.gap] - before[s.start] for s in slots}
    ref_total = {
        r: statistics.fmean(
            v for s, v in total.items() if s.round == r and s.arm == "none"
        )
        for r in range(rounds)
    }
    out = []
    for s in slots:
        end = s.start + s.window + s.gap
        blocking = sum(
            call[k] for k in range(s.start, s.start + s.window) if s.strategy != "none"
        ) + drain.get(end, 0.0)
        slower = statistics.median(steps_of(s)) - ref[s.round]
        cost = blocking + slower * (s.window + s.gap)
        raw = total[s] - ref_total[s.round]
        out.append(
            {
                **dataclasses.asdict(s),
                "seconds": before[end] - before[s.start],
                "blocking_s": blocking,
                "slowdown_s": slower,
                "cost_s": cost,
                "overhead": cost / (s.window * ref[s.round]),
                "raw_overhead": raw / (s.window * ref[s.round]),
                # Each step against its round's reference, pooled per arm.
                "step_deltas": [x - ref[s.round] for x in steps_of(s)],
            }
        )
    return out, statistics.fmean(ref.values())


def _strategy_stats(
    world: World, key: str, ck: Checkpointer, slots: list[Slot]
) -> dict[str, Any]:
    """Per-checkpoint numbers of one strategy, by interval, over every rank."""
    recs = world.allgather([dataclasses.asdict(r) for r in ck.records.values()])
    by_step: dict[int, list[dict]] = {}
    for rank_recs in recs:
        for r in rank_recs:
            by_step.setdefault(r["step"], []).append(r)
    interval_of = {
        k: s.interval
        for s in slots
        if s.strategy == key
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
