"""SC18 overlap study: host, fused, layerwise and overlap side by side.

``run_point`` (under MPI, one world size) trains each model a few steps with
each strategy, on the real link and on an emulated one, and rank 0 appends one
row per run to ``results.jsonl``, its measured steps with it; ``report`` prints
one table per model and the issue's benchmark targets as checks, decided on
intervals over those steps (:mod:`research.studies.overlap_page`).
``experiments.overlap`` is the entry point (its docstring: paper, claims,
commands, measured table).
``plan`` says which runs a world size gets (one rank: the serial baseline and
overlap; emulated links and layerwise's bucket sweep only where asked);
``load_rows`` re-reads a folder (a rerun counts once; timings can be re-derived
with another warmup); ``figures`` draws the step breakdown, the speedup and one
overlap step's timeline (``research.plots``).

Measured per run (rank 0's ``metrics.jsonl``, steps after ``warmup``, medians):
step time; compute (the compute thread's forward and backward: the whole step
for ``fused``, whose allreduce is inside its program); communication (``host``:
its blocking allreduce; ``layerwise``/``overlap``: time with at least one
collective in flight, ``research.steps.flat.busy_time``); exposed
communication (the compute thread's waits); hidden fraction = 1 - exposed / comm.
Each row records its nodes and its link's label; the targets are checked on
every emulated link (``auto`` or a spec) and on the real link where the ranks
span several nodes (a network: ``--hosts``), while on shared memory overlap
against host is only reported.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

STRATEGIES = ("host", "fused", "layerwise", "overlap", "overlap-fcx")
#: What the default runs: the fc exchange is information only, on request.
DEFAULT_STRATEGIES = STRATEGIES[:4]
#: Strategies that run on an emulated link (fused communicates inside XLA).
LINKED = ("host", "layerwise", "overlap", "overlap-fcx")
#: ``overlap`` with the FC-activation exchange (option ``fc_exchange``), run
#: only for these models (VGG-16: its fc 4096-4096; elsewhere the dense
#: layer is a small classifier and the runs would repeat ``overlap``'s).
FC_EXCHANGE_MODELS = ("vgg16",)
#: On one rank: the serial baseline (efficiency is against it) and overlap's
#: own single-rank cost (its packing and sharded update without communication).
ONE_RANK = ("host", "overlap")
#: layerwise's bucket outside the sweep: PyTorch DDP's default, MiB.
DEFAULT_BUCKET_MB = 25.0

#: Reduced defaults: the full models (every conv, VGG's fc 4096-4096) on 32x32
#: inputs, so that a step's compute is small next to its ~100 MB of gradients.
MODELS: dict[str, dict[str, Any]] = {
    "vgg16": {"image_size": 32, "pooled_size": 1},
    "resnet50": {"image_size": 32, "stem": "imagenet"},
}
PAPER_MODELS: dict[str, dict[str, Any]] = {
    "vgg16": {"image_size": 224},
    "resnet50": {"image_size": 224},
}


def label(strategy: str, bucket_mb: float | None) -> str:
    """Table name of a run: layerwise outside DDP's bucket shows its size."""
    if strategy != "layerwise" or bucket_mb in (None, DEFAULT_BUCKET_MB):
        return strategy
    return f"lw {bucket_mb:g}MB"


def run_config(
    cfg: Any,
    model: str,
    strategy: str,
    link: str,
    run_dir: Path | None,
    bucket_mb: float | None = None,
):
    """The TrainConfig of one run (``run_dir`` None: none, for the checks)."""
    from research.train.config import (
        DataConfig,
        ModelConfig,
        RecordsConfig,
        StrategyConfig,
        TrainConfig,
    )

    options = (PAPER_MODELS if cfg.paper_scale else MODELS).get(model, {})
    options = {**options, "image_size": cfg.image_size}
    strategy_options = {}
    if strategy == "overlap-fcx":
        strategy, strategy_options = "overlap", {"fc_exchange": True}
    if strategy == "layerwise":
        mb = DEFAULT_BUCKET_MB if bucket_mb is None else bucket_mb
        strategy_options["bucket_bytes"] = int(mb * 2**20)
    data = {  # random images; their classes and count are ours to set
        "image_size": cfg.image_size,
        "num_classes": cfg.num_classes,
        "n_train": max(64, cfg.batch_size * 8),
        "n_test": cfg.batch_size,
    }
    if cfg.dataset != "synthetic_images":  # on disk: the files fix the classes
        data = {**cfg.data_options, "image_size": cfg.image_size}
    on = DataConfig(cfg.dataset, cfg.data_dir, data, cfg.data_workers)
    return TrainConfig(
        model=ModelConfig(model, options),
        data=on,
        batch_size=cfg.batch_size,
        steps=cfg.steps,
        eval_every=0,
        eval_batch_size=cfg.batch_size,
        records=RecordsConfig(log_every=1, trace=cfg.trace),
        strategy=StrategyConfig(strategy, strategy_options, link),
        lr=0.01,
        warmup_steps=0,
        progress=False,
        run_dir="" if run_dir is None else str(run_dir),
    )


