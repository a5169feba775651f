"""Figures drawn only from run-folder files (metrics.jsonl, summary.json)."""

from __future__ import annotations

import os
from pathlib import Path

from research.rundir import read_metrics


def save_figure(fig, path: str | os.PathLike) -> Path:
    """Lay out, write as PNG and close ``fig``; returns the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_training_curves(run_dir: str | os.PathLike, out: str = "curves.png") -> Path:
    """Training loss and test accuracy against step and wall-clock time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
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
    fig.suptitle(Path(run_dir).name, fontsize=9)
    return save_figure(fig, Path(run_dir) / out)
