"""Figures drawn only from run-folder files (metrics.jsonl, summary.json)."""

from __future__ import annotations

import os
from pathlib import Path


def save_figure(fig, path: str | os.PathLike) -> Path:
    """Lay out, write as PNG and close ``fig``; returns the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_training_curves(rows: list[dict], path: str | os.PathLike) -> Path:
    """Training loss and test accuracy of a run's ``metrics.jsonl`` ``rows``
    (``research.rundir.read_metrics``) against step and wall-clock time, as
    the PNG ``path`` (titled by its folder's name)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in rows if r.get("kind") != "eval" and "loss" in r]
    evals = [r for r in rows if r.get("kind") == "eval"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.plot([r["step"] for r in train], [r["loss"] for r in train], lw=1)
    a.set(xlabel="step", ylabel="training loss (rank 0 batch)", title="loss")
    a.grid(alpha=0.3)
    b.plot([r["train_time"] for r in evals], [r["test_acc"] for r in evals], "o-")
    b.set(
        xlabel="training time (s, evaluation excluded)",
        ylabel="test accuracy",
        title="test accuracy",
        ylim=(0, 1),
    )
    b.grid(alpha=0.3)
    fig.suptitle(Path(path).parent.name, fontsize=9)
    return save_figure(fig, path)


#: Colours of the overlap figures, by trace track / step part.
_COLOURS = {
    "compute": "tab:blue",
    "update": "tab:green",
    "comm": "tab:red",
    "comm-bg": "tab:orange",
    "other": "tab:gray",
}


def _wrap(label: str) -> str:
    return label.replace("-", "-\n").replace(" ", "\n")


def plot_step_breakdown(rows: list[dict], out: str | os.PathLike) -> Path:
    """Step time per strategy split into compute, exposed communication, rest.

    Args:
      rows: the overlap study's result rows (``research.studies.overlap``).
      out: the PNG to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(
        len(models), 1, figsize=(11, 3.4 * len(models)), squeeze=False
    )
    for ax, model in zip(axes[:, 0], models, strict=True):
        part = [r for r in rows if r["model"] == model and r["step_s"]]
        order = {"host": 0, "fused": 1, "layerwise": 2, "overlap": 3}
        part.sort(
            key=lambda r: (
                r["link_kind"] != "real",
                r["ranks"],
                order.get(r["strategy"], 9),
                r.get("bucket_mb") or 0,
            )
        )
        # Long labels ("overlap-fcx", "lw 100MB") break at their separator
        # so neighbouring bars' labels do not run into each other.
        names = [
            _wrap(r.get("label", r["strategy"])) + f"\n{r['ranks']}r {r['link_kind']}"
            for r in part
        ]
        compute = [1e3 * (r["compute_s"] or 0) for r in part]
        exposed = [1e3 * (r["exposed_s"] or 0) for r in part]
        rest = [
            max(0.0, 1e3 * r["step_s"] - c - e)
            for r, c, e in zip(part, compute, exposed, strict=True)
        ]
        at = range(len(part))
        ax.bar(at, compute, color=_COLOURS["compute"], label="compute")
        ax.bar(
            at, exposed, bottom=compute, color=_COLOURS["comm"], label="exposed comm"
        )
        top = [c + e for c, e in zip(compute, exposed, strict=True)]
        ax.bar(at, rest, bottom=top, color=_COLOURS["other"], label="update, rest")
        ax.set_xticks(list(at), names, fontsize=6)
        ax.set(ylabel="ms per step (median)", title=model)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, out)


def plot_timeline(
    run_dir: str | os.PathLike, out: str | os.PathLike, step: int | None = None
) -> Path | None:
    """One training step of a traced run, every rank, one row per track.

    Args:
      run_dir: a run folder with a merged ``trace.json``.
      out: the PNG to write.
      step: the step to show; the last traced training step by default.

    Returns:
      The path, or None when the run has no trace.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from research.trace import read_trace_events

    events = [e for e in read_trace_events(run_dir) if e.get("ph") == "X"]
    stepped = [e for e in events if e.get("args", {}).get("step") is not None]
    stepped = [e for e in stepped if e.get("cat") in ("compute", "update", "comm")]
    if not stepped:
        return None
    if step is None:  # the last step that computed (a final drain has none)
        step = max(e["args"]["step"] for e in stepped if e["cat"] == "compute")
    mine = [e for e in stepped if e["args"]["step"] == step]
    lo = min(e["ts"] for e in mine)
    hi = max(e["ts"] + e["dur"] for e in mine)
    ranks = sorted({e["pid"] for e in events})
    tracks = ["compute", "update", "comm", "comm-bg"]
    fig, ax = plt.subplots(figsize=(12, 0.9 + 0.9 * len(ranks)))
    labels = []
    for k, rank in enumerate(ranks):
        for j, track in enumerate(tracks):
            row = k * (len(tracks) + 1) + j
            labels.append((row, f"r{rank} {track}"))
            spans = [
                ((e["ts"] - lo) / 1e3, e["dur"] / 1e3)
                for e in events
                if e["pid"] == rank
                and e.get("cat") == track
                and e["ts"] < hi
                and e["ts"] + e["dur"] > lo
            ]
            ax.broken_barh(spans, (row - 0.4, 0.8), color=_COLOURS[track])
    ax.set_yticks([r for r, _ in labels], [t for _, t in labels], fontsize=6)
    ax.invert_yaxis()
    ax.set(
        xlim=(0, (hi - lo) / 1e3),
        xlabel="ms from the step's first phase",
        title=f"{Path(run_dir).name}, step {step} (comm: the compute thread "
        "waiting; comm-bg: collectives in flight)",
    )
    ax.title.set_fontsize(8)
    ax.grid(axis="x", alpha=0.3)
    return save_figure(fig, out)


def plot_speedup(rows: list[dict], out: str | os.PathLike) -> Path:
    """Throughput speedup against ranks over ``host`` on one rank, per model.

    With the batch per rank fixed, P ranks process P batches per step, so the
    speedup is ``P * step(host, 1 rank) / step``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(
        1, len(models), figsize=(5.5 * len(models), 3.8), squeeze=False
    )
    for ax, model in zip(axes[0], models, strict=True):
        part = [r for r in rows if r["model"] == model and r["step_s"]]
        base = [r for r in part if r["strategy"] == "host" and r["ranks"] == 1]
        if not base:
            continue
        one = base[0]["step_s"]
        keys = sorted({(r.get("label", r["strategy"]), r["link_kind"]) for r in part})
        for name, link in keys:
            pts = sorted(
                (r["ranks"], r["ranks"] * one / r["step_s"])
                for r in part
                if r.get("label", r["strategy"]) == name
                and (r["link_kind"] == link or r["ranks"] == 1)
            )
            if len(pts) < 2:
                continue
            style = "-o" if link == "real" else "--s"
            ax.plot(*zip(*pts, strict=True), style, label=f"{name} ({link})")
        top = max(r["ranks"] for r in part)
        ax.plot([1, top], [1, top], ":", color="k", lw=0.8, label="ideal")
        ax.set(xlabel="ranks", ylabel="speedup over host, 1 rank", title=model)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    return save_figure(fig, out)