#: The per-step keys a row keeps (``samples``): metrics.jsonl's, as named here.
SAMPLES = {
    "step_s": "step_time",
    "compute_s": "compute_s",
    "comm_s": "comm_busy_s",
    "exposed_s": "comm_exposed_s",
}


def step_samples(run_dir: Path, warmup: int) -> dict[str, list[float | None]]:
    """Rank 0's steps after ``warmup`` of a run's ``metrics.jsonl``, per key:
    what the page's medians and their intervals are computed from."""
    from research.rundir import read_metrics

    rows = [r for r in read_metrics(run_dir) if not r.get("kind")]
    rows = [r for r in rows if r["step"] > warmup] or rows
    return {k: [r.get(m) for r in rows] for k, m in SAMPLES.items()}


def _timing(run_dir: Path, warmup: int) -> dict[str, Any]:
    """Medians over the steps after ``warmup`` of a run's ``metrics.jsonl``,
    and those steps (``samples``)."""
    from research.rundir import step_medians

    m = step_medians(run_dir, warmup)
    comm, exposed = m["comm_s"], m["exposed_s"]
    m["hidden"] = None if not comm else max(0.0, 1.0 - (exposed or 0.0) / comm)
    m["samples"] = step_samples(run_dir, warmup)
    m["warmup"] = warmup
    return m


def _measure(trainer: Any, warmup: int) -> dict[str, Any]:
    from research.steps.state import tree_bytes

    strategy = trainer.strategy
    opt = getattr(strategy, "opt_bytes", 0) or tree_bytes(trainer.state.opt_state)
    stages = getattr(strategy, "stages", ())
    grad = tree_bytes(trainer.state.params)
    biggest = max(
        (tree_bytes(s.params(trainer.state.params)) for s in stages), default=grad
    )
    import statistics

    waits = trainer.data_waits[warmup:] or trainer.data_waits
    return {
        **_timing(trainer.run_dir, warmup),
        # Rank 0's input wait (in the step time): ~0 on random images.
        "data_wait_s": statistics.median(waits) if waits else None,
        "opt_bytes": int(opt),
        "grad_bytes": int(grad),
        "biggest_stage_share": biggest / grad,
    }


def emulated_link(compute_s: float, grad_bytes: int, size: int) -> str:
    """A link on which a ring allreduce of ``grad_bytes`` takes ``compute_s``
    (the link model's: headers and summing included, ``research.comm.link``)."""
    from research.comm.link import PAYLOAD, SUM_BYTES_PER_S

    part = (size - 1) / size * grad_bytes
    # The summing is the host's; the rest is the wire's (at least a tenth).
    wire_s = max(compute_s - part / SUM_BYTES_PER_S, compute_s / 10)
    return f"{2 * part * 8 / PAYLOAD / wire_s / 1e9:.4f}gbps"


def plan(
    cfg: Any, size: int, model: str | None = None
) -> list[tuple[str, str, float | None]]:
    """``(link kind, strategy, bucket MiB)`` of every run at this world size.

    One rank: ``ONE_RANK`` on the real link. Emulated links only at
    ``cfg.emulated_ranks``; layerwise's bucket sweep (``cfg.bucket_mb``) only
    on the emulated link(s) at ``cfg.sweep_ranks`` for ``cfg.sweep_models``,
    DDP's 25 MiB elsewhere;
    ``overlap-fcx`` only for ``FC_EXCHANGE_MODELS`` (any ``model`` if None).
    """
    runs = []
    for link_kind in cfg.links:
        emulated = link_kind != "real"
        if emulated and (size == 1 or size not in cfg.emulated_ranks):
            continue
        for strategy in cfg.strategies:
            if (size == 1 and strategy not in ONE_RANK) or (
                emulated and strategy not in LINKED
            ):
                continue
            if strategy == "overlap-fcx" and model not in (None, *FC_EXCHANGE_MODELS):
                continue
            buckets: list[float | None] = [None]
            if strategy == "layerwise":
                sweep = emulated and size in cfg.sweep_ranks
                sweep = sweep and model in (None, *cfg.sweep_models)
                buckets = list(cfg.bucket_mb) if sweep else [DEFAULT_BUCKET_MB]
            runs += [(link_kind, strategy, b) for b in buckets]
    return runs


