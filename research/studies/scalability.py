"""SC19 scalability study: the plan of configurations and one configuration's run.

A *point* is one training run (model, strategy, ranks, threads per rank, batch
per rank, link, injected delay, checkpoint interval); a *sweep* is a set of
points read together (``ranks`` strong and weak, ``threads``, ``batch``,
``straggler``, ``checkpoint``). :func:`plan` lists the points the flags ask for,
each once even when several sweeps share it (the weak-scaling point at 2 ranks
is also the 1x2 threads point and a batch point), tagged with its sweeps.
:func:`run_points` (under MPI, one world size and one thread count: one job)
trains each point a few steps with the timeline on and appends one row per
point to ``ROOT/results.jsonl``; ``research.studies.scalability_report`` reads
the rows back (from any number of run folders) into the table and figures.
``experiments.scalability`` is the entry point (paper, findings, commands).

Measured per point (rank 0's ``metrics.jsonl`` after ``warmup`` steps, medians):
step time, compute, communication and the compute thread's exposed waits
(as in ``research.studies.overlap``); from the trace (``research.trace_analysis``):
per-rank exposed communication, the straggler's lateness, the gaps between
weight updates and their free share, and for checkpointing points the share of
the background checkpoint work that ran outside every update (in the gaps).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
from pathlib import Path
from typing import Any

SWEEPS = ("ranks", "threads", "batch", "straggler", "checkpoint")
MODELS = ("nt3", "resnet50")
STRATEGIES = ("host", "layerwise", "overlap")

#: Laptop reductions (see experiments.scalability's docstring). NT3 keeps its
#: layers (Conv1D 128 k20, 128 k10, pool 10, dense 200-20) on 1,024 features
#: instead of 60,483 (2.7 M parameters instead of 155 M);
#: ResNet-50 keeps every layer on 32x32 inputs and 10 classes (23.5 M).
MODEL_SETTINGS: dict[str, dict[str, Any]] = {
    "nt3": {
        "model": "candle_nt3",
        "dataset": "synthetic_nt3",
        "model_options": {"features": 1024},
        "data_options": {"features": 1024},
    },
    "resnet50": {
        "model": "resnet50",
        "dataset": "synthetic_images",
        "model_options": {"image_size": 32, "stem": "imagenet"},
        "data_options": {"image_size": 32, "num_classes": 10},
    },
}
PAPER_SETTINGS: dict[str, dict[str, Any]] = {
    "nt3": {"model": "candle_nt3", "dataset": "synthetic_nt3"},
    "resnet50": {
        "model": "resnet50",
        "dataset": "synthetic_images",
        "model_options": {"image_size": 224},
        "data_options": {"image_size": 224, "num_classes": 1000},
    },
}


@dataclasses.dataclass(frozen=True)
class Point:
    """One configuration: a training run of ``steps`` steps on ``ranks`` ranks."""

    model: str
    strategy: str
    ranks: int
    threads: int = 1
    batch: int = 8
    link: str = "real"
    delay: float = 0.0
    ckpt_every: int = 0

    @property
    def id(self) -> str:
        """A file-name-safe name, unique per configuration."""
        parts = [self.model, self.strategy, f"np{self.ranks}", f"t{self.threads}"]
        parts.append(f"b{self.batch}")
        if self.link != "real":
            parts.append("L" + self.link.replace(":", "_"))
        if self.delay:
            parts.append(f"d{1e3 * self.delay:g}ms")
        if self.ckpt_every:
            parts.append(f"ck{self.ckpt_every}")
        return "-".join(parts)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Point:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in names})


def plan(cfg: Any) -> dict[str, tuple[Point, list[str]]]:
    """Point id -> (point, its sweep tags) for the flags in ``cfg``.

    Uses ``sweeps``, ``models``, ``strategies``, ``ranks``, ``batch_size``,
    ``batches``, ``delays``, ``straggler_link``, ``straggler_ranks``,
    ``checkpoint_every``, ``cores`` and ``scope``: ``full`` runs every sweep for
    every model; ``laptop`` runs them for the first model only and the others in
    the weak-scaling ranks sweep with host and overlap (every new batch size or
    strategy is a new compilation: 30-60 s for ResNet-50 here). Tags:
    ``ranks:strong``, ``ranks:weak``, ``threads``, ``batch``, ``straggler``,
    ``checkpoint``, ``baseline``.
    """
    out: dict[str, tuple[Point, list[str]]] = {}

    def add(p: Point, tag: str) -> None:
        out.setdefault(p.id, (p, []))[1].append(tag)

    b = cfg.batch_size
    for m in cfg.models:
        host1 = Point(m, "host", 1, batch=b)
        lean = cfg.scope == "laptop" and m != cfg.models[0]
        if "ranks" in cfg.sweeps:
            add(host1, "baseline")
            for n in cfg.ranks:
                for s in cfg.strategies:
                    if (n == 1 and s != "host") or (lean and s == "layerwise"):
                        continue  # no communication at 1 rank: host is the baseline
                    add(Point(m, s, n, batch=b), "ranks:weak")
                    if n > 1 and b % n == 0 and not lean:
                        add(Point(m, s, n, batch=b // n), "ranks:strong")
        if lean:
            continue
        if "threads" in cfg.sweeps:
            # Fixed cores: threads x ranks = cores, the global batch fixed.
            c = cfg.cores
            for t in (t for t in range(1, c + 1) if c % t == 0):
                n = c // t
                add(Point(m, "host", n, threads=t, batch=b * c // n), "threads")
        if "batch" in cfg.sweeps:
            n = 2 if 2 in cfg.ranks or not cfg.ranks else max(cfg.ranks)
            for bb in cfg.batches:
                add(Point(m, "host", n, batch=bb), "batch")
        if "straggler" in cfg.sweeps:
            n = cfg.straggler_ranks
            for s in cfg.strategies:
                for d in (0.0, *cfg.delays):
                    add(
                        Point(m, s, n, batch=b, link=cfg.straggler_link, delay=d),
                        "straggler",
                    )
        if "checkpoint" in cfg.sweeps:
            n = cfg.straggler_ranks
            for s in ("host", "overlap"):
                if s in cfg.strategies:
                    add(Point(m, s, n, batch=b), "checkpoint")
                    add(
                        Point(m, s, n, batch=b, ckpt_every=cfg.checkpoint_every),
                        "checkpoint",
                    )
    return out


def jobs(points: dict[str, tuple[Point, list[str]]]) -> dict[tuple[int, int], list]:
    """(ranks, threads) -> point ids: one MPI job each."""
    out: dict[tuple[int, int], list[str]] = {}
    for pid, (p, _) in points.items():
        out.setdefault((p.ranks, p.threads), []).append(pid)
    return dict(sorted(out.items()))


def steps_of(tags: list[str], cfg: Any) -> int:
    """Steps of a point: ``long_steps`` in the straggler and checkpoint sweeps
    (a delay or a save is a small signal in a median of a few noisy steps)."""
    long = {"straggler", "checkpoint"} & set(tags)
    return max(cfg.steps, cfg.long_steps) if long else cfg.steps


def train_config(p: Point, cfg: Any, run_dir: Path, steps: int | None = None):
    """The TrainConfig of point ``p`` (``steps``: default ``cfg.steps``)."""
    from research.train.config import (
        DataConfig,
        ModelConfig,
        RecordsConfig,
        StrategyConfig,
        TrainConfig,
        checkpointing,
    )

    s = (PAPER_SETTINGS if cfg.paper_scale else MODEL_SETTINGS)[p.model]
    data = {**s.get("data_options", {})}
    model_options = dict(s.get("model_options", {}))
    if p.model == "nt3" and getattr(cfg, "nt3_features", None):
        data["features"] = model_options["features"] = cfg.nt3_features
    data.update(n_train=max(64, 2 * p.batch * p.ranks), n_test=p.batch)
    return TrainConfig(
        model=ModelConfig(s["model"], model_options),
        data=DataConfig(name=s["dataset"], options=data),
        batch_size=p.batch,
        steps=steps or cfg.steps,
        eval_every=0,
        eval_batch_size=p.batch,
        records=RecordsConfig(log_every=1, trace=True),
        strategy=StrategyConfig(p.strategy, link=p.link),
        threads=p.threads,
        lr=0.01,
        warmup_steps=0,
        progress=False,
        checkpoint=checkpointing(
            "deepfreeze" if p.ckpt_every else "none", p.ckpt_every or 100, resume=False
        ),
        run_dir=str(run_dir),
    )


def step_samples(run_dir: Path, warmup: int) -> dict[str, list[float | None]]:
    """Rank 0's measured steps after ``warmup`` (``research.studies.overlap``'s)."""
    from research.studies.overlap import step_samples as samples

    return samples(run_dir, warmup)


def _timings(run_dir: Path, warmup: int) -> dict[str, Any]:
    """Rank 0's median step, compute, communication and exposed times."""
    from research.rundir import step_medians

    m = step_medians(run_dir, warmup)
    return {k: m[k] for k in ("step_s", "compute_s", "comm_s", "exposed_s")}


