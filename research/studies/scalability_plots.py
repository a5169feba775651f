"""Figures of the SC19 scalability study, drawn from rows and run-folder traces.

``plot_all(rows, dirs, out)`` writes into ``out``: ``scaling.png`` (throughput
and efficiency against ranks), ``threads.png`` (threads x ranks at fixed cores),
``batch.png`` (throughput against batch per rank), ``timeline.png`` (one step
on every rank: forward/backward, update, waits, background communication and
checkpointing), ``gaps.png`` (distribution of gaps between weight updates) and
``straggler.png`` (delay absorbed against delay injected). A figure whose sweep
has no rows is skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from research.plots import save_figure

COLORS = {"host": "C0", "layerwise": "C1", "overlap": "C2"}
TRACK_COLORS = {
    "compute": "#4C72B0",
    "delay": "#999999",
    "update": "#DD8452",
    "wait": "#C44E52",
    "comm": "#C44E52",
    "comm-bg": "#55A868",
    "checkpoint": "#8172B3",
    "checkpoint-bg": "#937860",
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _tagged(rows, tag):
    return [r for r in rows if tag in r.get("tags", []) and r.get("step_s")]


def plot_scaling(rows: list[dict[str, Any]], out: Path) -> Path | None:
    """Throughput and parallel efficiency against ranks, weak and strong."""
    if not _tagged(rows, "ranks:weak") and not _tagged(rows, "ranks:strong"):
        return None
    plt = _plt()
    models = sorted({r["model"] for r in _tagged(rows, "ranks:weak")})
    fig, axes = plt.subplots(
        len(models), 2, figsize=(10, 3.4 * len(models)), squeeze=False
    )
    for (a, b), m in zip(axes, models, strict=True):
        for tag, style in (("ranks:weak", "-o"), ("ranks:strong", "--s")):
            eff_key = "eff_weak" if tag == "ranks:weak" else "eff_strong"
            for s in COLORS:
                pts = [
                    r
                    for r in rows
                    if r["model"] == m
                    and r["strategy"] == s
                    and (tag in r["tags"] or "baseline" in r["tags"])
                ]
                pts.sort(key=lambda r: r["ranks"])
                if len(pts) < 2:
                    continue
                label = f"{s} ({tag.split(':')[1]})"
                a.plot(
                    [r["ranks"] for r in pts],
                    [r["samples_s"] for r in pts],
                    style,
                    color=COLORS[s],
                    label=label,
                )
                b.plot(
                    [r["ranks"] for r in pts],
                    [r[eff_key] for r in pts],
                    style,
                    color=COLORS[s],
                    label=label,
                )
        a.set(xlabel="ranks", ylabel="samples/s", title=f"{m}: throughput")
        b.set(xlabel="ranks", ylabel="efficiency vs 1 rank", title=f"{m}: efficiency")
        b.axhline(1.0, color="k", lw=0.5)
        for ax in (a, b):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    return save_figure(fig, out / "scaling.png")


def plot_threads(rows: list[dict[str, Any]], out: Path) -> Path | None:
    pts = _tagged(rows, "threads")
    if not pts:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    models = sorted({r["model"] for r in pts})
    for i, m in enumerate(models):
        mine = sorted((r for r in pts if r["model"] == m), key=lambda r: r["threads"])
        xs = [j + i * 0.4 for j in range(len(mine))]
        ax.bar(xs, [r["samples_s"] for r in mine], width=0.38, label=m)
        ax.set_xticks(xs, [f"{r['threads']} thr x {r['ranks']} rk" for r in mine])
    ax.set(ylabel="samples/s", title="threads x ranks at fixed cores")
    ax.legend(fontsize=7)
    return save_figure(fig, out / "threads.png")


def plot_batch(rows: list[dict[str, Any]], out: Path) -> Path | None:
    pts = _tagged(rows, "batch")
    if not pts:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for m in sorted({r["model"] for r in pts}):
        for n in sorted({r["ranks"] for r in pts}):
            mine = sorted(
                (r for r in pts if r["model"] == m and r["ranks"] == n),
                key=lambda r: r["batch"],
            )
            ax.plot(
                [r["batch"] for r in mine],
                [r["samples_s"] for r in mine],
                "-o",
                label=f"{m}, {n} rank(s)",
            )
    ax.set(
        xlabel="batch per rank",
        ylabel="samples/s",
        xscale="log",
        title="batch size (host)",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, out / "batch.png")


def plot_straggler(rows: list[dict[str, Any]], out: Path) -> Path | None:
    pts = [r for r in _tagged(rows, "straggler") if r.get("absorbed_s") is not None]
    if not pts:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    top = max(r["delay"] for r in pts) * 1e3
    ax.plot([0, top], [0, top], "k:", lw=0.8, label="all absorbed")
    for s in COLORS:
        mine = sorted((r for r in pts if r["strategy"] == s), key=lambda r: r["delay"])
        if mine:
            ax.plot(
                [0] + [1e3 * r["delay"] for r in mine],
                [0] + [1e3 * r["absorbed_s"] for r in mine],
                "-o",
                color=COLORS[s],
                label=s,
            )
    ax.axhline(0, color="k", lw=0.5)
    ax.set(
        xlabel="delay injected on one rank (ms)",
        ylabel="delay absorbed (ms)",
        title=f"straggler, {pts[0]['ranks']} ranks, link {pts[0]['link']}",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, out / "straggler.png")


def _find(dirs: list[Path], pid: str) -> Path | None:
    for d in dirs:
        for cand in (d / pid, *d.glob(f"*/{pid}")):
            if (cand / "trace.json").exists():
                return cand
    return None


def _spans(run_dir: Path):
    from research.trace_analysis import load_events
    from research.trace_analysis.metrics import parse_spans

    return parse_spans(load_events(run_dir))[0]


def plot_timeline(rows: list[dict[str, Any]], dirs: list[Path], out: Path):
    """One measured step on every rank of the most interleaved run available."""
    order = [
        ("straggler", "overlap"),
        ("ranks:weak", "overlap"),
        ("straggler", "layerwise"),
        ("ranks:weak", "layerwise"),
    ]
    pick = None
    for tag, s in order:
        cands = [r for r in _tagged(rows, tag) if r["strategy"] == s and r["ranks"] > 1]
        if cands:
            pick = max(cands, key=lambda r: (r["delay"], r["ranks"]))
            break
    run = _find(dirs, pick["id"]) if pick else None
    if run is None:
        return None
    spans = _spans(run)
    step = pick.get("warmup", 1) + 1
    window = [(s.start, s.end) for ss in spans.values() for s in ss if s.step == step]
    if not window:
        return None
    t0, t1 = min(a for a, _ in window), max(b for _, b in window)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.9 * len(spans)))
    lanes = ("compute", "delay", "update", "wait", "comm", "comm-bg", "checkpoint-bg")
    seen = set()
    for r in sorted(spans):
        for s in spans[r]:
            if s.track not in lanes or s.end < t0 or s.start > t1:
                continue
            lane = 0.35 if s.track in ("comm-bg", "checkpoint-bg") else 0.0
            color = TRACK_COLORS.get(s.track, "k")
            label = s.track if s.track not in seen else None
            seen.add(s.track)
            ax.broken_barh(
                [(1e3 * (s.start - t0), 1e3 * (s.end - s.start))],
                (r + lane - 0.15, 0.3),
                color=color,
                label=label,
            )
    ax.set_yticks(sorted(spans), [f"rank {r}" for r in sorted(spans)])
    ax.invert_yaxis()
    ax.set(
        xlabel=f"ms from the start of step {step}",
        title=f"{pick['id']}: step {step} on every rank (lower lane: background)",
    )
    ax.legend(fontsize=7, ncol=4, loc="upper right")
    return save_figure(fig, out / "timeline.png")


def plot_gaps(rows: list[dict[str, Any]], dirs: list[Path], out: Path):
    """Gaps between consecutive updates of each stage, pooled over ranks."""
    picks = [
        r
        for r in rows
        if r["ranks"] > 1
        and r["delay"] == 0
        and not r["ckpt_every"]
        and r["strategy"] in ("host", "overlap")
        and ("checkpoint" in r["tags"] or "ranks:weak" in r["tags"])
    ]
    series = {}
    for r in picks:
        run = _find(dirs, r["id"])
        if run is None:
            continue
        gaps = []
        for ss in _spans(run).values():
            ups: dict[str, list] = {}
            for s in ss:
                if s.track == "update":
                    ups.setdefault(str(s.args.get("stage", "model")), []).append(s)
            for lst in ups.values():
                gaps += [1e3 * (b.start - a.end) for a, b in zip(lst[1:], lst[2:])]
        if gaps:
            series[f"{r['model']} {r['strategy']} {r['ranks']}r"] = gaps
    if not series:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    names = sorted(series)[:6]
    ax.boxplot([series[n] for n in names], vert=False)
    ax.set_yticks(range(1, len(names) + 1), names, fontsize=7)
    ax.set(
        xlabel="gap between consecutive updates of a stage (ms)",
        title="time a stage's weights stay unchanged",
    )
    ax.grid(alpha=0.3)
    return save_figure(fig, out / "gaps.png")


def plot_all(rows: list[dict[str, Any]], dirs: list[Path], out: Path) -> list[Path]:
    """Every figure the rows allow (see the module docstring)."""
    made = [
        plot_scaling(rows, out),
        plot_threads(rows, out),
        plot_batch(rows, out),
        plot_straggler(rows, out),
        plot_timeline(rows, dirs, out),
        plot_gaps(rows, dirs, out),
    ]
    return [p for p in made if p is not None]
