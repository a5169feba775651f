"""SC18 overlap study: host, fused, layerwise and overlap side by side.

``run_point`` (under MPI, one world size) trains each model a few steps with
each strategy, on the real link and on an emulated one, and rank 0 appends one
row per run to ``results.jsonl``; ``report`` reads every row and prints one table
per model and the issue's benchmark targets as checks. ``experiments.overlap``
is the entry point (its docstring: paper, claims, commands, measured table).
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


def _config(
    cfg: Any,
    model: str,
    strategy: str,
    link: str,
    run_dir: Path,
    bucket_mb: float | None = None,
):
    from research.train.config import TrainConfig

    options = (PAPER_MODELS if cfg.paper_scale else MODELS).get(model, {})
    options = {**options, "image_size": cfg.image_size}
    strategy_options = {}
    if strategy == "overlap-fcx":
        strategy, strategy_options = "overlap", {"fc_exchange": True}
    if strategy == "layerwise":
        mb = DEFAULT_BUCKET_MB if bucket_mb is None else bucket_mb
        strategy_options["bucket_bytes"] = int(mb * 2**20)
    return TrainConfig(
        model=model,
        model_options=options,
        dataset="synthetic_images",
        data_options={
            "image_size": cfg.image_size,
            "num_classes": cfg.num_classes,
            "n_train": max(64, cfg.batch_size * 8),
            "n_test": cfg.batch_size,
        },
        batch_size=cfg.batch_size,
        steps=cfg.steps,
        eval_every=0,
        eval_batch_size=cfg.batch_size,
        log_every=1,
        strategy=strategy,
        strategy_options=strategy_options,
        link=link,
        lr=0.01,
        warmup_steps=0,
        progress=False,
        trace=cfg.trace,
        run_dir=str(run_dir),
    )


def _timing(run_dir: Path, warmup: int) -> dict[str, Any]:
    """Medians over the steps after ``warmup`` of a run's ``metrics.jsonl``."""
    from research.rundir import step_medians

    m = step_medians(run_dir, warmup)
    comm, exposed = m["comm_s"], m["exposed_s"]
    m["hidden"] = None if not comm else max(0.0, 1.0 - (exposed or 0.0) / comm)
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
    return {
        **_timing(trainer.run_dir, warmup),
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
            run = _config(cfg, model, strategy, link, run_dir, bucket_mb)
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


def read_results(root: Path) -> list[dict[str, Any]]:
    path = Path(root) / "results.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{1e3 * v:.1f}"


def _name(row: dict[str, Any]) -> str:
    return row.get("label", row["strategy"])


def format_table(rows: list[dict[str, Any]], model: str) -> str:
    rows = [r for r in rows if r["model"] == model]
    by = {(_name(r), r["ranks"], r["link_kind"]): r for r in rows}
    head = (
        f"{model}\nstrategy   ranks link    step ms  compute  comm ms  hidden  "
        "exposed  vs host  eff(1)  opt MB/rank"
        "\n(eff(1): host's step on 1 rank / this step, batch per rank fixed)"
    )
    lines = [head]
    order = {s: i for i, s in enumerate(STRATEGIES)}
    for r in sorted(
        rows,
        key=lambda r: (
            r["link_kind"] != "real",
            r["link_kind"],
            r["ranks"],
            order.get(r["strategy"], 9),
            r.get("bucket_mb") or 0,
        ),
    ):
        host = by.get(("host", r["ranks"], r["link_kind"]))
        one = by.get(("host", 1, "real"))
        speed = host["step_s"] / r["step_s"] if host else None
        eff = one["step_s"] / r["step_s"] if one else None
        hidden = "-" if r["hidden"] is None else f"{100 * r['hidden']:.0f}%"
        lines.append(
            f"{_name(r):<10} {r['ranks']:>5} {r['link_kind']:<6} "
            f"{_ms(r['step_s']):>8} {_ms(r['compute_s']):>8} {_ms(r['comm_s']):>8} "
            f"{hidden:>7} {_ms(r['exposed_s']):>8} "
            f"{'-' if speed is None else f'{speed:.2f}x':>8} "
            f"{'-' if eff is None else f'{eff:.2f}':>7} "
            f"{r['opt_bytes'] / 2**20:>11.1f}"
        )
    links = sorted({r["link"] for r in rows if r["link_kind"] != "real"})
    if links:
        lines.append(f"emulated link(s): {', '.join(links)}")
    real = sorted(
        {
            (r["ranks"], r["link_label"])
            for r in rows
            if r["link_kind"] == "real" and r.get("link_label") and r["ranks"] > 1
        }
    )
    for p, text in real:
        lines.append(f"real link at {p} ranks: {text}")
    return "\n".join(lines)


def _network(row: dict[str, Any]) -> bool:
    """Whether a real-link row's ranks spanned several nodes (bytes crossed a
    network, not shared memory); rows written before nodes were recorded: no."""
    return row["link_kind"] == "real" and (row.get("nodes") or 1) > 1


def _where(kind: str, row: dict[str, Any]) -> str:
    """How a check names the link of ``row``: ``emulated`` (``auto``), the
    emulated link's spec, or the real network and its nodes."""
    if kind == "auto":
        return "emulated"
    if kind == "real":
        return f"real network, {row['nodes']} nodes"
    return f"emulated {kind}"


def _claims(by: dict, p: int, kind: str, top: int, out: list[str]) -> None:
    """The issue's targets for ``p`` ranks on link ``kind`` (``top``: the most
    ranks on that link, where the speed-up target applies)."""
    ov = by.get(("overlap", p, kind))
    host = by.get(("host", p, kind))
    lw = by.get(("layerwise", p, kind))
    if ov is None or ov["comm_s"] is None:
        return
    where = _where(kind, ov)

    def check(ok: bool, text: str) -> None:
        out.append(f"  [{'PASS' if ok else 'FAIL'}] {p} ranks, {where}: {text}")

    check(
        (ov["hidden"] or 0) >= 0.8,
        f"overlap hides >= 80% of communication ({100 * (ov['hidden'] or 0):.0f}%)",
    )
    bound = (
        1.1 * max(ov["compute_s"], ov["comm_s"])
        + ov["comm_s"] * (ov["biggest_stage_share"])
    )
    check(
        ov["step_s"] <= bound,
        f"overlap step {_ms(ov['step_s'])} ms <= 1.1 x max(compute, comm) + one "
        f"stage's comm = {_ms(bound)} ms",
    )
    if host and p == top:
        speed = host["step_s"] / ov["step_s"]
        check(speed >= 1.3, f"overlap {speed:.2f}x host")
    if lw:
        check(
            ov["step_s"] <= 1.05 * lw["step_s"],
            f"overlap ({_ms(ov['step_s'])} ms) at or ahead of layerwise "
            f"({_ms(lw['step_s'])} ms), within 5%",
        )
    sweep = [
        r
        for (name, q, k), r in by.items()
        if r["strategy"] == "layerwise" and q == p and k == kind
    ]
    if len(sweep) > 1:
        best = min(sweep, key=lambda r: r["step_s"])
        out.append(
            f"  [info] {p} ranks, {where}: best layerwise bucket "
            f"{best['bucket_mb']:g} MiB ({_ms(best['step_s'])} ms; overlap "
            f"{_ms(ov['step_s'])} ms)"
        )


def format_checks(rows: list[dict[str, Any]], model: str) -> str:
    """The issue's benchmark targets, measured in this run (not asserted): on
    every emulated link, and on the real link where it is a network (ranks on
    several nodes); on shared memory, overlap against host as information."""
    rows = [r for r in rows if r["model"] == model]
    by = {(_name(r), r["ranks"], r["link_kind"]): r for r in rows}
    out: list[str] = []
    kinds = sorted({r["link_kind"] for r in rows if r["link_kind"] != "real"})
    if any(_network(r) for r in rows):
        kinds.append("real")
    for kind in kinds:
        sizes = sorted(
            {
                r["ranks"]
                for r in rows
                if r["link_kind"] == kind and (kind != "real" or _network(r))
            }
        )
        for p in sizes:
            _claims(by, p, kind, max(sizes), out)
    for p in sorted({r["ranks"] for r in rows if r["link_kind"] == "real"}):
        ov, host = by.get(("overlap", p, "real")), by.get(("host", p, "real"))
        if ov and host and p > 1 and not _network(ov):
            speed = host["step_s"] / ov["step_s"]
            out.append(
                f"  [info] {p} ranks, real link: overlap {speed:.2f}x "
                f"host, hides {100 * (ov['hidden'] or 0):.0f}% (shared memory: moving "
                "bytes takes the CPU the computation needs)"
            )
    for (name, p, kind), fcx in sorted(by.items()):
        ov = by.get(("overlap", p, kind))
        if name != "overlap-fcx" or not ov:
            continue
        mb = [(r.get("sent_bytes") or 0) / 2**20 for r in (fcx, ov)]
        where = "real link" if kind == "real" and not _network(ov) else None
        out.append(
            f"  [info] {p} ranks, {where or _where(kind, ov)}: "
            f"FC-activation exchange {_ms(fcx['step_s'])} ms vs overlap "
            f"{_ms(ov['step_s'])} ms ({ov['step_s'] / fcx['step_s']:.2f}x); "
            f"handed to MPI per step {mb[0]:.1f} vs {mb[1]:.1f} MB; optimizer "
            f"{fcx['opt_bytes'] / 2**20:.1f} vs {ov['opt_bytes'] / 2**20:.1f} MB/rank"
        )
    return "\n".join([f"checks, {model}:", *out]) if out else ""


def load_rows(root: Path, warmup: int | None = None) -> list[dict[str, Any]]:
    """The rows of ``root/results.jsonl``, each run once.

    A run measured twice (a job rerun into the same folder) counts once, the
    later row. With ``warmup``, timings are re-derived from each run's
    ``metrics.jsonl`` leaving out that many steps.
    """
    rows = list(
        {
            (r["model"], _name(r), r["ranks"], r["link_kind"]): r
            for r in read_results(root)
        }.values()
    )
    if warmup is not None:
        rows = [
            {**r, **_timing(Path(root) / r["run"], warmup)} if r.get("run") else r
            for r in rows
        ]
    return rows


def report(root: Path, models: list[str], warmup: int | None = None) -> str:
    """Tables and checks from ``root/results.jsonl``; written to ``table.md``."""
    rows = load_rows(root, warmup)
    parts = []
    for model in models:
        parts.append(format_table(rows, model))
        checks = format_checks(rows, model)
        if checks:
            parts.append(checks)
    text = "\n\n".join(parts)
    (Path(root) / "table.md").write_text(text + "\n")
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