def _union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    from research.trace_analysis.intervals import union

    return union(iv)


def measure_trace(run_dir: Path, warmup: int) -> dict[str, Any]:
    """What the timeline says: stragglers, update gaps, background work in gaps."""
    from research.trace_analysis import analyze, load_events
    from research.trace_analysis.intervals import intersect, total
    from research.trace_analysis.metrics import parse_spans

    result = analyze(run_dir)
    (run_dir / "analysis.json").write_text(json.dumps(result, default=str))
    steps = [s for s in result["steps"] if s["step"] is not None and s["step"] > warmup]
    late = [s["late_s"] for s in steps if s.get("late_s") is not None]
    stages = result["stages"]
    gaps = [g for st in stages for g in (st["gap_median_s"],) if g is not None]
    free = [f for st in stages for f in (st["free_share_median"],) if f is not None]
    out: dict[str, Any] = {
        "late_median_s": statistics.median(late) if late else None,
        "straggler_counts": result["stragglers"].get("counts", {}),
        "gap_median_s": statistics.median(gaps) if gaps else None,
        "gap_max_s": max((st["gap_max_s"] or 0.0) for st in stages) if stages else None,
        "free_share_median": statistics.median(free) if free else None,
        "exposed_by_rank_s": [r["exposed_comm_s"] for r in result["ranks"]],
    }
    # Background checkpoint work: how much of it ran while no update ran (in the
    # gaps between updates, where DeepFreeze may capture weights) on its rank.
    # Blocking: the training thread's "checkpoint" spans (one per save), not the
    # wait for in-flight checkpoints at the end of the run.
    spans, _ = parse_spans(load_events(run_dir))
    bg = in_gaps = block = 0.0
    saves = 0
    parts: list[list[float]] = []  # per background span: [in the gaps, its length]
    for ss in spans.values():
        ups = _union([(s.start, s.end) for s in ss if s.track == "update"])
        work = _union([(s.start, s.end) for s in ss if s.track == "checkpoint-bg"])
        bg += total(work)
        in_gaps += total(work) - total(intersect(work, ups))
        for piece in work:
            length = piece[1] - piece[0]
            parts.append([length - total(intersect([piece], ups)), length])
        mine = [s for s in ss if s.track == "checkpoint" and s.name == "checkpoint"]
        block += sum(s.end - s.start for s in mine)
        saves += len(mine)
    out.update(
        ckpt_saves=saves // max(1, len(spans)),
        ckpt_bg_s=bg / saves if saves else None,
        ckpt_bg_in_gaps=(in_gaps / bg) if bg > 0 else None,
        ckpt_block_s=block / saves if saves else None,
        ckpt_bg_parts=parts,
        free_shares=free_shares(spans, warmup),
    )
    return out