def run_point(cfg: Any, root: Path, world: Any) -> None:
    """Every model, link and strategy at this world size; rank 0 appends rows."""
    from research.train.loop import Trainer
    from research.train.report import link_label

    for model in cfg.models:
        # "auto": the link on which host's allreduce takes as long as its
        # compute did on the real link (measured first, in this job).
        links = ["real"]
        for link_kind, strategy, bucket_mb in plan(cfg, world.size, model):
            link = "real"
            if link_kind == "auto":
                link = world.bcast(links[-1] if world.rank == 0 else None)
            elif link_kind != "real":
                link = link_kind
            tag = label(strategy, bucket_mb).replace(" ", "")
            name = f"{model}-{tag}-{link_kind}-np{world.size}"
            run_dir = root / name
            if world.rank == 0 and run_dir.exists():
                # A rerun into the folder replaces the run (its metrics.jsonl
                # is appended to, so old steps would mix in).
                shutil.rmtree(run_dir)
            world.barrier()
            run = run_config(cfg, model, strategy, link, run_dir, bucket_mb)
            trainer = Trainer(run, world)
            trainer.run()
            row = {
                "model": model,
                "strategy": strategy,
                "label": label(strategy, bucket_mb),
                "bucket_mb": bucket_mb,
                "ranks": world.size,
                "nodes": world.nodes,
                "link": link,
                "link_kind": link_kind,
                "link_label": link_label(link, world),
                "run": name,
                **_measure(trainer, cfg.warmup),
            }
            if strategy == "host" and link_kind == "real" and world.size > 1:
                links.append(
                    emulated_link(row["compute_s"], row["grad_bytes"], world.size)
                )
            if world.rank == 0:
                with open(root / "results.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(
                    f"r0 | {name}: step {1e3 * row['step_s']:.1f} ms (link {link})",
                    flush=True,
                )
            world.barrier()


def load_rows(root: Path, warmup: int | None = None) -> list[dict[str, Any]]:
    """The rows of ``root/results.jsonl``, each run once.

    A run measured twice (a job rerun into the same folder) counts once, the
    later row. With ``warmup``, timings are re-derived from each run's
    ``metrics.jsonl`` leaving out that many steps.
    """
    from research.studies.overlap_page import read_results, unique

    rows = unique(read_results(root))
    if warmup is not None:
        rows = [
            {**r, **_timing(Path(root) / r["run"], warmup)} if r.get("run") else r
            for r in rows
        ]
    return rows


def report(root: Path, models: list[str], warmup: int | None = None) -> str:
    """Tables and checks from ``root/results.jsonl`` (the page's part of the
    run, :mod:`research.studies.overlap_page`), also written to ``table.md``.
    With ``warmup``, the rows are derived again leaving out that many steps
    and ``results.jsonl`` rewritten with them."""
    from research.studies.overlap_page import render

    root = Path(root)
    if warmup is not None:
        rows = load_rows(root, warmup)
        (root / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = "\n".join(render(root))
    (root / "table.md").write_text(text + "\n")
    return text


def figures(root: Path, warmup: int | None = None) -> list[Path]:
    """Step-time breakdown, speedup, and one overlap step's timeline per model.

    The timeline is the traced ``overlap`` run with the most ranks (an emulated
    link before the real one); written next to ``results.jsonl``.
    """
    from research.plots import plot_speedup, plot_step_breakdown, plot_timeline

    root = Path(root)
    rows = [r for r in load_rows(root, warmup) if r.get("step_s")]
    if not rows:
        return []
    out = [
        plot_step_breakdown(rows, root / "breakdown.png"),
        plot_speedup(rows, root / "speedup.png"),
    ]
    for model in sorted({r["model"] for r in rows}):
        runs = [
            r
            for r in rows
            if r["model"] == model and r["strategy"] == "overlap" and r.get("run")
        ]
        if runs:
            r = max(runs, key=lambda r: (r["ranks"], r["link_kind"] != "real"))
            path = plot_timeline(root / r["run"], root / f"timeline-{model}.png")
            if path is not None:
                out.append(path)
    return out