def free_shares(spans: dict[int, list], warmup: int) -> list[float]:
    """Every stage's update-to-update intervals on every rank after ``warmup``
    steps: the share of each in which none of the stage's updates ran
    (``research.trace_analysis.metrics``' free share, each one kept)."""
    by: dict[tuple[int, str], list] = {}
    for r, ss in spans.items():
        for s in ss:
            step = s.args.get("step")  # 0-based on the timeline: 0..warmup-1 out
            if s.track == "update" and (step is None or step >= warmup):
                by.setdefault((r, str(s.args.get("stage", "model"))), []).append(s)
    out = []
    for ups in by.values():
        ups.sort(key=lambda s: s.start)
        for a, b in zip(ups, ups[1:]):
            if b.end > a.end:
                out.append((b.start - a.end) / (b.end - a.end))
    return out


def run_point(p: Point, tags: list[str], cfg: Any, root: Path, world: Any) -> dict:
    """Train point ``p`` on this world; rank 0 appends its row to results.jsonl."""
    from research.imbalance import FixedImbalance
    from research.train.loop import Trainer
    from research.train.report import link_label

    if world.size != p.ranks:
        raise ValueError(
            f"point {p.id} wants {p.ranks} ranks, the job has {world.size}"
        )
    run_dir = root / p.id
    steps = steps_of(tags, cfg)
    run = train_config(p, cfg, run_dir, steps)
    # The straggler: the last rank, from the first measured step on, held after
    # its backward pass (where every strategy holds it), spinning: a sleeping
    # rank would hand its core to the others on a shared machine and speed
    # them up (research.imbalance), which a busier rank on a node of its own
    # does not.
    imbalance = None
    if p.delay:
        imbalance = FixedImbalance([p.ranks - 1], p.delay, start=cfg.warmup, how="spin")
    trainer = Trainer(run, world, imbalance=imbalance)
    trainer.run()
    world.barrier()  # every rank's trace part written
    row: dict[str, Any] = {"id": p.id, "tags": tags, **dataclasses.asdict(p)}
    if world.rank == 0:
        row["steps"] = steps
        row["warmup"] = cfg.warmup
        row["paper_scale"] = bool(cfg.paper_scale)
        row["nodes"] = world.nodes
        row["link_label"] = link_label(p.link, world)
        row.update(_timings(run_dir, cfg.warmup))
        row["samples"] = step_samples(run_dir, cfg.warmup)
        row.update(measure_trace(run_dir, cfg.warmup))
        with open(root / "results.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        step = row["step_s"] or 0.0
        print(
            f"r0 | {p.id}: step {1e3 * step:.1f} ms, "
            f"{p.ranks * p.batch / step if step else 0:.1f} samples/s",
            flush=True,
        )
        if p.ckpt_every:  # the checkpoints themselves are not a result here
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    world.barrier()
    return row


def run_points(ids: list[str], cfg: Any, root: Path, world: Any) -> None:
    """Every point of ``ids`` (from :func:`plan`) that this job's size runs."""
    points = plan(cfg)
    unknown = [i for i in ids if i not in points]
    if unknown:
        raise ValueError(f"unknown point {unknown[0]!r} for these flags")
    for pid in ids:
        p, tags = points[pid]
        run_point(p, tags, cfg, root, world)
